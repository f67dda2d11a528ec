//! Precision rules: fp16 and bf16 together, and `fp16_master_weights_and_grads` without ZeRO
//! (`research/deepspeed-facts.md` §3.2; `amp` is a removed feature in 0.19.8, see
//! [`super::keys`]).

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
    found
}
