//! Vectorisable reductions: sums and dot products with independent lane accumulators.
//!
//! A plain `iter().sum()` over f32 is a serial dependency chain the compiler may not reorder;
//! sixteen independent partial sums let it use SIMD registers, and also make the rounding error
//! grow more slowly than one running sum.

const LANES: usize = 16;

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
}
