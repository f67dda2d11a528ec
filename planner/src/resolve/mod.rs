//! `dsplan resolve`: the config DeepSpeed really trains with, and where each value came from.
//!
//! [`resolve`] is a pure function of the raw config and an explicit [`Environment`] (world
//! size, Hugging Face training arguments, the model's hidden size), so that `resolve`,
//! `estimate`, `plan` and `run` all see the same values:
//!
//! 1. [`fill_auto`] does what the Hugging Face Trainer does before DeepSpeed sees the file
//!    (transformers 5.23's `HfTrainerDeepSpeedConfig`): every `"auto"` it knows is filled from
//!    the training arguments, the world size and the hidden size, and every explicit value it
//!    checks is compared with them ([`hf_fill`]);
//! 2. the filled config is validated as DeepSpeed 0.19.8 would judge it
//!    ([`crate::validate`]), and its batch triangle solved ([`batch`]);
//! 3. every default is materialised: the typed config's own ([`crate::config::DsConfig`]),
//!    `overlap_comm`, the optimizer's and the scheduler's constructor defaults ([`defaults`],
//!    `scheduler_defaults`); deprecated spellings become current ones (`deprecated`);
//! 4. each value's [`Provenance`] is traced ([`trace`]).
//!
//! The learning-rate schedule the executor steps is built from the filled config by
//! [`schedule::schedule_of`]; [`schedule::schedule`] is the same without full validation (for
//! `dsplan schedule`), and [`phases`] describes it for people.

pub mod batch;
pub mod defaults;
mod deprecated;
pub mod env;
pub mod hf_fill;
mod hf_rules;
pub mod hidden_size;
pub mod json_fields;
pub mod normalise;
pub mod phases;
pub mod provenance;
pub mod python;
pub mod schedule;
mod scheduler_defaults;
pub mod trace;
pub mod training_args;

use std::collections::BTreeMap;

use serde_json::Value;

pub use batch::Batch;
pub use env::{Environment, HiddenSize, HiddenSizeLookup, HiddenSizeSource};
pub use hf_fill::{Filled, MISMATCH_SEPARATOR, fill_auto};
pub use provenance::{Provenance, RuleInput};
pub use schedule::ResolvedSchedule;
pub use training_args::{Arg, ArgOrigin, TrainingArgs, WarmupSteps};

use crate::config::primitives::{AutoOr, PositiveInt};
use crate::config::{DsConfig, from_value};
use crate::diagnostics::{Code, Diagnostic};
use crate::validate::{ValidateOptions, validate_document};

/// A fully resolved config.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Every key DeepSpeed 0.19.8 reads, with its value: defaults materialised, no `"auto"` to
    /// fill (DeepSpeed's own default `data_types.keep_in_fp32_modules: "auto"` is a DeepSpeed
    /// value and stays), the batch triangle solved, deprecated spellings replaced.
    pub config: Value,
    /// The same, typed.
    pub typed: DsConfig,
    /// The file after the Hugging Face Trainer's pass: what DeepSpeed receives.
    pub filled: Value,
    /// Where each value of [`Self::config`] came from, by JSON pointer.
    pub provenance: BTreeMap<String, Provenance>,
    /// The batch sizes.
    pub batch: Batch,
    /// The learning-rate schedule, when the config names one of DeepSpeed's five schedulers.
    pub schedule: Option<ResolvedSchedule>,
    /// Warnings and notes (a resolution with errors is an `Err`).
    pub diagnostics: Vec<Diagnostic>,
}

/// Resolves `raw` in `env`. `Err` holds every diagnostic (errors and warnings) when any error
/// was found: a mismatch with a given training argument, an `"auto"` nothing fills, or anything
/// DeepSpeed would refuse.
pub fn resolve(raw: &Value, env: &Environment) -> Result<Resolved, Vec<Diagnostic>> {
    let filled = fill_auto(raw, env);
    let mut diagnostics = filled.diagnostics.clone();
    let mut recorded = filled.provenance.clone();
    let mut document = filled.document.clone();
    recorded.extend(defaults::drop_leftover_autos(&mut document));
    let (dropped, warnings) = defaults::drop_alias_autos(&mut document);
    recorded.extend(dropped);
    diagnostics.extend(warnings);
    diagnostics.extend(validate_document(
        &document,
        ValidateOptions {
            world_size: env.world_size,
        },
    ));
    let has_errors = |found: &[Diagnostic]| found.iter().any(Diagnostic::is_error);
    if has_errors(&diagnostics) {
        return Err(diagnostics);
    }
    let (batch, derived) = match batch::solve(&document, env.world_size) {
        Ok(solved) => solved,
        Err(error) => {
            diagnostics.push(error);
            return Err(diagnostics);
        }
    };
    recorded.extend(
        derived
            .into_iter()
            .map(|(p, origin)| (p.to_string(), origin)),
    );
    let mut typed = match from_value(&document) {
        Ok(typed) => typed,
        Err(message) => {
            let pointer = crate::config::refused_pointer(&document);
            diagnostics.push(Diagnostic::error(Code::WrongType, pointer, message));
            return Err(diagnostics);
        }
    };
    deprecated::migrate(&mut typed, raw);
    set_batch(&mut typed, batch);
    recorded.extend(defaults::overlap_comm(&mut typed));
    recorded.extend(defaults::optimizer(&mut typed));
    let schedule = match build_schedule(&document, env, &mut typed) {
        Ok((schedule, notes)) => {
            recorded.extend(notes);
            schedule
        }
        Err(mut errors) => {
            diagnostics.append(&mut errors);
            return Err(diagnostics);
        }
    };
    if let Some(built) = &schedule {
        diagnostics.extend(built.diagnostics.iter().cloned());
    }
    let config = match serde_json::to_value(&typed) {
        Ok(config) => config,
        Err(error) => {
            diagnostics.push(Diagnostic::error(Code::WrongType, "", error.to_string()));
            return Err(diagnostics);
        }
    };
    let provenance = trace::trace(&config, raw, &recorded);
    Ok(Resolved {
        config,
        typed,
        filled: filled.document,
        provenance,
        batch,
        schedule,
        diagnostics,
    })
}

/// Writes the solved batch sizes into the typed config.
fn set_batch(typed: &mut DsConfig, batch: Batch) {
    let positive = |value: u64| PositiveInt::new(value).map(AutoOr::Value);
    typed.train_batch_size = positive(batch.train_batch_size);
    typed.train_micro_batch_size_per_gpu = positive(batch.train_micro_batch_size_per_gpu);
    typed.gradient_accumulation_steps = positive(batch.gradient_accumulation_steps);
}

type BuiltSchedule = (Option<ResolvedSchedule>, Vec<(String, Provenance)>);

/// The schedule of one of DeepSpeed's five schedulers (none for a torch scheduler or none at
/// all), and its defaults written into `typed`.
fn build_schedule(
    document: &Value,
    env: &Environment,
    typed: &mut DsConfig,
) -> Result<BuiltSchedule, Vec<Diagnostic>> {
    let Some(scheduler) = typed.scheduler.as_mut() else {
        return Ok((None, Vec::new()));
    };
    if !scheduler
        .kind
        .as_deref()
        .is_some_and(schedule::is_deepspeed_scheduler)
    {
        return Ok((None, Vec::new()));
    }
    let built = schedule::schedule_of(document, env)?;
    let notes = scheduler_defaults::materialise(&mut scheduler.params, &built.schedule);
    Ok((Some(built), notes))
}

#[cfg(test)]
mod tests;
