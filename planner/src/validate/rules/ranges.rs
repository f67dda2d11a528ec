//! Numeric knobs with a meaningful range that DeepSpeed 0.19.8 takes without complaint though
//! the value cannot work. [`RANGES`] is the table: each entry names the key, the values that
//! break, what happens (error or warning) and the 0.19.8 source line that shows why.
//!
//! Ranges DeepSpeed checks itself are elsewhere: the schema's integer bounds
//! (`NonNegativeInt`, `PositiveInt`), `fp16.loss_scale >= 0` (the typed section) and the dynamic
//! scaler's window and floor ([`super::precision`]).

use crate::diagnostics::{Diagnostic, Severity};
use crate::validate::view::View;
use crate::{Code, json_pointer};

/// Which values of a knob break.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Broken {
    /// Below zero.
    Negative,
    /// Outside `[0, 1)`.
    OutsideUnitInterval,
}

impl Broken {
    fn holds(self, value: f64) -> bool {
        match self {
            Broken::Negative => value < 0.0,
            Broken::OutsideUnitInterval => !(0.0..1.0).contains(&value),
        }
    }

    fn wanted(self) -> &'static str {
        match self {
            Broken::Negative => "at least 0",
            Broken::OutsideUnitInterval => "in [0, 1)",
        }
    }
}

/// One knob and why some of its values cannot work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Range {
    /// The key (`/optimizer/params/betas/*` applies to each item).
    pub pointer: &'static str,
    /// Which values break.
    pub broken: Broken,
    /// Error or warning.
    pub severity: Severity,
    /// What the value does.
    pub reason: &'static str,
    /// The DeepSpeed 0.19.8 source that uses the value.
    pub source: &'static str,
}

/// Every knob checked here.
pub const RANGES: &[Range] = &[
    Range {
        pointer: "/optimizer/params/lr",
        broken: Broken::Negative,
        severity: Severity::Error,
        reason: "DeepSpeed's optimizers use it as given (no check), so a negative rate steps up the gradient and the loss grows",
        source: "deepspeed/ops/adam/fused_adam.py:89 (defaults = dict(lr=lr, ...), no range check)",
    },
    Range {
        pointer: "/optimizer/params/betas/*",
        broken: Broken::OutsideUnitInterval,
        severity: Severity::Error,
        reason: "Adam's moment decay: with beta >= 1 the bias correction 1 - beta^t is 0 or negative (a division by zero or a sign flip), below 0 the averages oscillate",
        source: "deepspeed/ops/adam/fused_adam.py:128 (beta1, beta2 = group['betas'], passed to the kernel unchecked)",
    },
    Range {
        pointer: "/optimizer/params/eps",
        broken: Broken::Negative,
        severity: Severity::Error,
        reason: "it keeps Adam's denominator sqrt(v) + eps away from zero; a negative eps can make it zero or negative",
        source: "deepspeed/ops/adam/fused_adam.py:89 (eps stored unchecked)",
    },
    Range {
        pointer: "/optimizer/params/weight_decay",
        broken: Broken::Negative,
        severity: Severity::Warning,
        reason: "a negative decay grows every weight at each step instead of shrinking it",
        source: "deepspeed/ops/adam/fused_adam.py:89 (weight_decay stored unchecked)",
    },
    Range {
        pointer: "/gradient_clipping",
        broken: Broken::Negative,
        severity: Severity::Warning,
        reason: "DeepSpeed clips only when it is above 0, so a negative value silently turns clipping off",
        source: "deepspeed/runtime/engine.py:3506 (if self.gradient_clipping() > 0.0)",
    },
];

/// Every value in `view` that [`RANGES`] says cannot work.
pub fn check(view: View<'_>) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for range in RANGES {
        let (pointer, each) = match range.pointer.strip_suffix("/*") {
            Some(array) => (array, true),
            None => (range.pointer, false),
        };
        let values: Vec<(String, f64)> = if each {
            view.get(pointer)
                .and_then(serde_json::Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .enumerate()
                        .filter_map(|(at, v)| {
                            v.as_f64().map(|n| (json_pointer::index(pointer, at), n))
                        })
                        .collect()
                })
                .unwrap_or_default()
        } else {
            view.number(pointer)
                .map(|n| vec![(pointer.to_string(), n)])
                .unwrap_or_default()
        };
        for (at, value) in values {
            if !range.broken.holds(value) {
                continue;
            }
            found.push(
                Diagnostic::new(
                    range.severity,
                    Code::OutOfRange,
                    &at,
                    format!(
                        "`{}` is {value}, but it must be {}: {}",
                        json_pointer::tokens(&at).join("."),
                        range.broken.wanted(),
                        range.reason
                    ),
                )
                .with_help(format!("DeepSpeed 0.19.8 uses it in {}", range.source)),
            );
        }
    }
    found
}
