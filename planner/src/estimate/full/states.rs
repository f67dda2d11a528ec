//! Model states as DeepSpeed and the ZeRO paper count them: where one rank's optimizer
//! elements live ([`optimizer_split`], for the step-time model of `recommend`) and the paper's
//! "model states" of an estimate's rows ([`paper_model_states`]).
//!
//! The bytes themselves are the plan's ([`super::plan_rows`]): parameters, gradients, master
//! weights, optimizer states and fp32 gradients are buffers of the plan's list. The ZeRO
//! paper's model states (arXiv 1910.02054 §3: `(2 + 2 + 12)·Ψ` unpartitioned, `4Ψ + 12Ψ/N`,
//! `2Ψ + 14Ψ/N`, `16Ψ/N`) are the first four of them; the fp32 gradients are what DeepSpeed's
//! estimators add to reach their 18 bytes per parameter.

use crate::config::{OffloadDevice, ZeroStage};

use super::context::Context;
use super::rows::{Device, Phase, Row, Term, ceil_div};

/// Optimizer-state elements of one rank, split by where they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerSplit {
    /// Elements whose master, states and fp32 gradients stay on the GPU.
    pub gpu: u128,
    /// Elements offloaded to host memory.
    pub host: u128,
    /// Elements offloaded to NVMe.
    pub nvme: u128,
}

impl OptimizerSplit {
    /// All elements.
    pub fn total(&self) -> u128 {
        self.gpu + self.host + self.nvme
    }
}

/// Elements one rank's optimizer updates: the partition, or all parameters at stage 0 (fp16
/// and bf16 both run `FP16_Optimizer` there, its master and states whole on every rank).
pub fn optimizer_elements(ctx: &Context<'_>) -> u128 {
    let setup = ctx.setup;
    if setup.zero.stage == ZeroStage::Disabled {
        ctx.params()
    } else {
        ctx.partition()
    }
}

/// Elements of the sub-groups a partial offload puts on the host: the first
/// `floor(ratio × G)` of `G = ceil(p / sub_group_size)` sub-groups (stage 3); everything
/// otherwise.
pub fn offloaded_elements(ctx: &Context<'_>, elements: u128) -> u128 {
    let zero = &ctx.setup.zero;
    let ratio = zero.offload_optimizer.ratio;
    if zero.stage != ZeroStage::Weights || ratio >= 1.0 {
        return elements;
    }
    let sub = u128::from(zero.sub_group_size).max(1);
    let groups = ceil_div(elements, sub);
    // ratio is in [0, 1); the product is below the group count.
    let offloaded_groups = (ratio.max(0.0) * groups as f64).floor() as u128;
    (offloaded_groups * sub).min(elements)
}

/// Where one rank's optimizer elements live.
pub fn optimizer_split(ctx: &Context<'_>) -> OptimizerSplit {
    let elements = optimizer_elements(ctx);
    let zero = &ctx.setup.zero;
    if !zero.optimizer_offloaded() {
        return OptimizerSplit {
            gpu: elements,
            host: 0,
            nvme: 0,
        };
    }
    let away = offloaded_elements(ctx, elements);
    let nvme =
        zero.stage == ZeroStage::Weights && zero.offload_optimizer.device == OffloadDevice::Nvme;
    OptimizerSplit {
        gpu: elements - away,
        host: if nvme { 0 } else { away },
        nvme: if nvme { away } else { 0 },
    }
}

/// The sum of parameters, gradients, master weights and optimizer states in `phase` on
/// `device` (the ZeRO paper's "model states"; fp32 gradients excluded).
pub fn paper_model_states(rows: &[Row], device: Device, phase: Phase) -> u64 {
    rows.iter()
        .filter(|row| row.device == device)
        .filter(|row| {
            matches!(
                row.term,
                Term::Parameters | Term::Gradients | Term::MasterParameters | Term::OptimizerStates
            )
        })
        .map(|row| row.bytes.get(phase))
        .fold(0, u64::saturating_add)
}
