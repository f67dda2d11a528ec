//! [`consolidate`]: the full fp32 parameters from every rank's master shard.
//!
//! As DeepSpeed's `zero_to_fp32` does: stages 1/2 concatenate the ranks' flat partitions and
//! drop the padding; stage 3 takes `ceil(n / W)` elements of each tensor from every rank in
//! turn and truncates to `n`; stage 0's master is already whole.

use dsplan_planner::config::ZeroStage;

use crate::zero::EnginePlan;

/// The full flat fp32 parameters from the masters of ranks `0..W`, in rank order.
pub fn consolidate(plan: &EnginePlan, stage: ZeroStage, masters: &[Vec<f32>]) -> Vec<f32> {
    let numel = plan.flat().numel;
    match stage {
        ZeroStage::Disabled => masters
            .first()
            .map(|m| m[..numel.min(m.len())].to_vec())
            .unwrap_or_default(),
        ZeroStage::OptimizerStates | ZeroStage::Gradients => {
            let mut full: Vec<f32> = masters.iter().flatten().copied().collect();
            full.truncate(numel);
            full
        }
        ZeroStage::Weights => {
            let shards = plan.shards();
            let mut full = vec![0.0f32; numel];
            for (t, span) in plan.tensors().iter().enumerate() {
                for (q, master) in masters.iter().enumerate() {
                    let piece = shards.piece(t, q);
                    let from = shards.offset(t);
                    full[span.offset + piece.start..span.offset + piece.end]
                        .copy_from_slice(&master[from..from + piece.len()]);
                }
            }
            full
        }
    }
}
