//! `WarmupLR` and `WarmupDecayLR`: absolute learning rates that rise from `warmup_min_lr` to
//! `warmup_max_lr` over `warmup_num_steps` (log or linear), then stay (WarmupLR) or fall
//! linearly back to `warmup_min_lr` at `total_num_steps` (WarmupDecayLR).

use serde_json::{Map, Value};

use super::{OptimizerGroups, Start};
use crate::schedule::error::{ScheduleError, ScheduleErrorKind, ScheduleWarning};
use crate::schedule::params::{Params, py_repr};

/// The rising function of a warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmupType {
    /// γ = ln(t+1)/ln(W) (DeepSpeed's default, `"log"`).
    Log,
    /// γ = t/W (`"linear"`).
    Linear,
}

impl WarmupType {
    /// The spelling DeepSpeed accepts.
    pub fn as_str(self) -> &'static str {
        match self {
            WarmupType::Log => "log",
            WarmupType::Linear => "linear",
        }
    }
}

/// The warmup shared by WarmupLR, WarmupDecayLR and (as ratios) WarmupCosineLR.
#[derive(Debug, Clone, PartialEq)]
pub struct Warmup {
    /// `warmup_num_steps` as given (a positive integer).
    pub num_steps: u64,
    /// W = max(2, `warmup_num_steps`): the length DeepSpeed really uses.
    pub effective_steps: u64,
    /// The rising function.
    pub warmup_type: WarmupType,
}

impl Warmup {
    /// γ(t) for 0 ≤ t < W, with DeepSpeed's operation order; `None` once warmup is over.
    pub fn gamma(&self, t: i64) -> Option<f64> {
        let w = self.effective_steps as f64;
        if (t as f64) >= w {
            return None;
        }
        Some(match self.warmup_type {
            // `self.inverse_log_warm_up * math.log(t + 1)`, the inverse taken once.
            WarmupType::Log => (1.0 / w.ln()) * ((t + 1) as f64).ln(),
            WarmupType::Linear => t as f64 / w,
        })
    }
}

/// Constant-after-warmup schedule (`WarmupLR`).
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupLr {
    /// `warmup_min_lr`, one per parameter group.
    pub min_lrs: Vec<f64>,
    /// `warmup_max_lr`, one per group (the optimizer's own lr when absent or null).
    pub max_lrs: Vec<f64>,
    /// The warmup.
    pub warmup: Warmup,
    /// Where the schedule starts.
    pub start: Start,
}

/// Warmup then linear decay to `warmup_min_lr` (`WarmupDecayLR`).
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupDecayLr {
    /// The warmup part, as WarmupLR.
    pub base: WarmupLr,
    /// `total_num_steps`.
    pub total_num_steps: f64,
}

const WARMUP_KEYS: [&str; 5] = [
    "warmup_min_lr",
    "warmup_max_lr",
    "warmup_num_steps",
    "warmup_type",
    "last_batch_iteration",
];

impl WarmupLr {
    /// DeepSpeed's `WarmupLR(optimizer, **params)`.
    pub fn from_params(
        map: &Map<String, Value>,
        groups: &OptimizerGroups<'_>,
    ) -> Result<(Self, Vec<ScheduleWarning>), ScheduleError> {
        let mut params = Params::bind(map, "WarmupLR", &WARMUP_KEYS, &[])?;
        // WarmupLR's own default for warmup_max_lr is None: the optimizer's lr.
        let schedule = Self::parse(&mut params, groups, None)?;
        Ok((schedule, params.warnings))
    }

    /// The body of `WarmupLR.__init__`, `default_max_lr = None` meaning the optimizer's lr.
    fn parse(
        params: &mut Params<'_>,
        groups: &OptimizerGroups<'_>,
        default_max_lr: Option<f64>,
    ) -> Result<Self, ScheduleError> {
        let warmup_num_steps = parse_warmup_num_steps(params)?;
        let start = Start::parse(params, groups)?;
        let n = groups.lrs.len();
        let mismatch = |name: &'static str| {
            move |want: usize, got: usize| format!("expected {want} value for {name}, got {got}")
        };
        let min_lrs = match params.raw("warmup_min_lr") {
            None => vec![0.0; n],
            Some(value) => params.per_group_value("warmup_min_lr", value, n, mismatch("min_lr"))?,
        };
        let max_lrs = match (params.raw("warmup_max_lr"), default_max_lr) {
            (None | Some(Value::Null), None) | (Some(Value::Null), Some(_)) => groups.lrs.to_vec(),
            (None, Some(default)) => vec![default; n],
            (Some(value), _) => {
                params.per_group_value("warmup_max_lr", value, n, mismatch("max_lr"))?
            }
        };
        let warmup_type = parse_warmup_type(params)?;
        Ok(WarmupLr {
            min_lrs,
            max_lrs,
            warmup: Warmup {
                num_steps: warmup_num_steps,
                effective_steps: warmup_num_steps.max(2),
                warmup_type,
            },
            start,
        })
    }

    /// `get_lr()` at `last_batch_iteration = t` with DeepSpeed's γ.
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        self.lrs_with_gamma(t, || 1.0)
    }

    /// `min + (max - min)·γ`, γ from the warmup or, after it, from `after_warmup`.
    fn lrs_with_gamma(&self, t: i64, after_warmup: impl Fn() -> f64) -> Vec<f64> {
        if t < 0 {
            return self.min_lrs.clone();
        }
        let gamma = self.warmup.gamma(t).unwrap_or_else(after_warmup);
        self.min_lrs
            .iter()
            .zip(&self.max_lrs)
            .map(|(min, max)| min + (max - min) * gamma)
            .collect()
    }
}

