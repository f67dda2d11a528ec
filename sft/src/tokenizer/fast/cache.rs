//! The per-word cache of the fast encoder: piece -> token ids, one per thread (the prepare
//! step encodes rows on rayon's threads) and per encoder, so that no lock is taken. A piece's
//! ids depend only on the piece, so a hit is the ids the BPE model gives it.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

/// Pieces at least this long (in bytes) are not kept (the crate's own cache stops there too).
const LONGEST: usize = 256;
/// At most this many pieces are kept per thread and encoder; later ones are not stored.
const MOST_WORDS: usize = 1 << 19;

/// Ids of a piece, by its bytes.
#[derive(Debug, Default)]
pub struct WordCache {
    words: FxHashMap<Box<[u8]>, Box<[u32]>>,
}

impl WordCache {
    /// Appends the ids of `piece` to `ids`, from the cache or from `miss` (kept when there is
    /// room).
    pub fn extend(
        &mut self,
        piece: &[u8],
        ids: &mut Vec<u32>,
        miss: impl FnOnce() -> Result<Vec<u32>, String>,
    ) -> Result<(), String> {
        if let Some(hit) = self.words.get(piece) {
            ids.extend_from_slice(hit);
            return Ok(());
        }
        let found = miss()?;
        ids.extend_from_slice(&found);
        if piece.len() < LONGEST && self.words.len() < MOST_WORDS {
            self.words.insert(piece.into(), found.into_boxed_slice());
        }
        Ok(())
    }
}

/// A fresh key for one encoder's caches.
pub fn new_key() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    static CACHES: RefCell<Vec<(usize, WordCache)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with this thread's cache of encoder `key`.
pub fn with<R>(key: usize, f: impl FnOnce(&mut WordCache) -> R) -> R {
    CACHES.with(|caches| {
        let mut caches = caches.borrow_mut();
        let at = match caches.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                caches.push((key, WordCache::default()));
                caches.len() - 1
            }
        };
        f(&mut caches[at].1)
    })
}
