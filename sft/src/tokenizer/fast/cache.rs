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

/// A piece's tokens as the cache keeps them: one token (most pieces) without a heap box.
#[derive(Debug)]
enum Entry {
    One { id: u32, end: u32 },
    Many(PieceTokens),
}

impl Entry {
    fn of(tokens: PieceTokens) -> Self {
        match (&*tokens.ids, &*tokens.ends) {
            (&[id], &[end]) => Entry::One { id, end },
            _ => Entry::Many(tokens),
        }
    }

    /// Its ids and ends.
    fn tokens(&self) -> (&[u32], &[u32]) {
        match self {
            Entry::One { id, end } => (std::slice::from_ref(id), std::slice::from_ref(end)),
            Entry::Many(tokens) => (&tokens.ids, &tokens.ends),
        }
    }
}

/// Pieces up to this many bytes are keyed by value ([`short_key`]): no key on the heap, and
/// no byte comparison on a hit.
const SHORT: usize = 15;

/// The bytes of a piece of at most [`SHORT`] bytes and its length, in one number (the length
/// in the top byte, so that pieces ending in zero bytes keep distinct keys).
fn short_key(piece: &[u8]) -> u128 {
    let mut bytes = [0u8; 16];
    bytes[..piece.len()].copy_from_slice(piece);
    bytes[15] = piece.len() as u8;
    u128::from_le_bytes(bytes)
}

/// Tokens of a piece, by its bytes: short pieces by value, longer ones by their bytes.
#[derive(Debug, Default)]
pub struct WordCache {
    short: FxHashMap<u128, Entry>,
    long: FxHashMap<Box<[u8]>, Entry>,
}

impl WordCache {
    /// Runs `found` on the ids and token ends of `piece`, from the cache or from `miss` (kept
    /// when there is room and `caching` allows).
    pub fn with<R>(
        &mut self,
        caching: Caching,
        piece: &[u8],
        miss: impl FnOnce() -> Result<PieceTokens, String>,
        found: impl FnOnce(&[u32], &[u32]) -> R,
    ) -> Result<R, String> {
        let run = |entry: &Entry| {
            let (ids, ends) = entry.tokens();
            found(ids, ends)
        };
        if caching == Caching::Off {
            return Ok(run(&Entry::of(miss()?)));
        }
        let short = (piece.len() <= SHORT).then(|| short_key(piece));
        let hit = match short {
            Some(key) => self.short.get(&key),
            None => self.long.get(piece),
        };
        if let Some(hit) = hit {
            return Ok(run(hit));
        }
        let entry = Entry::of(miss()?);
        let result = run(&entry);
        if self.short.len() + self.long.len() < MOST_WORDS {
            match short {
                Some(key) => {
                    self.short.insert(key, entry);
                }
                None if piece.len() < LONGEST => {
                    self.long.insert(piece.into(), entry);
                }
                None => {}
            }
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
        self.with(caching, piece, miss, |found, _| {
            ids.extend_from_slice(found)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Short keys differ for pieces that differ only in trailing zero bytes or length, and a
    /// hit gives what the miss gave.
    #[test]
    fn short_keys_keep_pieces_apart() {
        assert_ne!(short_key(b"a"), short_key(b"a\0"));
        assert_ne!(short_key(b""), short_key(b"\0"));
        let mut cache = WordCache::default();
        let tokens = |ids: &[u32]| PieceTokens {
            ids: ids.into(),
            ends: ids.iter().map(|&i| i + 1).collect(),
        };
        for (piece, ids) in [
            (&b"one"[..], &[7u32][..]),
            (b"a long piece of text", &[1, 2, 3]),
        ] {
            let first = cache
                .with(
                    Caching::PerThread,
                    piece,
                    || Ok(tokens(ids)),
                    |i, e| (i.to_vec(), e.to_vec()),
                )
                .expect("miss");
            let again = cache
                .with(
                    Caching::PerThread,
                    piece,
                    || Err("asked twice".into()),
                    |i, e| (i.to_vec(), e.to_vec()),
                )
                .expect("hit");
            assert_eq!(first, again);
            assert_eq!(first.0, ids);
        }
    }
}