impl WarmupDecayLr {
    /// DeepSpeed's `WarmupDecayLR(optimizer, **params)`.
    pub fn from_params(
        map: &Map<String, Value>,
        groups: &OptimizerGroups<'_>,
    ) -> Result<(Self, Vec<ScheduleWarning>), ScheduleError> {
        let mut keys = WARMUP_KEYS.to_vec();
        keys.push("total_num_steps");
        let mut params = Params::bind(map, "WarmupDecayLR", &keys, &["total_num_steps"])?;
        // WarmupDecayLR passes its own default, 0.001, to WarmupLR.
        let base = WarmupLr::parse(&mut params, groups, Some(0.001))?;
        let total_num_steps = parse_total_num_steps(&mut params, "WarmupDecayLR")?;
        warn_if_total_below_warmup(&mut params, total_num_steps, &base.warmup);
        Ok((
            WarmupDecayLr {
                base,
                total_num_steps,
            },
            params.warnings,
        ))
    }

    /// `get_lr()` at `last_batch_iteration = t`: after warmup
    /// γ = max(0, (T − t)/max(1, T − W)).
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        let w = self.base.warmup.effective_steps as f64;
        let total = self.total_num_steps;
        self.base.lrs_with_gamma(t, || {
            let gamma = (total - t as f64) / max_py(1.0, total - w);
            max_py(0.0, gamma)
        })
    }
}

/// Python's `max(a, b)`: `a` unless `b > a` (so NaN in `b` yields `a`).
pub(crate) fn max_py(a: f64, b: f64) -> f64 {
    if b > a { b } else { a }
}

/// `warmup_num_steps`: DeepSpeed 0.19.8 refuses non-integers and values ≤ 0 before anything else.
pub(crate) fn parse_warmup_num_steps(params: &mut Params<'_>) -> Result<u64, ScheduleError> {
    let steps = params.positive_int("warmup_num_steps", 1000, |repr| {
        format!("warmup_num_steps must be a positive integer, got {repr}")
    })?;
    u64::try_from(steps).map_err(|_| {
        ScheduleError::param(
            ScheduleErrorKind::InvalidValue,
            "warmup_num_steps",
            format!("warmup_num_steps {steps} is too large"),
        )
    })
}

/// `warmup_type`: `"log"` or `"linear"`; anything else is logged and replaced by log.
pub(crate) fn parse_warmup_type(params: &mut Params<'_>) -> Result<WarmupType, ScheduleError> {
    let Some(value) = params.raw("warmup_type") else {
        return Ok(WarmupType::Log);
    };
    match value {
        Value::String(s) if s == "log" => Ok(WarmupType::Log),
        Value::String(s) if s == "linear" => Ok(WarmupType::Linear),
        Value::Array(_) | Value::Object(_) => Err(ScheduleError::param(
            ScheduleErrorKind::WrongType,
            "warmup_type",
            format!(
                "unhashable type: '{}' (warmup_type)",
                if value.is_array() { "list" } else { "dict" }
            ),
        )),
        other => {
            let shown = match other {
                Value::String(s) => s.clone(),
                v => py_repr(v),
            };
            params.warn(
                "warmup_type",
                format!(
                    "Using unknown warmup_type: {shown}. The increasing function is set to default (log)"
                ),
            );
            Ok(WarmupType::Log)
        }
    }
}

/// `total_num_steps`: required, compared with W at construction (so it must be a number).
pub(crate) fn parse_total_num_steps(
    params: &mut Params<'_>,
    scheduler: &str,
) -> Result<f64, ScheduleError> {
    let value = params
        .raw("total_num_steps")
        .cloned()
        .unwrap_or(Value::Null);
    params
        .number_value("total_num_steps", &value)
        .map(|n| n.as_f64())
        .map_err(|mut error| {
            error.message = format!(
                "{scheduler}: total_num_steps must be a number, got {} ('<' not supported against an int)",
                py_repr(&value)
            );
            error
        })
}

/// DeepSpeed's `total_num_steps {T} is less than warmup_num_steps {n}` warning.
pub(crate) fn warn_if_total_below_warmup(params: &mut Params<'_>, total: f64, warmup: &Warmup) {
    if total < warmup.effective_steps as f64 {
        let shown = params
            .raw("total_num_steps")
            .map(py_repr)
            .unwrap_or_else(|| total.to_string());
        params.warn(
            "total_num_steps",
            format!(
                "total_num_steps {shown} is less than warmup_num_steps {}",
                warmup.num_steps
            ),
        );
    }
}
