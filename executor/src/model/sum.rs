//! Vectorisable f32 kernels: sums, dot products, maxima and `exp`.
//!
//! A plain `iter().sum()` over f32 is a serial dependency chain the compiler may not reorder;
//! sixteen independent partial sums let it use SIMD registers, and also make the rounding error
//! grow more slowly than one running sum. [`exp`] is a branch-free polynomial `exp` the compiler
//! can vectorise (libm's `expf` is a call per element). [`vectorised!`] compiles a loop twice,
//! for the baseline x86-64 target and for AVX2, and picks at run time: the arithmetic is the
//! same IEEE operations in the same order on both paths (no FMA contraction), so results do not
//! depend on which one runs.

const LANES: usize = 16;

/// Defines `fn name(args) -> ret { body }` so that the body is compiled twice, for the baseline
/// target and with AVX2 enabled, and runs the AVX2 copy where the CPU has it (checked at run
/// time, once per call). The body should be a loop over slices calling `#[inline(always)]`
/// helpers, so that the whole loop is compiled for the wider vectors.
macro_rules! vectorised {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn generic($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                generic($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2 (checked just above).
                return unsafe { avx2($($arg),*) };
            }
            generic($($arg),*)
        }
    };
}
pub(crate) use vectorised;

/// `sum_i a[i] * b[i]` over the common length.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let mut a_chunks = a.chunks_exact(LANES);
    let mut b_chunks = b.chunks_exact(LANES);
    for (xa, xb) in (&mut a_chunks).zip(&mut b_chunks) {
        for lane in 0..LANES {
            acc[lane] += xa[lane] * xb[lane];
        }
    }
    let tail: f32 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    fold_lanes(acc) + tail
}

/// `sum_i a[i]`.
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = a.chunks_exact(LANES);
    for x in &mut chunks {
        for lane in 0..LANES {
            acc[lane] += x[lane];
        }
    }
    fold_lanes(acc) + chunks.remainder().iter().sum::<f32>()
}

/// `max_i a[i]` (`-inf` for an empty slice; NaNs are skipped as `f32::max` does).
pub fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = a.chunks_exact(LANES);
    for x in &mut chunks {
        for lane in 0..LANES {
            // `>` (not `f32::max`) lets the compiler use the SIMD max instruction.
            acc[lane] = if x[lane] > acc[lane] {
                x[lane]
            } else {
                acc[lane]
            };
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    acc.iter().copied().fold(tail, f32::max)
}

/// `a[i] = exp(a[i] - shift)` for every element; returns the sum of the new values.
pub fn exp_shifted_sum(a: &mut [f32], shift: f32) -> f32 {
    vectorised_exp_shifted_sum(a, shift)
}

vectorised! {
    fn vectorised_exp_shifted_sum(a: &mut [f32], shift: f32) -> f32 {
        let mut acc = [0.0f32; LANES];
        let mut chunks = a.chunks_exact_mut(LANES);
        for x in &mut chunks {
            for lane in 0..LANES {
                x[lane] = exp(x[lane] - shift);
                acc[lane] += x[lane];
            }
        }
        let mut tail = 0.0f32;
        for x in chunks.into_remainder() {
            *x = exp(*x - shift);
            tail += *x;
        }
        fold_lanes(acc) + tail
    }
}

vectorised! {
    /// `a[i] *= factor` for every element.
    pub fn scale(a: &mut [f32], factor: f32) {
        for x in a {
            *x *= factor;
        }
    }
}

/// Below this, `exp` underflows to 0 (`ln` of the smallest normal f32).
const EXP_MIN_ARG: f32 = -87.336_55;
/// Above this, `exp` returns infinity (a little under `ln(f32::MAX)`, so `2^n` stays normal).
const EXP_MAX_ARG: f32 = 88.376_26;

/// `e^x` in f32, branch-free so that loops over it vectorise: `x = n ln 2 + r` with `|r| <=
/// ln 2 / 2`, a degree-6 polynomial for `e^r` (the classic Cephes `expf` coefficients), and
/// `2^n` built in the exponent bits. Within about 2 ulp of the correctly rounded result;
/// `exp(x) = 0` below `-87.34` (no subnormals) and `inf` above `88.38`; NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for the n that occur.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even).
    const ROUND: f32 = 12_582_912.0;
    let clamped = x.clamp(EXP_MIN_ARG, EXP_MAX_ARG);
    let shifted = clamped * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    // n is in [-126, 127] and sits in the low mantissa bits of `shifted`: 2^n is a normal
    // float with biased exponent n + 127 (integer arithmetic, no float-to-int conversion).
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let two_n = f32::from_bits(biased << 23);
    let y = e_r * two_n;
    if x < EXP_MIN_ARG {
        0.0
    } else if x > EXP_MAX_ARG {
        f32::INFINITY
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// Pairwise sum of the lane accumulators.
fn fold_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            acc[lane] += acc[lane + width];
        }
    }
    acc[0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_and_dot_match_f64() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.013).sin()).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.007).cos()).collect();
        let sum64: f64 = a.iter().map(|&x| f64::from(x)).sum();
        let dot64: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        assert!((f64::from(sum(&a)) - sum64).abs() < 1e-4);
        assert!((f64::from(dot(&a, &b)) - dot64).abs() < 1e-4);
        assert_eq!(sum(&[1.0, 2.0, 3.0]), 6.0);
    }

    #[test]
    fn exp_is_within_a_few_ulp_of_libm() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let ours = f64::from(exp(x));
            let exact = f64::from(x).exp();
            worst = worst.max((ours - exact).abs() / exact);
            x += 0.001_37;
        }
        // 2 ulp of f32 is 2 * 2^-23 relative, about 2.4e-7.
        assert!(worst < 2.4e-7, "worst relative error {worst:e}");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn exp_shifted_sum_and_max_match_scalar_loops() {
        let a: Vec<f32> = (0..1001).map(|i| (i as f32 * 0.37).sin() * 20.0).collect();
        let m = max(&a);
        assert_eq!(m, a.iter().copied().fold(f32::NEG_INFINITY, f32::max));
        let mut e = a.clone();
        let total = exp_shifted_sum(&mut e, m);
        let expected: f64 = a.iter().map(|&x| (f64::from(x) - f64::from(m)).exp()).sum();
        assert!((f64::from(total) - expected).abs() / expected < 1e-6);
        for (&y, &x) in e.iter().zip(&a) {
            assert_eq!(y, exp(x - m));
        }
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }
}
