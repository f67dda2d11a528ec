//! The global gradient norm and the combined unscale-and-clip factor, computed the way each
//! DeepSpeed 0.19.8 stage computes them (`reference/gpt2/deepspeed_zero/README.md`, "Gradient
//! clipping as each stage implements it"). They are the same function mathematically and
//! round differently; reproducing each keeps a run within rounding of its reference.
//!
//! The plan decides the rule (`planner::plan::run_policy`, the plan's `run.clip`); this module
//! only computes it:
//!
//! | rule | DeepSpeed | norm | factor applied to the gradients |
//! |---|---|---|---|
//! | [`ClipRule::DataParallel`] | fp32 without ZeRO | per-tensor norms in f32, `sqrt(Σ n_t²)` in f32, then `/W` and summed over ranks | `clip/(N + 1e-6)` (f64, applied in f32) when below 1 |
//! | [`ClipRule::Bf16Optimizer`] | bf16 at stage 1 accumulating in fp32 | as above | `clip/(N + 1e-6)` when below 1 |
//! | [`ClipRule::Fp16Optimizer`] | fp16 without ZeRO | per-tensor: `Σ (‖t‖₂ in f64)²`, cast to f32, `sqrt` in f32, this rank's (averaged) gradient only | `1/c`, `c = max(1, (N/S + 1e-6)/clip)·S` in f32 |
//! | [`ClipRule::ZeroF32`] | stages 1/2 | per-tensor slices as above, summed over ranks in f32 | as above |
//! | [`ClipRule::ZeroF64`] | stage 3 | the same sums in f64, summed over ranks in f64, `sqrt` in f64 | `1/c` as above, in f64 |
//!
//! `S` is the loss scale after this step's update (the gradients were made with the scale
//! before it; see `planner::schedule::loss_scale`); the reported norm is the true one,
//! `N / S_before`.

use dsplan_planner::schedule::clip::{
    bf16_clip_coefficient, fp32_clip_coefficient, zero_combined_scale, zero_combined_scale_f32,
};

use super::ZeroError;
use super::rank::ZeroRank;
use crate::comm::ReduceOp;
use crate::optim::scale_grads;

/// How a run computes the norm and the clip factor: the plan's rule (see the
/// [module documentation](self)).
pub use dsplan_planner::plan::ClipRule;

/// The loss scales of one applied step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scales {
    /// The scale the loss was multiplied by in this step's backward.
    pub grad_scale: f64,
    /// The scale the gradients are divided by (after this step's scaler update).
    pub unscale_by: f64,
}

/// Computes the global norm of the owned gradients (all ranks together), and multiplies them
/// by the unscale-and-clip factor of `rule`. `clip <= 0` means no clipping. Returns the true
/// (unscaled, pre-clip) global norm.
pub fn unscale_and_clip(
    rank: &mut ZeroRank,
    rule: ClipRule,
    scales: Scales,
    clip: f64,
) -> Result<f64, ZeroError> {
    let sum_sq_of_pieces = |rank: &ZeroRank| -> f64 {
        let grads = rank.owned_grads();
        rank.norm_pieces()
            .iter()
            .map(|piece| {
                let norm = sum_of_squares(&grads[piece.clone()]).sqrt();
                norm * norm
            })
            .sum()
    };
    let world = rank.world();
    match rule {
        ClipRule::DataParallel | ClipRule::Bf16Optimizer => {
            let grads = rank.owned_grads();
            let mut total = 0.0f32;
            for piece in rank.norm_pieces() {
                let norm = sum_of_squares(&grads[piece.clone()]).sqrt() as f32;
                total += norm * norm;
            }
            let mut shared = [total.sqrt() / world as f32];
            rank.comm().all_reduce(&mut shared, ReduceOp::Sum)?;
            let norm = shared[0];
            let coefficient = if rule == ClipRule::DataParallel {
                let c = fp32_clip_coefficient(f64::from(norm), clip);
                (clip > 0.0 && c < 1.0).then_some(c as f32)
            } else {
                bf16_clip_coefficient(f64::from(norm), clip).map(|c| c as f32)
            };
            let unscale = (1.0 / scales.unscale_by) as f32;
            let factor = coefficient.unwrap_or(1.0) * unscale;
            if factor != 1.0 {
                scale_grads(rank.owned_grads_mut(), factor);
            }
            Ok(f64::from(norm) / scales.grad_scale)
        }
        ClipRule::ZeroF32 | ClipRule::Fp16Optimizer => {
            let local = sum_sq_of_pieces(rank) as f32;
            let mut total = [local];
            if rule == ClipRule::ZeroF32 {
                rank.comm().all_reduce(&mut total, ReduceOp::Sum)?;
            }
            let mut norm = total[0].sqrt();
            if !norm.is_finite() {
                norm = -1.0;
            }
            let combined = zero_combined_scale_f32(norm, scales.unscale_by, clip);
            if combined != 1.0 {
                scale_grads(rank.owned_grads_mut(), 1.0 / combined);
            }
            Ok(f64::from(norm) / scales.grad_scale)
        }
        ClipRule::ZeroF64 => {
            let local = sum_sq_of_pieces(rank);
            let total = rank.comm().all_reduce_scalar(local, ReduceOp::Sum)?;
            let mut norm = total.sqrt();
            if !norm.is_finite() {
                norm = -1.0;
            }
            let combined = zero_combined_scale(norm, scales.unscale_by, clip);
            if combined != 1.0 {
                scale_grads(rank.owned_grads_mut(), (1.0 / combined) as f32);
            }
            Ok(norm / scales.grad_scale)
        }
    }
}

/// `Σ x²` in f64, in order.
fn sum_of_squares(values: &[f32]) -> f64 {
    values.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}
