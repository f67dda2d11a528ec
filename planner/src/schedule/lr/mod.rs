//! DeepSpeed 0.19.8's learning-rate schedulers (`deepspeed/runtime/lr_schedules.py`) as values.
//!
//! [`LrSchedule::from_params`] builds a schedule from `scheduler.type` and `scheduler.params`
//! with DeepSpeed's defaults, checks and warnings; [`LrSchedule::lr_at`] gives the learning rate
//! a training step uses.
//!
//! **Step convention.** DeepSpeed's engine calls `scheduler.step()` after every optimizer step
//! (not after overflow-skipped ones). Training step 0 therefore runs with the value the
//! constructor wrote (`last_batch_iteration = -1`), and training step `s > 0` with the value
//! after `s` calls to `step()` (`last_batch_iteration = s - 1`). `lr_at(step)` follows that
//! convention; [`LrSchedule::lrs_at_iteration`] takes DeepSpeed's `last_batch_iteration` itself.

mod cosine;
mod one_cycle;
mod range_test;
mod warmup;

pub use cosine::WarmupCosineLr;
pub use one_cycle::{CycleMomentum, ONE_CYCLE_BETA2, OneCycle};
pub use range_test::{Interval, LrRangeTest};
pub use warmup::{Warmup, WarmupDecayLr, WarmupLr, WarmupType};

use serde_json::{Map, Value};

use super::error::{ScheduleError, ScheduleErrorKind, ScheduleWarning};
use super::params::{Params, PyNum, py_repr};

/// The scheduler names DeepSpeed's own module defines.
pub const DEEPSPEED_SCHEDULERS: [&str; 5] = [
    "LRRangeTest",
    "OneCycle",
    "WarmupLR",
    "WarmupDecayLR",
    "WarmupCosineLR",
];

/// `torch.optim.lr_scheduler` classes: DeepSpeed falls back to them when the name is not its own.
pub const TORCH_SCHEDULERS: [&str; 16] = [
    "LRScheduler",
    "LambdaLR",
    "MultiplicativeLR",
    "StepLR",
    "MultiStepLR",
    "ConstantLR",
    "LinearLR",
    "ExponentialLR",
    "SequentialLR",
    "CosineAnnealingLR",
    "ChainedScheduler",
    "ReduceLROnPlateau",
    "CyclicLR",
    "CosineAnnealingWarmRestarts",
    "OneCycleLR",
    "PolynomialLR",
];

/// Whether the optimizer keeps Adam-style `betas` (OneCycle cycles β₁ only then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BetasSupport {
    /// Adam, AdamW, Lamb, …: `betas` in the optimizer's defaults.
    Betas,
    /// SGD and the like: OneCycle disables momentum cycling with a warning.
    NoBetas,
}

/// What a scheduler needs to know about the optimizer it wraps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OptimizerGroups<'a> {
    /// The `lr` of each parameter group at construction (at least one).
    pub lrs: &'a [f64],
    /// Whether the optimizer has `betas`.
    pub betas: BetasSupport,
}

/// Where a schedule starts: DeepSpeed's `last_batch_iteration` argument (-1 = from scratch).
#[derive(Debug, Clone, PartialEq)]
pub struct Start {
    /// -1 unless resuming; any other value leaves the optimizer's lr untouched at construction.
    pub last_batch_iteration: i64,
    /// The optimizer's lrs, which step 0 keeps when `last_batch_iteration != -1`.
    pub optimizer_lrs: Vec<f64>,
}

