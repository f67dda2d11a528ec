//! [`Fingerprint`]: a 64-bit FNV-1a hash of what decides a token stream (tokenizer files,
//! template, preparation settings, the data's bytes), naming token caches. Not cryptographic:
//! it tells a stale cache from a current one, nothing more.

/// A running FNV-1a hash; [`Fingerprint::add`] separates its inputs so that `("ab", "c")` and
/// `("a", "bc")` differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(u64);

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for Fingerprint {
    fn default() -> Self {
        Self::new()
    }
}

impl Fingerprint {
    /// The hash of nothing.
    pub const fn new() -> Self {
        Fingerprint(OFFSET)
    }

    /// Adds `bytes` (and their length, as a separator).
    pub fn add(&mut self, bytes: &[u8]) {
        for &byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(byte);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Adds another fingerprint.
    pub fn combine(&mut self, other: Fingerprint) {
        self.add(&other.0.to_le_bytes());
    }

    /// The hash.
    pub fn value(&self) -> u64 {
        self.0
    }

    /// The hash as 16 hex digits.
    pub fn hex(&self) -> String {
        format!("{:016x}", self.0)
    }
}
