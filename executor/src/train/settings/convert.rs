//! The plan's training policy ([`dsplan_planner::plan::Training`]) in the executor's own
//! types, converted here and nowhere else: the precision and loss scaling as
//! [`MixedPrecision`], the optimizer as [`AdamConfig`].

use dsplan_planner::plan::training::{BiasCorrectionRule, DecayRule};
use dsplan_planner::plan::{LossScaling, OptimizerPolicy};

use crate::optim::{AdamConfig, BiasCorrection, WeightDecay};
use crate::zero::MixedPrecision;

/// The executor's precision for the plan's `loss_scaling`.
pub fn mixed_precision(scaling: &LossScaling) -> MixedPrecision {
    match *scaling {
        LossScaling::Fp32 => MixedPrecision::Fp32,
        LossScaling::Bf16 { overflow } => MixedPrecision::Bf16 { overflow },
        LossScaling::Fp16 { scale, .. } => MixedPrecision::Fp16 { scale },
    }
}

/// Adam's hyperparameters (other than the learning rate) for the plan's `optimizer`.
pub fn adam_config(optimizer: &OptimizerPolicy) -> AdamConfig {
    let [beta1, beta2] = optimizer.betas;
    AdamConfig {
        beta1,
        beta2,
        eps: optimizer.eps,
        weight_decay: optimizer.weight_decay,
        decay: match optimizer.decay {
            DecayRule::Decoupled => WeightDecay::Decoupled,
            DecayRule::L2 => WeightDecay::L2,
        },
        bias_correction: match optimizer.bias_correction {
            BiasCorrectionRule::Enabled => BiasCorrection::Enabled,
            BiasCorrectionRule::Disabled => BiasCorrection::Disabled,
        },
    }
}