impl Start {
    /// Reads `last_batch_iteration` (an integer, default -1).
    fn parse(params: &mut Params<'_>, groups: &OptimizerGroups<'_>) -> Result<Self, ScheduleError> {
        let last_batch_iteration = match params.raw("last_batch_iteration") {
            None => -1,
            Some(value) => {
                let number = params.number_value("last_batch_iteration", value)?;
                let as_int = match number {
                    PyNum::Int(i) => i64::try_from(i).ok(),
                    PyNum::Float(x) if x.fract() == 0.0 && x.abs() < 9.0e15 => Some(x as i64),
                    PyNum::Float(_) => None,
                };
                as_int.ok_or_else(|| {
                    ScheduleError::param(
                        ScheduleErrorKind::WrongType,
                        "last_batch_iteration",
                        format!(
                            "last_batch_iteration must be an integer step index, got {}",
                            py_repr(value)
                        ),
                    )
                })?
            }
        };
        Ok(Start {
            last_batch_iteration,
            optimizer_lrs: groups.lrs.to_vec(),
        })
    }

    /// DeepSpeed's `last_batch_iteration` while training step `step ≥ 1` runs.
    fn iteration_of(&self, step: u64) -> i64 {
        // After `step` calls to `step()` DeepSpeed's counter is `last_batch_iteration + step`.
        self.last_batch_iteration
            .saturating_add(i64::try_from(step).unwrap_or(i64::MAX))
    }
}

/// One of DeepSpeed's five schedulers, with typed parameters.
#[derive(Debug, Clone, PartialEq)]
pub enum LrSchedule {
    /// `LRRangeTest`.
    LrRangeTest(LrRangeTest),
    /// `OneCycle`.
    OneCycle(OneCycle),
    /// `WarmupLR`.
    WarmupLr(WarmupLr),
    /// `WarmupDecayLR`.
    WarmupDecayLr(WarmupDecayLr),
    /// `WarmupCosineLR`.
    WarmupCosineLr(WarmupCosineLr),
}

impl LrSchedule {
    /// Builds `scheduler.type` from `scheduler.params` for a one-group optimizer with betas
    /// (Adam/AdamW) whose `lr` is `base_lr`. Returns the schedule and what DeepSpeed would warn.
    pub fn from_params(
        type_name: &str,
        params: &Map<String, Value>,
        base_lr: f64,
    ) -> Result<(LrSchedule, Vec<ScheduleWarning>), ScheduleError> {
        Self::from_params_for(
            type_name,
            params,
            OptimizerGroups {
                lrs: &[base_lr],
                betas: BetasSupport::Betas,
            },
        )
    }

    /// [`Self::from_params`] for any optimizer: several parameter groups, with or without betas.
    pub fn from_params_for(
        type_name: &str,
        params: &Map<String, Value>,
        groups: OptimizerGroups<'_>,
    ) -> Result<(LrSchedule, Vec<ScheduleWarning>), ScheduleError> {
        if groups.lrs.is_empty() {
            return Err(ScheduleError {
                kind: ScheduleErrorKind::InvalidValue,
                param: None,
                message: "the optimizer has no parameter groups".to_string(),
                suggestion: None,
            });
        }
        match type_name {
            "LRRangeTest" => LrRangeTest::from_params(params, &groups)
                .map(|(s, w)| (LrSchedule::LrRangeTest(s), w)),
            "OneCycle" => {
                OneCycle::from_params(params, &groups).map(|(s, w)| (LrSchedule::OneCycle(s), w))
            }
            "WarmupLR" => {
                WarmupLr::from_params(params, &groups).map(|(s, w)| (LrSchedule::WarmupLr(s), w))
            }
            "WarmupDecayLR" => WarmupDecayLr::from_params(params, &groups)
                .map(|(s, w)| (LrSchedule::WarmupDecayLr(s), w)),
            "WarmupCosineLR" => WarmupCosineLr::from_params(params, &groups)
                .map(|(s, w)| (LrSchedule::WarmupCosineLr(s), w)),
            other if TORCH_SCHEDULERS.contains(&other) => Err(ScheduleError {
                kind: ScheduleErrorKind::TorchScheduler,
                param: None,
                message: format!(
                    "`{other}` is torch.optim.lr_scheduler.{other}: DeepSpeed builds it, dsplan does \
                     not model its schedule"
                ),
                suggestion: None,
            }),
            other => Err(ScheduleError {
                kind: ScheduleErrorKind::UnknownScheduler,
                param: None,
                message: format!("DeepSpeed does not recognize LR scheduler {other}"),
                suggestion: nearest_scheduler(other),
            }),
        }
    }

