//! How a rank's measured memory relates to the plan it runs.
//!
//! [`crate::train::compile_plan`] compiles the run's plan with the `dsplan-cpu` backend
//! (`planner::plan::PlanBackend::DsplanCpu`), whose buffer list is exactly what this executor
//! allocates (`planner::plan::cpu_buffers`: the model states, the per-unit gathered copies and
//! gradients, the buckets and collective staging, the step scratch, the activation arena), each
//! over the ticks at which the executor holds it. Every category's peak and the peak total are
//! then the plan's, to the byte (`tests/zero_plan_memory.rs`). A plan compiled for DeepSpeed on
//! GPUs lists DeepSpeed's buffers instead, and nothing is promised.

use dsplan_planner::plan::{Plan, PlanBackend};

/// How the executor's buffers relate to the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correspondence {
    /// The plan lists exactly the executor's buffers.
    Same,
    /// The plan lists something else, for this reason.
    Differs(&'static str),
}

impl Correspondence {
    /// Whether measured and planned bytes must be equal.
    pub fn is_same(self) -> bool {
        self == Correspondence::Same
    }

    /// The reason, or `""`.
    pub fn reason(self) -> &'static str {
        match self {
            Correspondence::Same => "",
            Correspondence::Differs(reason) => reason,
        }
    }
}

/// How the executor's buffers relate to those `plan` lists: the same for a `dsplan-cpu` plan.
pub fn correspondence(plan: &Plan) -> Correspondence {
    match plan.settings.backend {
        PlanBackend::DsplanCpu => Correspondence::Same,
        PlanBackend::DeepspeedGpu => Correspondence::Differs(
            "the plan lists DeepSpeed's GPU buffers; compile it with `--backend dsplan-cpu` to list the CPU executor's",
        ),
        PlanBackend::DsplanCuda => Correspondence::Differs(
            "the plan lists the CUDA executor's device buffers; compile it with `--backend dsplan-cpu` to list the CPU executor's",
        ),
    }
}
