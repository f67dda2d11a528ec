//! The per-word cache of the fast encoder: piece -> token ids (and each token's end in the
//! piece, for offsets), one per thread (the prepare step encodes rows on rayon's threads) and
//! per encoder, so that no lock is taken. A piece's tokens depend only on the piece, so a hit
//! is what the BPE model gives it; [`Caching::Off`] asks the model every time (to show that
//! hits and misses agree).

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

/// Pieces at least this long (in bytes) are not kept (the crate's own cache stops there too).
const LONGEST: usize = 256;
/// At most this many pieces are kept per thread and encoder; later ones are not stored.
const MOST_WORDS: usize = 1 << 19;

/// Whether pieces are looked up in the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caching {
    /// The per-thread cache (the default).
    PerThread,
    /// Every piece from the BPE model (a check that the cache changes nothing).
    Off,
}

/// The tokens of one piece: ids, and each token's end (in bytes of the piece as the model saw
/// it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PieceTokens {
    /// Token ids.
    pub ids: Box<[u32]>,
    /// The end of each token in the model's word.
    pub ends: Box<[u32]>,
}

/// Tokens of a piece, by its bytes.
#[derive(Debug, Default)]
pub struct WordCache {
    words: FxHashMap<Box<[u8]>, PieceTokens>,
}

impl WordCache {
    /// Runs `found` on the tokens of `piece`, from the cache or from `miss` (kept when there
    /// is room and `caching` allows).
    pub fn with<R>(
        &mut self,
        caching: Caching,
        piece: &[u8],
        miss: impl FnOnce() -> Result<PieceTokens, String>,
        found: impl FnOnce(&PieceTokens) -> R,
    ) -> Result<R, String> {
        if caching == Caching::Off {
            return Ok(found(&miss()?));
        }
        if let Some(hit) = self.words.get(piece) {
            return Ok(found(hit));
        }
        let tokens = miss()?;
        let result = found(&tokens);
        if piece.len() < LONGEST && self.words.len() < MOST_WORDS {
            self.words.insert(piece.into(), tokens);
        }
        Ok(result)
    }

    /// Appends the ids of `piece` to `ids` (see [`WordCache::with`]).
    pub fn extend(
        &mut self,
        caching: Caching,
        piece: &[u8],
        ids: &mut Vec<u32>,
        miss: impl FnOnce() -> Result<PieceTokens, String>,
    ) -> Result<(), String> {
        self.with(caching, piece, miss, |tokens| {
            ids.extend_from_slice(&tokens.ids)
        })
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