    /// DeepSpeed's class name.
    pub fn type_name(&self) -> &'static str {
        match self {
            LrSchedule::LrRangeTest(_) => "LRRangeTest",
            LrSchedule::OneCycle(_) => "OneCycle",
            LrSchedule::WarmupLr(_) => "WarmupLR",
            LrSchedule::WarmupDecayLr(_) => "WarmupDecayLR",
            LrSchedule::WarmupCosineLr(_) => "WarmupCosineLR",
        }
    }

    /// Where the schedule starts.
    pub fn start(&self) -> &Start {
        match self {
            LrSchedule::LrRangeTest(s) => &s.start,
            LrSchedule::OneCycle(s) => &s.start,
            LrSchedule::WarmupLr(s) => &s.start,
            LrSchedule::WarmupDecayLr(s) => &s.base.start,
            LrSchedule::WarmupCosineLr(s) => &s.start,
        }
    }

    /// DeepSpeed's `get_lr()` with `last_batch_iteration = t` (t = -1 is the constructor's value).
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        match self {
            LrSchedule::LrRangeTest(s) => s.lrs_at_iteration(t),
            LrSchedule::OneCycle(s) => s.lrs_at_iteration(t),
            LrSchedule::WarmupLr(s) => s.lrs_at_iteration(t),
            LrSchedule::WarmupDecayLr(s) => s.lrs_at_iteration(t),
            LrSchedule::WarmupCosineLr(s) => s.lrs_at_iteration(t),
        }
    }

    /// The learning rate of every parameter group during training step `step` (0-based).
    pub fn lrs_at(&self, step: u64) -> Vec<f64> {
        let start = self.start();
        if step == 0 {
            if start.last_batch_iteration == -1 {
                return self.lrs_at_iteration(-1);
            }
            return start.optimizer_lrs.clone();
        }
        self.lrs_at_iteration(start.iteration_of(step))
    }

    /// The learning rate of the first parameter group during training step `step`.
    pub fn lr_at(&self, step: u64) -> f64 {
        self.lrs_at(step).first().copied().unwrap_or(f64::NAN)
    }

    /// OneCycle's `(β₁, β₂)` of every group during training step `step` (β₂ is forced to 0.99);
    /// `None` for the other schedulers, when momentum is not cycled, and at step 0 when
    /// resuming (the optimizer's own betas are kept then).
    pub fn momenta_at(&self, step: u64) -> Option<Vec<(f64, f64)>> {
        let LrSchedule::OneCycle(schedule) = self else {
            return None;
        };
        if step == 0 {
            if schedule.start.last_batch_iteration == -1 {
                return schedule.initial_momenta();
            }
            return None;
        }
        schedule.momenta_at_iteration(schedule.start.iteration_of(step))
    }

    /// [`Self::momenta_at`] of the first parameter group.
    pub fn momentum_at(&self, step: u64) -> Option<(f64, f64)> {
        self.momenta_at(step)?.first().copied()
    }
}

/// The scheduler name closest to a misspelt one (DeepSpeed's lookup is case-sensitive).
fn nearest_scheduler(name: &str) -> Option<String> {
    let lower = name.to_lowercase();
    DEEPSPEED_SCHEDULERS
        .iter()
        .chain(TORCH_SCHEDULERS.iter())
        .map(|candidate| {
            (
                strsim::jaro_winkler(&lower, &candidate.to_lowercase()),
                *candidate,
            )
        })
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, candidate)| candidate.to_string())
}

#[cfg(test)]
mod tests;
