//! [`SplitMix64`], the one random-number generator of the data pipeline, and the shuffle built
//! on it. Written out here (a dozen lines) so that a seed means the same order on every
//! platform and in every version of dsplan.

/// Steele, Lea and Flood's SplitMix64: a 64-bit state advanced by a fixed odd increment, each
/// output a bijective mix of the state. Fast, tiny, and good enough to shuffle data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

/// The state increment (2^64 divided by the golden ratio, made odd).
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// A generator whose first output is `mix(seed + GOLDEN_GAMMA)`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix64(self.state)
    }

    /// A number in `0..bound` (`bound > 0`), by Lemire's multiply-shift; the bias is below
    /// `bound / 2^64`, far below anything a data order could show.
    pub fn below(&mut self, bound: usize) -> usize {
        ((u128::from(self.next_u64()) * bound as u128) >> 64) as usize
    }

    /// Shuffles `items` in place (Fisher–Yates, from the back).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for last in (1..items.len()).rev() {
            let pick = self.below(last + 1);
            items.swap(last, pick);
        }
    }
}

/// SplitMix64's output function (a bijection of `u64`), also used to derive seeds.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
