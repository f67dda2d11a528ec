//! Global-norm gradient clipping (`gradient_clipping`) as DeepSpeed 0.19.8's wrappers compute it.
//!
//! - **ZeRO 1/2/3 and FP16_Optimizer** clip and unscale in one division of the *scaled*
//!   gradients: `c = max(1, (‖g_scaled‖/S + 1e-6)/clip)`, `g ← g_scaled · (1/(c·S))`
//!   ([`zero_combined_scale`]). With bf16 under ZeRO, S is 1. S is the scale *after* this
//!   step's loss-scale update (see `loss_scale`).
//! - **BF16_Optimizer** (bf16 without ZeRO) multiplies by `clip/(‖g‖+1e-6)` only when that is
//!   below 1 ([`bf16_clip_coefficient`]).
//! - **fp32 without ZeRO** uses `min(1, clip/(‖g‖+1e-6))` ([`fp32_clip_coefficient`]).
//!
//! ZeRO computes its norm per parameter group: per-tensor norms in float64, squared and summed,
//! then cast to float32, all-reduced and square-rooted; an inf/NaN group norm becomes -1; the
//! global norm is the L2 norm over groups ([`zero_global_norm`]). The clip arithmetic that
//! follows runs on float32 tensors; [`zero_combined_scale_f32`] reproduces it as the CPU does
//! (on CUDA, PyTorch divides a tensor by a Python scalar as a multiplication by its reciprocal,
//! which can differ by one ulp).

/// The epsilon every DeepSpeed clipping path adds to the norm.
pub const CLIP_EPSILON: f64 = 1e-6;

/// ZeRO/fp16: the divisor of the scaled gradients, `max(1, (norm/S + 1e-6)/clip)·S`;
/// `clip <= 0` (clipping off) gives `S`.
pub fn zero_combined_scale(scaled_norm: f64, loss_scale: f64, clip: f64) -> f64 {
    if clip <= 0.0 {
        return loss_scale;
    }
    let coefficient = ((scaled_norm / loss_scale) + CLIP_EPSILON) / clip;
    // torch.clamp(min=1.0): NaN stays NaN.
    let coefficient = if coefficient < 1.0 { 1.0 } else { coefficient };
    coefficient * loss_scale
}

/// [`zero_combined_scale`] in float32, operation by operation, as the ZeRO optimizers run it on
/// their float32 norm tensor (Python scalars are cast to float32 first).
pub fn zero_combined_scale_f32(scaled_norm: f32, loss_scale: f64, clip: f64) -> f32 {
    let scale = loss_scale as f32;
    if clip <= 0.0 {
        return scale;
    }
    let coefficient = ((scaled_norm / scale) + CLIP_EPSILON as f32) / clip as f32;
    let coefficient = if coefficient < 1.0 { 1.0 } else { coefficient };
    coefficient * scale
}

/// What ZeRO multiplies each scaled gradient by: `1/combined_scale`.
pub fn zero_gradient_multiplier(scaled_norm: f64, loss_scale: f64, clip: f64) -> f64 {
    1.0 / zero_combined_scale(scaled_norm, loss_scale, clip)
}

/// The true gradient norm ZeRO reports (`scaled_norm / S`, S the scale before the update).
pub fn unscaled_norm(scaled_norm: f64, loss_scale_before_update: f64) -> f64 {
    scaled_norm / loss_scale_before_update
}

/// ZeRO's global norm from per-group norms: inf/NaN become -1, then the L2 norm over groups.
/// A bad group therefore shows as a small positive norm (√(bad groups) at worst), not NaN.
pub fn zero_global_norm(group_norms: &[f64]) -> f64 {
    group_norms
        .iter()
        .map(|norm| if norm.is_finite() { *norm } else { -1.0 })
        .map(|norm| norm * norm)
        .sum::<f64>()
        .sqrt()
}

/// BF16_Optimizer: the factor `clip/(norm + 1e-6)` when it is below 1, else `None` (gradients
/// untouched); `None` too when clipping is off.
pub fn bf16_clip_coefficient(global_norm: f64, clip: f64) -> Option<f64> {
    if clip <= 0.0 {
        return None;
    }
    let coefficient = clip / (global_norm + CLIP_EPSILON);
    (coefficient < 1.0).then_some(coefficient)
}

/// fp32 without ZeRO (`deepspeed.runtime.utils.clip_grad_norm_`): `min(1, clip/(norm + 1e-6))`.
pub fn fp32_clip_coefficient(total_norm: f64, clip: f64) -> f64 {
    let coefficient = clip / (total_norm + CLIP_EPSILON);
    if coefficient < 1.0 { coefficient } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_clips_only_above_the_threshold() {
        // True norm 0.5 under clip 1: only unscaling.
        assert_eq!(zero_combined_scale(0.5 * 1024.0, 1024.0, 1.0), 1024.0);
        // True norm 4 under clip 1: c = (4 + 1e-6)/1.
        let divisor = zero_combined_scale(4.0 * 1024.0, 1024.0, 1.0);
        assert_eq!(divisor, (4.0 + 1e-6) * 1024.0);
        // Equivalently g = g_true · clip/(‖g_true‖ + 1e-6).
        let true_gradient = 2.0;
        let clipped =
            (true_gradient * 1024.0) * zero_gradient_multiplier(4.0 * 1024.0, 1024.0, 1.0);
        assert!((clipped - true_gradient / (4.0 + 1e-6)).abs() < 1e-15);
        // Clipping off.
        assert_eq!(zero_combined_scale(1e9, 8.0, 0.0), 8.0);
    }

    #[test]
    fn zero_f32_follows_the_same_formula() {
        let divisor = zero_combined_scale_f32(4096.0, 1024.0, 1.0);
        assert_eq!(divisor, (4.0f32 + 1e-6f32) * 1024.0);
        assert_eq!(zero_combined_scale_f32(100.0, 1024.0, 1.0), 1024.0);
        let f64_divisor = zero_combined_scale(4096.0, 1024.0, 1.0);
        assert!(((divisor as f64) - f64_divisor).abs() / f64_divisor < 1e-6);
    }

    #[test]
    fn bad_group_norms_become_minus_one() {
        assert_eq!(zero_global_norm(&[3.0, 4.0]), 5.0);
        assert_eq!(zero_global_norm(&[f64::NAN, f64::INFINITY]), 2.0_f64.sqrt());
        assert_eq!(zero_global_norm(&[]), 0.0);
    }

    #[test]
    fn bf16_and_fp32_coefficients() {
        assert_eq!(bf16_clip_coefficient(0.5, 1.0), None);
        assert_eq!(bf16_clip_coefficient(3.0, 1.5), Some(1.5 / (3.0 + 1e-6)));
        assert_eq!(bf16_clip_coefficient(3.0, 0.0), None);
        assert_eq!(fp32_clip_coefficient(0.5, 1.0), 1.0);
        assert_eq!(fp32_clip_coefficient(2.0, 1.0), 1.0 / (2.0 + 1e-6));
        assert_eq!(unscaled_norm(2048.0, 1024.0), 2.0);
    }
}
