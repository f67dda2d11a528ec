//! The plan's memory prediction ([`Plan::buffers`] over [`Plan::ticks`]) in the executor's
//! categories, so that a run can print its measured peaks next to it.
//!
//! | plan buffer kind | executor category |
//! |---|---|
//! | parameters, persistent parameters, parameter swap buffers | params |
//! | gathered parameters | gathered |
//! | master weights | master |
//! | gradients | grads |
//! | optimizer states, optimizer swap buffers | optimizer |
//! | gradient buckets | buckets |
//! | step scratch | step scratch |
//! | collective staging | buckets |
//! | activations, activation arena | activations |
//! | offload staging | none: the CPU executor copies nothing between host and GPU |
//!
//! The run's plan is compiled with the `dsplan-cpu` backend, whose buffers are the executor's
//! own: every category and the total are the measured ones. What lives on NVMe is left out
//! (its bytes are the swap files, [`crate::zero::swap::NvmeReport`]); the swap buffers are in
//! memory, where the executor's ledger counts them (optimizer and params). A DeepSpeed GPU plan
//! can be read too (its GPU and host buffers added up, offload staging reported apart). Each category's peak is its own highest point over the
//! step's ticks, as the executor's ledger records it.

use serde::Serialize;

use dsplan_planner::plan::{BufferKind, Device, Plan};

use super::{ByCategory, Category};

/// The executor category of a plan buffer kind (`None`: nothing on the CPU corresponds).
pub fn category_of(kind: BufferKind) -> Option<Category> {
    match kind {
        BufferKind::Parameters
        | BufferKind::PersistentParameters
        | BufferKind::ParamSwapBuffers => Some(Category::Params),
        BufferKind::GatheredParameters => Some(Category::Gathered),
        BufferKind::MasterWeights => Some(Category::Master),
        BufferKind::Gradients | BufferKind::ModuleGradients => Some(Category::Grads),
        BufferKind::OptimizerStates | BufferKind::OptimizerSwapBuffers => Some(Category::Optimizer),
        BufferKind::GradientBuckets
        | BufferKind::ReduceScatterStaging
        | BufferKind::CollectiveStaging => Some(Category::Buckets),
        // The gradients the optimizer reads (built at the step) are the executor's step scratch.
        BufferKind::Fp32Gradients | BufferKind::StepScratch => Some(Category::StepScratch),
        BufferKind::InputActivations
        | BufferKind::LayerActivations
        | BufferKind::WorkingActivations
        | BufferKind::Logits
        | BufferKind::LossBuffers
        | BufferKind::ActivationArena => Some(Category::Activations),
        BufferKind::OffloadStaging => None,
    }
}

/// The plan's memory of one rank, in the executor's categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PlanMemory {
    /// The highest total over the step (host and device together, offload staging included).
    pub peak_total: u64,
    /// The highest each category reaches.
    pub peak: ByCategory,
    /// The highest the plan's offload staging reaches (no executor counterpart).
    pub offload_staging: u64,
}

impl PlanMemory {
    /// The memory `plan` predicts for one rank.
    pub fn of(plan: &Plan) -> Self {
        let mut memory = PlanMemory::default();
        for tick in 0..plan.ticks.len() {
            let mut live = ByCategory::default();
            let mut staging = 0;
            for buffer in plan
                .buffers
                .iter()
                .filter(|b| b.device != Device::Nvme && b.lifetime.live_at(tick))
            {
                match category_of(buffer.kind) {
                    Some(category) => live.set(category, live.get(category) + buffer.bytes),
                    None => staging += buffer.bytes,
                }
            }
            for category in Category::ALL {
                let peak = memory.peak.get(category).max(live.get(category));
                memory.peak.set(category, peak);
            }
            memory.offload_staging = memory.offload_staging.max(staging);
            memory.peak_total = memory.peak_total.max(live.total() + staging);
        }
        memory
    }
}
