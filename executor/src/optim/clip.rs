//! Global L2 gradient-norm clipping with `torch.nn.utils.clip_grad_norm_` semantics.
//!
//! `coef = max_norm / (norm + 1e-6)`, clamped to at most 1, and the gradients are always
//! multiplied by it (also when it is 1), all in f32 as torch does. The norm is the square root
//! of a sum of squares accumulated in f64, so it can be summed per shard, all-reduced, and
//! finished with [`global_norm`]'s last step: `sqrt(total) as f32`. (torch takes the norm of
//! per-tensor f32 norms; the two agree to an ulp or so.)

use rayon::prelude::*;

/// Elements per parallel work item; fixed, so the sum's rounding does not depend on threads.
const CHUNK: usize = 1 << 14;

/// The outcome of one clipping.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClipReport {
    /// The global L2 norm before clipping.
    pub pre_clip_norm: f32,
    /// The factor the gradients were multiplied by.
    pub coefficient: f32,
}

/// `sum_i g[i]^2` in f64, deterministic for a given slice.
pub fn sum_of_squares(grads: &[f32]) -> f64 {
    let partials: Vec<f64> = grads
        .par_chunks(CHUNK)
        .map(|chunk| chunk.iter().map(|&g| f64::from(g) * f64::from(g)).sum())
        .collect();
    partials.iter().sum()
}

/// The L2 norm of a whole gradient buffer.
pub fn global_norm(grads: &[f32]) -> f32 {
    sum_of_squares(grads).sqrt() as f32
}

/// torch's clip coefficient: `min(1, max_norm / (norm + 1e-6))` in f32.
pub fn clip_coefficient(norm: f32, max_norm: f32) -> f32 {
    (max_norm / (norm + 1e-6)).min(1.0)
}

/// `g *= coefficient` for every gradient.
pub fn scale_grads(grads: &mut [f32], coefficient: f32) {
    grads.par_chunks_mut(CHUNK).for_each(|chunk| {
        for g in chunk {
            *g *= coefficient;
        }
    });
}

/// Clips a whole gradient buffer to global L2 norm `max_norm`, as `clip_grad_norm_` does.
pub fn clip_grad_norm(grads: &mut [f32], max_norm: f32) -> ClipReport {
    let pre_clip_norm = global_norm(grads);
    let coefficient = clip_coefficient(pre_clip_norm, max_norm);
    scale_grads(grads, coefficient);
    ClipReport {
        pre_clip_norm,
        coefficient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clips_only_above_the_threshold() {
        let mut grads = vec![3.0f32, 4.0];
        let report = clip_grad_norm(&mut grads, 1.0);
        assert_eq!(report.pre_clip_norm, 5.0);
        assert!((grads[0] - 0.6).abs() < 1e-6 && (grads[1] - 0.8).abs() < 1e-6);

        let mut small = vec![0.3f32, 0.4];
        let report = clip_grad_norm(&mut small, 1.0);
        assert_eq!(report.coefficient, 1.0);
        assert_eq!(small, vec![0.3, 0.4]);
    }
}
