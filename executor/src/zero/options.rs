//! [`RankOptions`]: how a rank stores and reduces (the plan's stage and dtypes, the config's
//! gradient scaling), read by every stage and by the gradient average.

use dsplan_planner::config::ZeroStage;

use super::partition::EnginePlan;
use super::precision::Dtype;
use super::scaling::GradScaling;

/// How a rank stores and reduces: the plan's stage and dtypes, and the config's gradient
/// scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankOptions {
    /// The ZeRO stage.
    pub stage: ZeroStage,
    /// Parameters and gradients as the model produces them.
    pub model_dtype: Dtype,
    /// Gradient accumulation across micro-steps (`data_types.grad_accum_dtype`).
    pub accum_dtype: Dtype,
    /// Reductions (`communication_data_type`).
    pub comm_dtype: Dtype,
    /// Where the division by the world size happens.
    pub scaling: GradScaling,
}

impl RankOptions {
    /// The options of a rank running `plan`, averaging gradients as `scaling` says.
    pub fn from_plan(plan: &EnginePlan, scaling: GradScaling) -> Self {
        let dtypes = plan.dtypes();
        Self {
            stage: plan.stage(),
            model_dtype: dtypes.model,
            accum_dtype: dtypes.accum,
            comm_dtype: dtypes.comm,
            scaling,
        }
    }
}
