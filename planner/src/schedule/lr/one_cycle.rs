//! `OneCycle`: one triangular cycle of the learning rate between `cycle_min_lr` and
//! `cycle_max_lr` (and of Adam's β₁ inversely, between `cycle_max_mom` and `cycle_min_mom`),
//! optionally in stairs, followed by an optional decay.

use serde_json::{Map, Value};

use super::{BetasSupport, OptimizerGroups, Start};
use crate::schedule::error::{ScheduleError, ScheduleErrorKind, ScheduleWarning};
use crate::schedule::params::{Params, py_float_repr};

/// β₂ while OneCycle cycles momentum: DeepSpeed writes `betas = (momentum, 0.99)`.
pub const ONE_CYCLE_BETA2: f64 = 0.99;

/// The cycled momentum (β₁) of a OneCycle schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct CycleMomentum {
    /// `cycle_min_mom`, one per group (default 0.8): the β₁ at the peak lr and at construction.
    pub min_moms: Vec<f64>,
    /// `cycle_max_mom`, one per group (default 0.9).
    pub max_moms: Vec<f64>,
    /// `decay_mom_rate` (default 0): after the cycle β₁ *grows* by this rate.
    pub decay_mom_rate: f64,
}

/// The OneCycle policy.
#[derive(Debug, Clone, PartialEq)]
pub struct OneCycle {
    /// `cycle_min_lr`, one per group (required).
    pub min_lrs: Vec<f64>,
    /// `cycle_max_lr`, one per group (required).
    pub max_lrs: Vec<f64>,
    /// `decay_lr_rate` (default 0).
    pub decay_lr_rate: f64,
    /// `cycle_first_step_size` as a float (default 2000; must be > 0).
    pub first_step_size: f64,
    /// `cycle_second_step_size` as a float (default: the first; must be ≥ 0).
    pub second_step_size: f64,
    /// `cycle_first_stair_count` (default 0 = continuous).
    pub first_stair_count: f64,
    /// `cycle_second_stair_count` (default: the first's).
    pub second_stair_count: f64,
    /// `decay_step_size` (default 0 = no decay).
    pub decay_step_size: f64,
    /// β₁ cycling, when `cycle_momentum` is on and the optimizer has betas.
    pub momentum: Option<CycleMomentum>,
    /// Where the schedule starts.
    pub start: Start,
}

impl OneCycle {
    /// DeepSpeed's `OneCycle(optimizer, **params)`.
    pub fn from_params(
        map: &Map<String, Value>,
        groups: &OptimizerGroups<'_>,
    ) -> Result<(Self, Vec<ScheduleWarning>), ScheduleError> {
        let mut params = Params::bind(
            map,
            "OneCycle",
            &[
                "cycle_min_lr",
                "cycle_max_lr",
                "decay_lr_rate",
                "cycle_first_step_size",
                "cycle_second_step_size",
                "cycle_first_stair_count",
                "cycle_second_stair_count",
                "decay_step_size",
                "cycle_momentum",
                "cycle_min_mom",
                "cycle_max_mom",
                "decay_mom_rate",
                "last_batch_iteration",
            ],
            &["cycle_min_lr", "cycle_max_lr"],
        )?;
        let n = groups.lrs.len();

        // _initialize_cycle
        let first_step_size = match params.raw("cycle_first_step_size") {
            None => 2000.0,
            Some(value) => params.float_conversion("cycle_first_step_size", value)?,
        };
        let second_step_size = match params.raw("cycle_second_step_size") {
            None | Some(Value::Null) => first_step_size,
            Some(value) => params.float_conversion("cycle_second_step_size", value)?,
        };
        if first_step_size <= 0.0 {
            return Err(ScheduleError::param(
                ScheduleErrorKind::InvalidValue,
                "cycle_first_step_size",
                format!(
                    "cycle_first_step_size must be positive, got {}",
                    py_float_repr(first_step_size)
                ),
            ));
        }
        if second_step_size < 0.0 {
            return Err(ScheduleError::param(
                ScheduleErrorKind::InvalidValue,
                "cycle_second_step_size",
                format!(
                    "cycle_second_step_size must be non-negative, got {}",
                    py_float_repr(second_step_size)
                ),
            ));
        }
        let first_stair_count = params.number("cycle_first_stair_count", 0.0)?;
        let second_stair_count = match params.raw("cycle_second_stair_count") {
            None | Some(Value::Null) => first_stair_count,
            Some(value) => params
                .number_value("cycle_second_stair_count", value)?
                .as_f64(),
        };
        let decay_step_size = params.number("decay_step_size", 0.0)?;

        // _initialize_lr
        let mismatch = |name: &'static str| {
            move |want: usize, got: usize| format!("expected {want} value for {name}, got {got}")
        };
        let min_value = params.raw("cycle_min_lr").cloned().unwrap_or(Value::Null);
        let min_lrs =
            params.per_group_value("cycle_min_lr", &min_value, n, mismatch("cycle_min_lr"))?;
        let max_value = params.raw("cycle_max_lr").cloned().unwrap_or(Value::Null);
        let max_lrs =
            params.per_group_value("cycle_max_lr", &max_value, n, mismatch("cycle_max_lr"))?;
        let decay_lr_rate = params.number("decay_lr_rate", 0.0)?;

