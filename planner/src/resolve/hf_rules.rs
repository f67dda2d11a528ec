//! The Hugging Face Trainer's `"auto"` table (transformers 5.23, `HfTrainerDeepSpeedConfig`,
//! `peers.md` §1.3) as data: for each DeepSpeed key, the value the Trainer computes from the
//! [`Environment`], whether an explicit value must match it, and how a user would change the
//! training side to agree with the file.
//!
//! The hidden-size rules (bucket sizes) have their own precondition and live in
//! [`super::hf_fill`].

use serde_json::Value;

use super::env::Environment;
use super::provenance::{Provenance, RuleInput, arg_origin_text};
use super::python::py_repr;
use super::training_args::{Arg, WarmupSteps};
use crate::schedule::py_float_repr;

/// What the Trainer does with an explicit (non-`"auto"`) value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Check {
    /// `fill_match`: a different explicit value is a mismatch.
    Match,
    /// `fill_only`: an explicit value is left alone.
    FillOnly,
}

/// How to change the training arguments so that they agree with a value in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fix {
    /// Pass this flag with the file's value.
    Flag(&'static str),
    /// Pass `--adam-beta1`/`--adam-beta2` with the file's pair.
    Betas,
    /// Make world size × per-device batch × accumulation equal the file's value.
    TrainBatch,
    /// Add or drop this boolean flag.
    Switch(&'static str),
}

/// The Trainer's value for one key.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Known {
    /// The value, typed as Python holds it (int, float, bool, list).
    pub value: Value,
    /// How it was obtained.
    pub provenance: Provenance,
    /// Whether it depends on a training argument the user gave (then a mismatch is an error;
    /// against defaults only, a warning).
    pub given: bool,
    /// How to make the training side agree with the file.
    pub fix: Fix,
}

/// Whether the Trainer's value can be computed from what is known.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum RuleValue {
    /// Computed.
    Known(Known),
    /// Not computable: `flag` would provide what is missing.
    Missing {
        /// The flag that would fill it.
        flag: &'static str,
        /// What is missing, in words.
        reason: String,
    },
}

/// One row of the Trainer's table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rule {
    /// The DeepSpeed key.
    pub pointer: &'static str,
    /// The name the Trainer prints in a mismatch line (`hf <name>=<value>`).
    pub hf_name: &'static str,
    /// Match or fill only.
    pub check: Check,
    /// The Trainer's value.
    pub value: RuleValue,
}

/// Stage A (`trainer_config_process`, when `TrainingArguments` is created), in the Trainer's
/// order.
pub(crate) fn process_rules(env: &Environment) -> Vec<Rule> {
    let args = &env.training_args;
    let micro = args.per_device_train_batch_size;
    let accumulation = args.gradient_accumulation_steps;
    let precision_given = [
        args.fp16,
        args.bf16,
        args.fp16_full_eval,
        args.bf16_full_eval,
    ]
    .iter()
    .any(Arg::is_given);
    vec![
        copy_count(
            "/train_micro_batch_size_per_gpu",
            "per_device_train_batch_size",
            "--per-device-train-batch-size",
            micro,
        ),
        copy_count(
            "/gradient_accumulation_steps",
            "gradient_accumulation_steps",
            "--gradient-accumulation-steps",
            accumulation,
        ),
        Rule {
            pointer: "/train_batch_size",
            hf_name: "train_batch_size (calculated)",
            check: Check::Match,
            value: train_batch(env.world_size, micro, accumulation),
        },
        copy_float(
            "/gradient_clipping",
            "max_grad_norm",
            "--max-grad-norm",
            args.max_grad_norm,
        ),
        copy_float(
            "/optimizer/params/lr",
            "learning_rate",
            "--learning-rate",
            args.learning_rate,
        ),
        Rule {
            pointer: "/optimizer/params/betas",
            hf_name: "adam_beta1+adam_beta2",
            check: Check::Match,
            value: betas(args.adam_beta1, args.adam_beta2),
        },
        copy_float(
            "/optimizer/params/eps",
            "adam_epsilon",
            "--adam-epsilon",
            args.adam_epsilon,
        ),
        copy_float(
            "/optimizer/params/weight_decay",
            "weight_decay",
            "--weight-decay",
            args.weight_decay,
        ),
        Rule {
            pointer: "/scheduler/params/warmup_min_lr",
            hf_name: "warmup_min_lr",
            check: Check::FillOnly,
            value: RuleValue::Known(Known {
                value: Value::from(0),
                provenance: Provenance::AutoRule {
                    rule: "warmup_min_lr".into(),
                    formula: "0 (the Trainer always starts warm-up at 0)".into(),
                    inputs: Vec::new(),
                },
                given: false,
                fix: Fix::Flag("--learning-rate"),
            }),
        },
        copy_float(
            "/scheduler/params/warmup_max_lr",
            "learning_rate",
            "--learning-rate",
            args.learning_rate,
        ),
        precision(
            "/fp16/enabled",
            "fp16|fp16_full_eval",
            ("fp16", "--fp16", args.fp16),
            ("fp16_full_eval", args.fp16_full_eval),
            precision_given,
        ),
        precision(
            "/bf16/enabled",
            "bf16|bf16_full_eval",
            ("bf16", "--bf16", args.bf16),
            ("bf16_full_eval", args.bf16_full_eval),
            precision_given,
        ),
    ]
}

