//! `WarmupCosineLR`: learning rates relative to each group's base lr, warmed up from
//! `warmup_min_ratio` to 1, then decayed on a half cosine to `cos_min_ratio` at
//! `total_num_steps`, where they stay (0.19.8 clamps the cosine progress at 1).

use serde_json::{Map, Value};

use super::warmup::{
    Warmup, max_py, parse_total_num_steps, parse_warmup_num_steps, parse_warmup_type,
    warn_if_total_below_warmup,
};
use super::{OptimizerGroups, Start};
use crate::schedule::error::{ScheduleError, ScheduleWarning};
use crate::schedule::params::Params;

/// Warmup then cosine decay, as ratios of the optimizer's base learning rates.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupCosineLr {
    /// The base learning rate of each group (the optimizer's `lr` at construction).
    pub base_lrs: Vec<f64>,
    /// `total_num_steps`.
    pub total_num_steps: f64,
    /// `warmup_min_ratio` (default 0).
    pub warmup_min_ratio: f64,
    /// `cos_min_ratio` (default 1e-4).
    pub cos_min_ratio: f64,
    /// The warmup.
    pub warmup: Warmup,
    /// Where the schedule starts.
    pub start: Start,
}

impl WarmupCosineLr {
    /// DeepSpeed's `WarmupCosineLR(optimizer, **params)`.
    pub fn from_params(
        map: &Map<String, Value>,
        groups: &OptimizerGroups<'_>,
    ) -> Result<(Self, Vec<ScheduleWarning>), ScheduleError> {
        let mut params = Params::bind(
            map,
            "WarmupCosineLR",
            &[
                "total_num_steps",
                "warmup_min_ratio",
                "warmup_num_steps",
                "cos_min_ratio",
                "warmup_type",
                "last_batch_iteration",
            ],
            &["total_num_steps"],
        )?;
        let num_steps = parse_warmup_num_steps(&mut params)?;
        let start = Start::parse(&mut params, groups)?;
        // Both ratios are only used from the first step on; DeepSpeed would fail there.
        let cos_min_ratio = ratio(&mut params, "cos_min_ratio", 0.0001)?;
        let warmup_type = parse_warmup_type(&mut params)?;
        let warmup_min_ratio = ratio(&mut params, "warmup_min_ratio", 0.0)?;
        let warmup = Warmup {
            num_steps,
            effective_steps: num_steps.max(2),
            warmup_type,
        };
        let total_num_steps = parse_total_num_steps(&mut params, "WarmupCosineLR")?;
        warn_if_total_below_warmup(&mut params, total_num_steps, &warmup);
        Ok((
            WarmupCosineLr {
                base_lrs: groups.lrs.to_vec(),
                total_num_steps,
                warmup_min_ratio,
                cos_min_ratio,
                warmup,
                start,
            },
            params.warnings,
        ))
    }

    /// `get_lr_ratio()` at `last_batch_iteration = t ≥ 0`, in DeepSpeed's operation order.
    pub fn ratio_at_iteration(&self, t: i64) -> f64 {
        if let Some(gamma) = self.warmup.gamma(t) {
            let ratio_delta = 1.0 - self.warmup_min_ratio;
            return self.warmup_min_ratio + gamma * ratio_delta;
        }
        let w = self.warmup.effective_steps as f64;
        let real_last_step = t as f64 - w + 1.0;
        let real_total_steps = max_py(1.0, self.total_num_steps - w);
        let progress = min_py(1.0, real_last_step / real_total_steps);
        let ratio_delta = 1.0 - self.cos_min_ratio;
        let cosine = (1.0 + (std::f64::consts::PI * progress).cos()) / 2.0;
        max_py(0.0, self.cos_min_ratio + ratio_delta * cosine)
    }

    /// `get_lr()` at `last_batch_iteration = t`: every group 0 before the first step (all
    /// groups, in 0.19.8), then base_lr × ratio.
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        if t < 0 {
            return vec![0.0; self.base_lrs.len()];
        }
        let ratio = self.ratio_at_iteration(t);
        self.base_lrs.iter().map(|lr| lr * ratio).collect()
    }
}

/// Python's `min(a, b)`: `a` unless `b < a`.
fn min_py(a: f64, b: f64) -> f64 {
    if b < a { b } else { a }
}

/// A scalar ratio (lists are not supported by WarmupCosineLR's arithmetic).
fn ratio(params: &mut Params<'_>, name: &str, default: f64) -> Result<f64, ScheduleError> {
    params.number(name, default).map_err(|mut error| {
        error.message = format!(
            "{} (DeepSpeed accepts it at construction and fails at the first scheduler step)",
            error.message
        );
        error
    })
}
