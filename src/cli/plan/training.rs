//! The run's training policy in `dsplan plan`: read from the same config by the planner's one
//! reader ([`training::read`]), attached to the plan, and printed as two lines (optimizer;
//! loss scaling, clipping and schedule).
//!
//! `dsplan plan` does not resolve the config, so the schedule is built from the file as
//! written. For dsplan's backends, what `dsplan run` would refuse becomes a warning here (the
//! memory plan still stands); for DeepSpeed's, a config dsplan's executors cannot train simply
//! has no training policy (DeepSpeed trains it).

use dsplan_planner::config::DsConfig;
use dsplan_planner::diagnostics::Diagnostic;
use dsplan_planner::plan::training::{self, BiasCorrectionRule, DecayRule, ScalerArgs, Sources};
use dsplan_planner::plan::{LossScaling, Plan, PlanBackend, Training};
use dsplan_planner::resolve::Environment;
use dsplan_planner::resolve::schedule::{is_deepspeed_scheduler, schedule_of};
use dsplan_planner::schedule::loss_scale::OverflowCheck;
use serde_json::Value;

/// `plan` with the training policy of `config` (`document`: the file as written), and the
/// warnings for dsplan's backends when `dsplan run` would refuse it.
pub(super) fn attach(
    plan: Plan,
    config: &DsConfig,
    document: &Value,
    backend: PlanBackend,
) -> (Plan, Vec<Diagnostic>) {
    let built = match config.scheduler.as_ref().and_then(|s| s.kind.as_deref()) {
        Some(kind) if is_deepspeed_scheduler(kind) => {
            match schedule_of(document, &Environment::default()) {
                Ok(built) => Some(built.schedule),
                Err(found) => return (plan, refusals(found, backend)),
            }
        }
        _ => None,
    };
    let read = training::read(Sources {
        config,
        document,
        schedule: built.as_ref(),
    });
    match read {
        Ok(training) => (plan.with_training(training), Vec::new()),
        Err(found) => (plan, refusals(found, backend)),
    }
}

/// The errors of reading the training sections, as what `dsplan run` would refuse.
fn refusals(found: Vec<Diagnostic>, backend: PlanBackend) -> Vec<Diagnostic> {
    if backend == PlanBackend::DeepspeedGpu {
        return Vec::new();
    }
    found
        .into_iter()
        .filter(Diagnostic::is_error)
        .map(|d| {
            let warning = Diagnostic::warning(
                d.code,
                d.pointer.clone(),
                format!("dsplan run refuses this config: {}", d.message),
            );
            match d.help {
                Some(help) => warning.with_help(help),
                None => warning,
            }
        })
        .collect()
}

/// The two lines of the human summary (nothing without a training policy).
pub(super) fn human(plan: &Plan, out: &mut String) {
    let Some(training) = &plan.training else {
        return;
    };
    out.push_str(&optimizer_line(training));
    out.push_str(&scaling_line(training));
}

fn optimizer_line(training: &Training) -> String {
    let o = &training.optimizer;
    let decay = match o.decay {
        DecayRule::Decoupled => "decoupled",
        DecayRule::L2 => "L2",
    };
    let correction = match o.bias_correction {
        BiasCorrectionRule::Enabled => "bias correction",
        BiasCorrectionRule::Disabled => "no bias correction",
    };
    format!(
        "  optimizer: {} lr {} betas ({}, {}) eps {} weight decay {} ({decay}), {correction}\n",
        o.name, o.lr, o.betas[0], o.betas[1], o.eps, o.weight_decay
    )
}

fn scaling_line(training: &Training) -> String {
    let scaling = match training.loss_scaling {
        LossScaling::Fp32 => "fp32, no loss scaling".to_string(),
        LossScaling::Bf16 { overflow } => match overflow {
            OverflowCheck::SkipStep => {
                "bf16, loss scale 1, a step with inf/NaN gradients is skipped"
            }
            OverflowCheck::Ignore => "bf16, loss scale 1, no overflow check",
        }
        .to_string(),
        LossScaling::Fp16 { scale, args } if scale.is_dynamic() => {
            let from = match args {
                ScalerArgs::Config => "the fp16 section",
                ScalerArgs::ZeroDefaults => {
                    "ZeRO's DynamicLossScaler defaults (no scaler key written)"
                }
                ScalerArgs::ConfigDefaults => "DeepSpeed's fp16 defaults",
            };
            format!(
                "fp16, dynamic loss scale from 2^{} (window {}, hysteresis {}, min {}; {from})",
                scale.initial_scale_power,
                scale.loss_scale_window,
                scale.hysteresis,
                scale.min_loss_scale
            )
        }
        LossScaling::Fp16 { scale, .. } => format!("fp16, static loss scale {}", scale.loss_scale),
    };
    let clip = if training.clip_threshold > 0.0 {
        format!("clip at {}", training.clip_threshold)
    } else {
        "no clipping".to_string()
    };
    let schedule = training
        .schedule
        .as_ref()
        .map_or("constant lr".to_string(), |s| {
            format!("{} schedule", s.type_name())
        });
    format!("  training: {scaling}; {clip}; {schedule}\n")
}