/// Stage B (`trainer_config_finalize`, once the number of training steps is known), except the
/// hidden-size rules.
pub(crate) fn finalize_rules(env: &Environment) -> Vec<Rule> {
    let args = &env.training_args;
    let total = match args.num_training_steps {
        Some(steps) => RuleValue::Known(Known {
            value: Value::from(steps.value),
            provenance: Provenance::from_training_arg(
                "num_training_steps",
                steps.value.to_string(),
                steps.origin,
                "--num-training-steps",
            ),
            given: true,
            fix: Fix::Flag("--num-training-steps"),
        }),
        None => RuleValue::Missing {
            flag: "--num-training-steps",
            reason: "the number of training steps is not known".into(),
        },
    };
    vec![
        Rule {
            pointer: "/scheduler/params/total_num_steps",
            hf_name: "num_training_steps (calculated)",
            check: Check::Match,
            value: total,
        },
        Rule {
            pointer: "/scheduler/params/warmup_num_steps",
            hf_name: "warmup_steps",
            check: Check::Match,
            value: warmup(env),
        },
    ]
}

/// A text for a suggestion: the file's value, as a flag would take it.
pub(crate) fn fix_text(fix: Fix, file_value: &Value, env: &Environment) -> Option<String> {
    match fix {
        Fix::Flag(flag) => file_value
            .is_number()
            .then(|| format!("pass {flag} {}", py_repr(file_value))),
        Fix::Betas => match file_value.as_array().map(Vec::as_slice) {
            Some([beta1, beta2]) if beta1.is_number() && beta2.is_number() => Some(format!(
                "pass --adam-beta1 {} --adam-beta2 {}",
                py_repr(beta1),
                py_repr(beta2)
            )),
            _ => None,
        },
        Fix::TrainBatch => {
            let world = env.world_size?;
            let train = file_value.as_f64()?;
            let per_rank = train / world as f64;
            Some(if per_rank.fract() == 0.0 && per_rank >= 1.0 {
                format!(
                    "choose --per-device-train-batch-size and --gradient-accumulation-steps whose product is {per_rank} ({} / world size {world})",
                    py_repr(file_value)
                )
            } else {
                format!(
                    "{} is not a multiple of the world size {world}: no training arguments give it",
                    py_repr(file_value)
                )
            })
        }
        Fix::Switch(flag) => match file_value {
            Value::Bool(true) => Some(format!("pass {flag}")),
            Value::Bool(false) => Some(format!("drop {flag}")),
            _ => None,
        },
    }
}

fn copy_count(
    pointer: &'static str,
    name: &'static str,
    flag: &'static str,
    arg: Arg<u64>,
) -> Rule {
    Rule {
        pointer,
        hf_name: name,
        check: Check::Match,
        value: RuleValue::Known(Known {
            value: Value::from(arg.value),
            provenance: Provenance::from_training_arg(
                name,
                arg.value.to_string(),
                arg.origin,
                flag,
            ),
            given: arg.is_given(),
            fix: Fix::Flag(flag),
        }),
    }
}

fn copy_float(
    pointer: &'static str,
    name: &'static str,
    flag: &'static str,
    arg: Arg<f64>,
) -> Rule {
    Rule {
        pointer,
        hf_name: name,
        check: Check::Match,
        value: RuleValue::Known(Known {
            value: Value::from(arg.value),
            provenance: Provenance::from_training_arg(
                name,
                py_float_repr(arg.value),
                arg.origin,
                flag,
            ),
            given: arg.is_given(),
            fix: Fix::Flag(flag),
        }),
    }
}

fn input<T>(name: &str, value: String, arg: Arg<T>, flag: &str) -> RuleInput {
    RuleInput {
        name: name.to_string(),
        value,
        from: arg_origin_text(arg.origin, flag),
    }
}

