//! `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU: a 32-bit
//! Mersenne Twister (MT19937) seeded with the low 32 bits of the seed, then the swap loop of
//! ATen's `randperm_cpu` (for `i` in `0..n-1`, swap `i` with `i + random() % (n - i)`), the
//! 32-bit draw being what ATen uses below `u32::MAX / 20` elements.

/// MT19937 as `at::mt19937` (std::mt19937) computes it.
struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    fn new(seed: u32) -> Self {
        let mut state = [0u32; 624];
        state[0] = seed;
        for i in 1..624 {
            let previous = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(previous ^ (previous >> 30))
                .wrapping_add(i as u32);
        }
        Self { state, index: 624 }
    }

    fn twist(&mut self) {
        for i in 0..624 {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
            let mut next = self.state[(i + 397) % 624] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// The permutation of `0..n` that torch's CPU `randperm` draws for `seed`.
pub fn randperm(n: usize, seed: u64) -> Vec<usize> {
    let mut generator = Mt19937::new(seed as u32);
    let mut order: Vec<usize> = (0..n).collect();
    for i in 0..n.saturating_sub(1) {
        let z = generator.next_u32() as usize % (n - i);
        order.swap(i, i + z);
    }
    order
}
