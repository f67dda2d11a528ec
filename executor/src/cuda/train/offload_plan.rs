//! Which of a plan's offloads the CUDA step runs ([`check_offload_plan`]): the whole
//! optimizer in host memory, and nothing else yet (parameters, NVMe and a partial `ratio` are
//! refused naming their key). The layout and the world step both ask it; it sits below them.

use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_offload::resident_numel;
use dsplan_planner::plan::settings::{OffloadStepping, OffloadTarget};

/// Whether the CUDA step runs `plan`'s offload: `None` when it does not offload, the stepping
/// when it offloads the whole optimizer to host memory, an error naming the key otherwise.
pub fn check_offload_plan(plan: &Plan) -> Result<Option<OffloadStepping>, String> {
    let settings = &plan.settings;
    if settings.offload_param.is_offloaded() {
        return Err(
            "zero_optimization.offload_param: the CUDA step does not fetch parameters from \
             host memory yet (dsplan plan --backend dsplan-cuda plans it); remove offload_param"
                .into(),
        );
    }
    match settings.offload_optimizer {
        OffloadTarget::None => return Ok(None),
        OffloadTarget::Nvme { .. } => {
            return Err(
                "zero_optimization.offload_optimizer.device nvme: the CUDA step offloads the \
                 optimizer to host memory only; use \"device\": \"cpu\""
                    .into(),
            );
        }
        OffloadTarget::Cpu { .. } => {}
    }
    if resident_numel(&plan.shards) > 0 {
        return Err(
            "zero_optimization.offload_optimizer.ratio: the CUDA step offloads the whole \
             optimizer; a ratio below 1 (part of it kept on the GPU) is not run yet; remove \
             ratio"
                .into(),
        );
    }
    Ok(Some(settings.offload_stepping))
}
