//! Precision rules: fp16 and bf16 together, AMP with ZeRO or with fp16/bf16, and
//! `fp16_master_weights_and_grads` outside ZeRO-2 (`research/deepspeed-facts.md` §3.2).

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
    if view.enabled("amp") {
        if view.stage().is_some_and(|stage| stage > Stage::Disabled) {
            found.push(
                Diagnostic::error(
                    Code::IncompatibleSettings,
                    "/amp/enabled",
                    "AMP and ZeRO cannot be combined; DeepSpeed refuses: \"Amp and ZeRO are not currently compatible\"",
                )
                .with_help("use `fp16` or `bf16` instead of `amp` with ZeRO"),
            );
        }
        if view.enabled("fp16") || view.enabled(bf16_section) {
            found.push(
                Diagnostic::error(
                    Code::IncompatibleSettings,
                    "/amp/enabled",
                    "AMP cannot be combined with fp16 or bf16 mode",
                )
                .with_help("enable only one of `amp`, `fp16` and `bf16`"),
            );
        }
    }
    if view.bool("/fp16/fp16_master_weights_and_grads") == Some(true)
        && view.stage() != Some(Stage::Gradients)
    {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "/fp16/fp16_master_weights_and_grads",
                "fp16_master_weights_and_grads is only supported with ZeRO stage 2",
            )
            .with_help(
                "set zero_optimization.stage to 2 (with CPU optimizer offload), or remove this key",
            ),
        );
    }
    found
}
