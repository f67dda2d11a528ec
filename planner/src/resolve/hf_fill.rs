//! [`fill_auto`]: what the Hugging Face Trainer does to a `ds_config.json` before DeepSpeed
//! sees it (transformers 5.23: `trainer_config_process`, then `trainer_config_finalize`).
//!
//! For each row of the Trainer's table (`hf_rules`), in the Trainer's order:
//! - the parent section is absent: nothing happens (the key stays absent);
//! - the value is `"auto"`: it is replaced by the Trainer's value, or reported as
//!   [`Code::UnresolvableAuto`] when that value cannot be computed (naming the flag);
//! - any other value that the Trainer checks and that differs from its value (Python `==`) is a
//!   [`Code::AutoMismatch`]: an error when the training argument was given, a warning when only
//!   `TrainingArguments`' default disagrees (plain DeepSpeed ignores training arguments).
//!
//! The three bucket sizes follow their own rule: when at least one is `"auto"`, the hidden size
//! `h` gives `reduce_bucket_size = h²` and, with ZeRO-3 only, `stage3_prefetch_bucket_size =
//! int(0.9·h·h)` (truncated: DeepSpeed's pydantic int field refuses a fraction) and
//! `stage3_param_persistence_threshold = 10·h`; without `h` every `"auto"` among the three is
//! unresolvable. Unlike the Trainer, which stops at the first kind of error, every problem is
//! reported.

use std::collections::BTreeMap;

use serde_json::Value;

use super::env::{Environment, HiddenSizeLookup};
use super::hf_rules::{Check, Known, Rule, RuleValue, finalize_rules, fix_text, process_rules};
use super::normalise;
use super::provenance::{Provenance, RuleInput};
use super::python::{py_equal, py_repr};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;

/// `zero_optimization.reduce_bucket_size`.
pub const REDUCE_BUCKET: &str = "/zero_optimization/reduce_bucket_size";
/// `zero_optimization.stage3_prefetch_bucket_size`.
pub const PREFETCH_BUCKET: &str = "/zero_optimization/stage3_prefetch_bucket_size";
/// `zero_optimization.stage3_param_persistence_threshold`.
pub const PERSISTENCE_THRESHOLD: &str = "/zero_optimization/stage3_param_persistence_threshold";

/// The separator between the Trainer's own mismatch line and dsplan's explanation in an
/// [`Code::AutoMismatch`] message.
pub const MISMATCH_SEPARATOR: &str = " — ";

/// The config after the Trainer's pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Filled {
    /// The document as the Trainer hands it to DeepSpeed: every `"auto"` it fills replaced,
    /// quoted numbers at its keys normalised. `"auto"` it leaves (ZeRO-3 bucket keys below
    /// stage 3) stays.
    pub document: Value,
    /// How each filled value was obtained, by pointer.
    pub provenance: BTreeMap<String, Provenance>,
    /// Normalised strings, mismatches and unresolvable `"auto"`s, in the Trainer's order.
    pub diagnostics: Vec<Diagnostic>,
}

/// Runs the Trainer's two stages over `raw`.
pub fn fill_auto(raw: &Value, env: &Environment) -> Filled {
    let mut filled = Filled {
        document: raw.clone(),
        provenance: BTreeMap::new(),
        diagnostics: Vec::new(),
    };
    filled.diagnostics = normalise::numeric_strings(&mut filled.document);
    for rule in process_rules(env) {
        filled.apply(&rule, env);
    }
    filled.missing_precision_sections(env);
    filled.hidden_size_rules(env);
    for rule in finalize_rules(env) {
        filled.apply(&rule, env);
    }
    filled
}

impl Filled {
    /// `fill_match` / `fill_only` of one rule.
    fn apply(&mut self, rule: &Rule, env: &Environment) {
        let key = json_pointer::last_token(rule.pointer);
        let Some(Value::Object(section)) = self
            .document
            .pointer_mut(json_pointer::parent(rule.pointer))
        else {
            return;
        };
        let Some(current) = section.get(&key) else {
            return;
        };
        if current.as_str() == Some("auto") {
            match &rule.value {
                RuleValue::Known(known) => {
                    section.insert(key, known.value.clone());
                    self.provenance
                        .insert(rule.pointer.to_string(), known.provenance.clone());
                }
                RuleValue::Missing { flag, reason } => {
                    self.diagnostics
                        .push(unresolvable(rule.pointer, reason, flag));
                }
            }
            return;
        }
        if rule.check == Check::FillOnly || current.is_null() {
            return;
        }
        if let RuleValue::Known(known) = &rule.value
            && !py_equal(current, &known.value)
        {
            let diagnostic = mismatch(rule, current, known, env);
            self.diagnostics.push(diagnostic);
        }
    }