fn train_batch(world_size: Option<u64>, micro: Arg<u64>, accumulation: Arg<u64>) -> RuleValue {
    let Some(world) = world_size else {
        return RuleValue::Missing {
            flag: "--world-size",
            reason: "it is world size × per-device batch × accumulation steps, and the world size is not known".into(),
        };
    };
    let (mb, gas) = (micro.value, accumulation.value);
    let Some(train) = world.checked_mul(mb).and_then(|p| p.checked_mul(gas)) else {
        return RuleValue::Missing {
            flag: "--world-size",
            reason: format!("{world} × {mb} × {gas} does not fit in 64 bits"),
        };
    };
    RuleValue::Known(Known {
        value: Value::from(train),
        provenance: Provenance::AutoRule {
            rule: "train_batch_size".into(),
            formula: format!(
                "world_size × per_device_train_batch_size × gradient_accumulation_steps = {world} × {mb} × {gas} = {train}"
            ),
            inputs: vec![
                RuleInput {
                    name: "world_size".into(),
                    value: world.to_string(),
                    from: "--world-size".into(),
                },
                input(
                    "per_device_train_batch_size",
                    mb.to_string(),
                    micro,
                    "--per-device-train-batch-size",
                ),
                input(
                    "gradient_accumulation_steps",
                    gas.to_string(),
                    accumulation,
                    "--gradient-accumulation-steps",
                ),
            ],
        },
        given: micro.is_given() || accumulation.is_given(),
        fix: Fix::TrainBatch,
    })
}

fn betas(beta1: Arg<f64>, beta2: Arg<f64>) -> RuleValue {
    let value = Value::from(vec![beta1.value, beta2.value]);
    let shown = py_repr(&value);
    RuleValue::Known(Known {
        provenance: Provenance::AutoRule {
            rule: "betas".into(),
            formula: format!("[adam_beta1, adam_beta2] = {shown}"),
            inputs: vec![
                input(
                    "adam_beta1",
                    py_float_repr(beta1.value),
                    beta1,
                    "--adam-beta1",
                ),
                input(
                    "adam_beta2",
                    py_float_repr(beta2.value),
                    beta2,
                    "--adam-beta2",
                ),
            ],
        },
        value,
        given: beta1.is_given() || beta2.is_given(),
        fix: Fix::Betas,
    })
}

/// `fp16.enabled`/`bf16.enabled`: the flag or its `_full_eval` twin. `precision_given`: any of
/// the four precision arguments was given. Then the run's precision is stated, and a config
/// that disagrees with it (`--fp16` against `"bf16": {"enabled": true}`, where `--bf16` is
/// False by implication) is the Trainer's mismatch error, not a difference from a default.
fn precision(
    pointer: &'static str,
    hf_name: &'static str,
    (name, flag, train): (&'static str, &'static str, Arg<bool>),
    (eval_name, eval): (&'static str, Arg<bool>),
    precision_given: bool,
) -> Rule {
    let value = train.value || eval.value;
    let provenance = if eval.value && !train.value {
        Provenance::AutoRule {
            rule: name.into(),
            formula: format!("{name} or {eval_name} = True"),
            inputs: vec![input(eval_name, "True".into(), eval, "--training-args")],
        }
    } else {
        Provenance::from_training_arg(name, py_repr(&Value::Bool(value)), train.origin, flag)
    };
    Rule {
        pointer,
        hf_name,
        check: Check::Match,
        value: RuleValue::Known(Known {
            value: Value::Bool(value),
            provenance,
            given: precision_given || train.is_given() || eval.is_given(),
            fix: Fix::Switch(flag),
        }),
    }
}

/// `warmup_num_steps`: `max(1, get_warmup_steps(num_training_steps))`.
fn warmup(env: &Environment) -> RuleValue {
    let args = &env.training_args;
    let warmup = args.warmup_steps;
    let total = args.num_training_steps;
    let Some(steps) = warmup.value.steps_for(total.map(|t| t.value)) else {
        return RuleValue::Missing {
            flag: "--num-training-steps",
            reason: format!(
                "warmup_steps {} is a ratio of the training steps, whose number is not known",
                warmup.value.display()
            ),
        };
    };
    let value = steps.max(1);
    let mut inputs = vec![input(
        "warmup_steps",
        warmup.value.display(),
        warmup,
        "--warmup-steps",
    )];
    let formula = match (warmup.value, total) {
        (WarmupSteps::Ratio(ratio), Some(total)) => {
            inputs.push(input(
                "num_training_steps",
                total.value.to_string(),
                total,
                "--num-training-steps",
            ));
            format!(
                "max(1, ceil(num_training_steps × warmup_steps)) = max(1, ceil({} × {})) = {value}",
                total.value,
                py_float_repr(ratio)
            )
        }
        _ => format!("max(1, warmup_steps) = max(1, {steps}) = {value}"),
    };
    let given = warmup.is_given()
        || (matches!(warmup.value, WarmupSteps::Ratio(_)) && total.is_some_and(|t| t.is_given()));
    RuleValue::Known(Known {
        value: Value::from(value),
        provenance: Provenance::AutoRule {
            rule: "warmup_num_steps".into(),
            formula,
            inputs,
        },
        given,
        fix: Fix::Flag("--warmup-steps"),
    })
}
