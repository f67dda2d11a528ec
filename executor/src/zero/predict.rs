//! How a rank's measured memory relates to the plan it runs.
//!
//! [`crate::train::compile_plan`] compiles the run's plan with the `dsplan-cpu` backend
//! (`planner::plan::PlanBackend::DsplanCpu`), whose buffer list is exactly what this executor
//! allocates (`planner::plan::cpu_buffers`: the model states, the per-unit gathered copies and
//! gradients, the buckets and collective staging, the step scratch, the activation arena), each
//! over the ticks at which the executor holds it. Every category's peak and the peak total are
//! then the plan's, to the byte (`tests/zero_plan_memory.rs`). A plan compiled for DeepSpeed on
//! GPUs lists DeepSpeed's buffers instead, and nothing is promised. A run on one GPU compiles
//! its plan with the `dsplan-cuda` backend, whose buffers are the device step's.

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

/// How the buffers of the executor backend `runs_on` (`DsplanCpu` or `DsplanCuda`) relate to
/// those `plan` lists: the same when the plan was compiled for that backend.
pub fn correspondence(plan: &Plan, runs_on: PlanBackend) -> Correspondence {
    match plan.settings.backend {
        listed if listed == runs_on => Correspondence::Same,
        PlanBackend::DeepspeedGpu => Correspondence::Differs(
            "the plan lists DeepSpeed's GPU buffers; compile it with the `--backend` of the executor that runs (dsplan-cpu or dsplan-cuda) to list its own",
        ),
        PlanBackend::DsplanCuda => Correspondence::Differs(
            "the plan lists the CUDA executor's device buffers; compile it with `--backend dsplan-cpu` to list the CPU executor's",
        ),
        PlanBackend::DsplanCpu => Correspondence::Differs(
            "the plan lists the CPU executor's buffers; compile it with `--backend dsplan-cuda` to list the CUDA executor's",
        ),
    }
}