        // _initialize_momentum (nothing is read when cycling is off or impossible)
        let momentum = if !params.truthy("cycle_momentum", true) {
            None
        } else if groups.betas == BetasSupport::NoBetas {
            params.warn(
                "cycle_momentum",
                "cycle_momentum is disabled because the optimizer does not support momentum, \
                 no betas attribute in defaults",
            );
            None
        } else {
            let decay_mom_rate = params.number("decay_mom_rate", 0.0)?;
            let min_moms = match params.raw("cycle_min_mom") {
                None => vec![0.8; n],
                Some(value) => {
                    params.per_group_value("cycle_min_mom", value, n, mismatch("cycle_min_mom"))?
                }
            };
            let max_moms = match params.raw("cycle_max_mom") {
                None => vec![0.9; n],
                Some(value) => {
                    params.per_group_value("cycle_max_mom", value, n, mismatch("cycle_max_mom"))?
                }
            };
            Some(CycleMomentum {
                min_moms,
                max_moms,
                decay_mom_rate,
            })
        };
        let start = Start::parse(&mut params, groups)?;
        Ok((
            OneCycle {
                min_lrs,
                max_lrs,
                decay_lr_rate,
                first_step_size,
                second_step_size,
                first_stair_count,
                second_stair_count,
                decay_step_size,
                momentum,
                start,
            },
            params.warnings,
        ))
    }

    /// The cycle length, first + second.
    pub fn total_size(&self) -> f64 {
        self.first_step_size + self.second_step_size
    }

    /// `_get_scale_factor()` at `last_batch_iteration = t`: the position in the cycle, 0 at the
    /// bottom, 1 at the peak, in stairs when a stair count is set.
    pub fn scale_factor(&self, t: i64) -> f64 {
        let total = self.total_size();
        let step_ratio = self.first_step_size / total;
        let batch_iteration = (t + 1) as f64;
        let cycle = (1.0 + batch_iteration / total).floor();
        let x = 1.0 + batch_iteration / total - cycle;
        let (continuous, stair_count) = if x <= step_ratio {
            (x / step_ratio, self.first_stair_count)
        } else {
            ((x - 1.0) / (step_ratio - 1.0), self.second_stair_count)
        };
        if stair_count > 0.0 {
            let cycle_iteration = py_mod(batch_iteration, total);
            let stair_position = if cycle_iteration <= self.first_step_size {
                cycle_iteration * stair_count / self.first_step_size
            } else {
                (total - cycle_iteration) * stair_count / self.second_step_size
            };
            return stair_position.floor() / stair_count;
        }
        continuous
    }

    /// Whether `t` is still inside the cycle.
    fn in_cycle(&self, t: i64) -> bool {
        (t as f64) < self.total_size()
    }

    /// Steps since the cycle ended, `t - total + 1`, divided by `decay_step_size`.
    fn decay_interval(&self, t: i64) -> f64 {
        (t as f64 - self.total_size() + 1.0) / self.decay_step_size
    }

    /// `get_lr()` at `last_batch_iteration = t`.
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        if self.in_cycle(t) {
            let scale = self.scale_factor(t);
            return self
                .min_lrs
                .iter()
                .zip(&self.max_lrs)
                .map(|(min, max)| min + (max - min) * scale)
                .collect();
        }
        if self.decay_step_size == 0.0 || self.decay_lr_rate == 0.0 {
            return self.min_lrs.clone();
        }
        let factor = 1.0 + self.decay_lr_rate * self.decay_interval(t);
        self.min_lrs.iter().map(|min| min / factor).collect()
    }

    /// `get_mom()` at `last_batch_iteration = t` as `(β₁, 0.99)` per group; `None` when
    /// momentum is not cycled.
    pub fn momenta_at_iteration(&self, t: i64) -> Option<Vec<(f64, f64)>> {
        let momentum = self.momentum.as_ref()?;
        let beta1: Vec<f64> = if self.in_cycle(t) {
            let scale = self.scale_factor(t);
            momentum
                .min_moms
                .iter()
                .zip(&momentum.max_moms)
                .map(|(min, max)| max - (max - min) * scale)
                .collect()
        } else if self.decay_step_size == 0.0 || momentum.decay_mom_rate == 0.0 {
            momentum.max_moms.clone()
        } else {
            let factor = 1.0 + momentum.decay_mom_rate * self.decay_interval(t);
            momentum.max_moms.iter().map(|max| max * factor).collect()
        };
        Some(beta1.into_iter().map(|b| (b, ONE_CYCLE_BETA2)).collect())
    }

    /// The betas written at construction: `(cycle_min_mom, 0.99)`.
    pub fn initial_momenta(&self) -> Option<Vec<(f64, f64)>> {
        let momentum = self.momentum.as_ref()?;
        Some(
            momentum
                .min_moms
                .iter()
                .map(|b| (*b, ONE_CYCLE_BETA2))
                .collect(),
        )
    }
}

/// Python's float `%`: the result takes the divisor's sign.
fn py_mod(a: f64, b: f64) -> f64 {
    let r = a % b;
    if r != 0.0 && ((b < 0.0) != (r < 0.0)) {
        r + b
    } else {
        r
    }
}
