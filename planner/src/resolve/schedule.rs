//! The learning-rate schedule of a config after the Trainer's pass: the same
//! [`LrSchedule`] the executor steps, built from the filled `scheduler` section with the
//! optimizer's learning rate.
//!
//! The schedule is built from the filled document exactly as DeepSpeed receives it from the
//! Trainer (`json.load`: `10.0` stays a float), so DeepSpeed's constructor checks and messages
//! apply unchanged.

use serde_json::{Map, Value};

use super::defaults::optimizer_default_lr;
use super::env::Environment;
use super::hf_fill::fill_auto;
use crate::config::registry::optimizer_spec;
use crate::diagnostics::{Code, Diagnostic, Severity};
use crate::json_pointer;
use crate::schedule::lr::DEEPSPEED_SCHEDULERS;
use crate::schedule::{
    BetasSupport, LrSchedule, OptimizerGroups, ScheduleError, ScheduleWarning, py_float_repr,
};
use crate::validate::rules::ranges;
use crate::validate::view::View;
use crate::validate::{ValidateOptions, validate_document};

/// A schedule ready to step, with the learning rate it scales.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedSchedule {
    /// The schedule.
    pub schedule: LrSchedule,
    /// The optimizer's learning rate at construction (what `WarmupCosineLR` scales and
    /// `WarmupLR` warms up to by default).
    pub base_lr: f64,
    /// Where `base_lr` came from, in words.
    pub base_lr_source: String,
    /// What DeepSpeed would warn about, and the Trainer's warnings on these sections.
    pub diagnostics: Vec<Diagnostic>,
}

/// `dsplan schedule`: the Trainer's pass over `raw`, then the schedule. Only problems in
/// `optimizer` and `scheduler` matter here (the batch sizes do not change the schedule): the
/// Trainer's, and the value ranges and unknown keys `dsplan validate` reports there, so that a
/// value every other command refuses is refused here too.
pub fn schedule(raw: &Value, env: &Environment) -> Result<ResolvedSchedule, Vec<Diagnostic>> {
    let filled = fill_auto(raw, env);
    let unknown_keys = validate_document(&filled.document, ValidateOptions::default())
        .into_iter()
        .filter(|d| d.code == Code::UnknownKey);
    let shared_rules = ranges::check(View::new(&filled.document))
        .into_iter()
        .chain(unknown_keys);
    let relevant: Vec<Diagnostic> = filled
        .diagnostics
        .into_iter()
        .chain(shared_rules)
        .filter(|d| d.pointer.starts_with("/optimizer") || d.pointer.starts_with("/scheduler"))
        .collect();
    if relevant.iter().any(Diagnostic::is_error) {
        return Err(relevant);
    }
    let mut built = schedule_of(&filled.document, env)?;
    let mut diagnostics = relevant;
    diagnostics.append(&mut built.diagnostics);
    built.diagnostics = diagnostics;
    Ok(built)
}

/// The schedule of a filled document (no `"auto"` left in `optimizer`/`scheduler`).
pub fn schedule_of(filled: &Value, env: &Environment) -> Result<ResolvedSchedule, Vec<Diagnostic>> {
    let Some(section) = filled.get("scheduler").filter(|s| !s.is_null()) else {
        return Err(vec![
            Diagnostic::error(
                Code::MissingKey,
                "",
                "the config has no `scheduler`: DeepSpeed leaves the learning rate to the training script",
            )
            .with_help("add a `scheduler` section (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest)"),
        ]);
    };
    let Some(kind) = section.get("type").and_then(Value::as_str) else {
        return Err(vec![Diagnostic::error(
            Code::MissingKey,
            "/scheduler/type",
            "`scheduler.type` must name the scheduler",
        )]);
    };
    let empty = Map::new();
    let params = match section.get("params") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(params)) => params,
        Some(other) => {
            return Err(vec![Diagnostic::error(
                Code::WrongType,
                "/scheduler/params",
                format!("`scheduler.params` must be an object, found {other}"),
            )]);
        }
    };
    let (base_lr, base_lr_source, betas) = optimizer_lr(filled, env)?;
    let groups = OptimizerGroups {
        lrs: &[base_lr],
        betas,
    };
    match LrSchedule::from_params_for(kind, params, groups) {
        Ok((schedule, warnings)) => Ok(ResolvedSchedule {
            schedule,
            base_lr,
            base_lr_source,
            diagnostics: warnings.iter().map(warning).collect(),
        }),
        Err(error) => Err(vec![refusal(&error)]),
    }
}

/// Whether `kind` is one of DeepSpeed's five schedulers (the ones dsplan models).
pub fn is_deepspeed_scheduler(kind: &str) -> bool {
    DEEPSPEED_SCHEDULERS.contains(&kind)
}

/// The optimizer's learning rate, where it came from, and whether it has betas.
fn optimizer_lr(
    filled: &Value,
    env: &Environment,
) -> Result<(f64, String, BetasSupport), Vec<Diagnostic>> {
    let Some(optimizer) = filled.get("optimizer").filter(|o| o.is_object()) else {
        let lr = env.training_args.learning_rate;
        let origin = if lr.is_given() {
            "given"
        } else {
            "TrainingArguments default"
        };
        return Ok((
            lr.value,
            format!(
                "learning_rate {} ({origin}): without an `optimizer` section the Trainer builds AdamW with it",
                py_float_repr(lr.value)
            ),
            BetasSupport::Betas,
        ));
    };
    let kind = optimizer.get("type").and_then(Value::as_str).unwrap_or("");
    let betas = match optimizer_spec(kind) {
        Some(spec) if !spec.params.contains(&"betas") => BetasSupport::NoBetas,
        _ => BetasSupport::Betas,
    };
    match optimizer.pointer("/params/lr") {
        Some(Value::Number(lr)) => {
            let lr = lr.as_f64().unwrap_or(f64::NAN);
            Ok((
                lr,
                format!("{} (optimizer.params.lr)", py_float_repr(lr)),
                betas,
            ))
        }
        None | Some(Value::Null) => {
            let lr = optimizer_default_lr(kind).unwrap_or(1e-3);
            Ok((
                lr,
                format!("{} (the default lr of {kind})", py_float_repr(lr)),
                betas,
            ))
        }
        Some(other) => Err(vec![Diagnostic::error(
            Code::WrongType,
            "/optimizer/params/lr",
            format!("`optimizer.params.lr` must be a number, found {other}"),
        )]),
    }
}

/// A DeepSpeed refusal as a diagnostic at the parameter it names.
fn refusal(error: &ScheduleError) -> Diagnostic {
    let pointer = match &error.param {
        Some(param) => json_pointer::child("/scheduler/params", param),
        None => "/scheduler/type".to_string(),
    };
    let diagnostic = Diagnostic::error(error.code(), pointer, error.message.clone());
    match &error.suggestion {
        Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
        None => diagnostic,
    }
}

/// A DeepSpeed warning as a diagnostic.
fn warning(warning: &ScheduleWarning) -> Diagnostic {
    let param = warning.param.as_deref().unwrap_or("");
    let code = match param {
        "warmup_type" => Code::InvalidEnumValue,
        "total_num_steps" => Code::OutOfRange,
        "cycle_momentum" => Code::IncompatibleSettings,
        _ => Code::WrongType,
    };
    let pointer = if param.is_empty() {
        "/scheduler".to_string()
    } else {
        json_pointer::child("/scheduler/params", param)
    };
    Diagnostic::new(Severity::Warning, code, pointer, warning.message.clone())
}