    /// `--fp16`/`--bf16` with no such section: the Trainer's pass adds nothing (its rule needs
    /// the section), so the file alone does not say that the run is mixed precision.
    fn missing_precision_sections(&mut self, env: &Environment) {
        let args = &env.training_args;
        for (section, flag, arg) in [("fp16", "--fp16", args.fp16), ("bf16", "--bf16", args.bf16)] {
            if !(arg.value && arg.is_given()) || self.document.get(section).is_some() {
                continue;
            }
            self.diagnostics.push(
                Diagnostic::warning(
                    Code::MissingKey,
                    format!("/{section}"),
                    format!(
                        "{flag} is given but the config has no `{section}` section: the Trainer's \"auto\" pass fills only an existing `{section}.enabled`, so the resolved config trains without {section} (Accelerate, which the Trainer runs afterwards, adds `\"{section}\": {{\"enabled\": true}}`)"
                    ),
                )
                .with_help(format!(
                    "add `\"{section}\": {{\"enabled\": \"auto\"}}` so that the file says what runs"
                )),
            );
        }
    }

    /// The bucket sizes computed from the hidden size.
    fn hidden_size_rules(&mut self, env: &Environment) {
        let keys = [REDUCE_BUCKET, PREFETCH_BUCKET, PERSISTENCE_THRESHOLD];
        let autos: Vec<&str> = keys
            .into_iter()
            .filter(|p| self.document.pointer(p).and_then(Value::as_str) == Some("auto"))
            .collect();
        if autos.is_empty() {
            return;
        }
        let Some(hidden) = env.hidden_size.known() else {
            let reason = match &env.hidden_size {
                HiddenSizeLookup::NotInModel { model } => format!(
                    "the model's config ({model}) has neither `hidden_size` nor `hidden_sizes`"
                ),
                _ => "it is computed from the model's hidden size, which is not known".into(),
            };
            for pointer in autos {
                self.diagnostics.push(unresolvable(
                    pointer,
                    &reason,
                    "--hidden-size H (or --model M)",
                ));
            }
            return;
        };
        let h = hidden.value;
        let input = || RuleInput {
            name: "hidden_size".into(),
            value: h.to_string(),
            from: hidden.describe(),
        };
        let squared = h.saturating_mul(h);
        self.fill_only(
            REDUCE_BUCKET,
            Value::from(squared),
            format!("hidden_size² = {h}² = {squared}"),
            input(),
        );
        let stage3 = self
            .document
            .pointer("/zero_optimization/stage")
            .and_then(Value::as_f64)
            == Some(3.0);
        if stage3 {
            // Python's int(0.9 * hidden_size * hidden_size): left to right, then truncated.
            let prefetch = (0.9 * h as f64 * h as f64).trunc() as u64;
            self.fill_only(
                PREFETCH_BUCKET,
                Value::from(prefetch),
                format!("int(0.9 × hidden_size²) = int(0.9 × {h}²) = {prefetch}"),
                input(),
            );
            let threshold = h.saturating_mul(10);
            self.fill_only(
                PERSISTENCE_THRESHOLD,
                Value::from(threshold),
                format!("10 × hidden_size = 10 × {h} = {threshold}"),
                input(),
            );
        }
    }

    fn fill_only(&mut self, pointer: &str, value: Value, formula: String, input: RuleInput) {
        let Some(current) = self.document.pointer_mut(pointer) else {
            return;
        };
        if current.as_str() != Some("auto") {
            return;
        }
        *current = value;
        self.provenance.insert(
            pointer.to_string(),
            Provenance::AutoRule {
                rule: json_pointer::last_token(pointer),
                formula,
                inputs: vec![input],
            },
        );
    }
}

/// `zero_optimization.reduce_bucket_size` for `/zero_optimization/reduce_bucket_size`.
fn dotted(pointer: &str) -> String {
    json_pointer::tokens(pointer).join(".")
}

fn unresolvable(pointer: &str, reason: &str, flag: &str) -> Diagnostic {
    Diagnostic::error(
        Code::UnresolvableAuto,
        pointer,
        format!(
            "`{}` is \"auto\" but nothing fills it: {reason}",
            dotted(pointer)
        ),
    )
    .with_help(format!("pass {flag}, or write a value instead of \"auto\""))
}

fn mismatch(rule: &Rule, current: &Value, known: &Known, env: &Environment) -> Diagnostic {
    let key = dotted(rule.pointer);
    let line = format!(
        "ds {key}={} vs hf {}={}",
        py_repr(current),
        rule.hf_name,
        py_repr(&known.value)
    );
    let fix = fix_text(known.fix, current, env);
    if known.given {
        let help = match fix {
            Some(fix) => format!("{fix}, or set `{key}` to \"auto\""),
            None => format!("set `{key}` to \"auto\""),
        };
        Diagnostic::error(
            Code::AutoMismatch,
            rule.pointer,
            format!("{line}{MISMATCH_SEPARATOR}the config and the training arguments disagree"),
        )
        .with_help(help)
    } else {
        let help = match fix {
            Some(fix) => format!(
                "when training with the Hugging Face Trainer, {fix}, or set `{key}` to \"auto\""
            ),
            None => format!("when training with the Hugging Face Trainer, set `{key}` to \"auto\""),
        };
        Diagnostic::warning(
            Code::AutoMismatch,
            rule.pointer,
            format!(
                "{line}{MISMATCH_SEPARATOR}against TrainingArguments' default: the Hugging Face Trainer refuses this config unless the training arguments agree"
            ),
        )
        .with_help(help)
    }
}
