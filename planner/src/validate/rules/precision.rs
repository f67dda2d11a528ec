//! Precision rules: fp16 and bf16 together, `fp16_master_weights_and_grads` without ZeRO
//! (`research/deepspeed-facts.md` §3.2; `amp` is a removed feature in 0.19.8, see
//! [`super::keys`]), the dynamic loss scaler's window and floor (DeepSpeedFP16Config's
//! validator, `runtime/precision_config.py:182-197`: the same check `dsplan run` makes through
//! [`crate::schedule::loss_scale`]), and dynamic-scaler knobs next to a static `loss_scale`,
//! which nothing reads (`runtime/engine.py` `dynamic_loss_scale()` is `loss_scale == 0`; the
//! knobs only build the dynamic scaler's arguments, `precision_config.py:202-209`), and a
//! gradient accumulation dtype other than the model's without ZeRO, which
//! `_do_optimizer_sanity_check` refuses (`NotImplementedError: unsupported mix`).

use crate::config::DtypeName;
use crate::diagnostics::{Code, Diagnostic};
use crate::validate::view::{Stage, View};

/// Every precision problem in `view`.
pub fn check(view: View<'_>) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    let bf16_section = if view.has("/bf16") {
        "bf16"
    } else {
        "bfloat16"
    };
    if view.enabled("fp16") && view.enabled(bf16_section) {
        found.push(
            Diagnostic::error(
                Code::ConflictingPrecision,
                format!("/{bf16_section}/enabled"),
                "fp16 and bf16 are both enabled; DeepSpeed refuses: \"bfloat16 and fp16 modes cannot be simultaneously enabled\"",
            )
            .with_help("keep one: bf16 on Ampere or newer GPUs, fp16 (with loss scaling) otherwise"),
        );
    }
    if view.bool("/fp16/fp16_master_weights_and_grads") == Some(true)
        && view.stage() == Some(Stage::Disabled)
    {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "/fp16/fp16_master_weights_and_grads",
                "fp16_master_weights_and_grads needs a ZeRO optimizer (stage 1, 2 or 3)",
            )
            .with_help("set zero_optimization.stage to 1 or more, or remove this key"),
        );
    }
    loss_scaler(view, &mut found);
    accumulation_without_zero(view, &mut found);
    found
}

/// Without ZeRO DeepSpeed 0.19.8 takes the model dtype's optimizer wrapper only when the
/// gradients accumulate in the model dtype; any other mix raises at `deepspeed.initialize`.
fn accumulation_without_zero(view: View<'_>, found: &mut Vec<Diagnostic>) {
    const POINTER: &str = "/data_types/grad_accum_dtype";
    let Some(accum) = view.string(POINTER).and_then(|name| {
        DtypeName::SPELLINGS
            .iter()
            .find(|(spelling, _)| *spelling == name)
            .map(|(_, dtype)| *dtype)
    }) else {
        return;
    };
    if view.stage() != Some(Stage::Disabled) {
        return;
    }
    let (model, model_name) = if view.enabled("fp16") {
        (DtypeName::Fp16, "fp16")
    } else if view.enabled("bf16") || view.enabled("bfloat16") {
        (DtypeName::Bf16, "bf16")
    } else {
        (DtypeName::Fp32, "fp32")
    };
    if accum != model {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                POINTER,
                format!(
                    "without ZeRO the gradients must accumulate in the model's dtype ({model_name}); DeepSpeed raises \"NotImplementedError: unsupported mix of model_dtype and grad_accum_dtype\""
                ),
            )
            .with_help(format!(
                "remove data_types.grad_accum_dtype (it defaults to {model_name}), or set zero_optimization.stage to 1 or more"
            )),
        );
    }
}

/// The dynamic loss scaler's knobs.
const DYNAMIC_KNOBS: &[&str] = &[
    "initial_scale_power",
    "loss_scale_window",
    "hysteresis",
    "consecutive_hysteresis",
    "min_loss_scale",
];

fn loss_scaler(view: View<'_>, found: &mut Vec<Diagnostic>) {
    if view.bool("/fp16/enabled") != Some(true) {
        return;
    }
    let Some(scale) = view
        .get("/fp16/loss_scale")
        .map_or(Some(0.0), |v| v.as_f64())
    else {
        return;
    };
    if scale == 0.0 {
        for (knob, why) in [
            (
                "loss_scale_window",
                "DeepSpeed divides by it (ZeroDivisionError at the first clean step)",
            ),
            (
                "min_loss_scale",
                "it is the floor of the scale, which would collapse to nothing",
            ),
        ] {
            let pointer = format!("/fp16/{knob}");
            if let Some(value) = view.number(&pointer).filter(|v| *v <= 0.0) {
                found.push(
                    Diagnostic::error(
                        Code::OutOfRange,
                        &pointer,
                        format!(
                            "`fp16.{knob}` must be > 0 with dynamic loss scaling (loss_scale 0), found {value}: {why}; DeepSpeed refuses: \"fp16.{knob} must be > 0 when dynamic loss scaling is enabled (loss_scale=0)\""
                        ),
                    )
                    .with_help(format!("remove `{knob}` to use the default, or make it positive")),
                );
            }
        }
        return;
    }
    for knob in DYNAMIC_KNOBS {
        let pointer = format!("/fp16/{knob}");
        if view.has(&pointer) {
            found.push(
                Diagnostic::warning(
                    Code::IgnoredSetting,
                    &pointer,
                    format!(
                        "`fp16.{knob}` is ignored: `loss_scale` {scale} fixes the scale, and only the dynamic loss scaler (loss_scale 0) reads `{knob}`"
                    ),
                )
                .with_help(format!(
                    "remove `{knob}`, or set \"loss_scale\": 0 for dynamic loss scaling"
                )),
            );
        }
    }
}
