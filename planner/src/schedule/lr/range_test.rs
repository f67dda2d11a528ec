//! `LRRangeTest`: the learning rate grows from `lr_range_test_min_lr` by
//! `lr_range_test_step_rate` every `lr_range_test_step_size` steps, continuously or in stairs.

use serde_json::{Map, Value};

use super::{OptimizerGroups, Start};
use crate::schedule::error::{ScheduleError, ScheduleWarning};
use crate::schedule::params::Params;

/// How the range test's interval advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    /// (t+1)/step_size.
    Continuous,
    /// floor((t+1)/step_size) (`lr_range_test_staircase: true`).
    Staircase,
}

/// The learning-rate range test.
#[derive(Debug, Clone, PartialEq)]
pub struct LrRangeTest {
    /// `lr_range_test_min_lr`, one per group (default 1e-3).
    pub min_lrs: Vec<f64>,
    /// `lr_range_test_step_size` (default 2000, a positive integer).
    pub step_size: u64,
    /// `lr_range_test_step_rate` (default 1.0).
    pub step_rate: f64,
    /// Continuous or staircase.
    pub interval: Interval,
    /// Where the schedule starts.
    pub start: Start,
}

impl LrRangeTest {
    /// DeepSpeed's `LRRangeTest(optimizer, **params)`.
    pub fn from_params(
        map: &Map<String, Value>,
        groups: &OptimizerGroups<'_>,
    ) -> Result<(Self, Vec<ScheduleWarning>), ScheduleError> {
        let mut params = Params::bind(
            map,
            "LRRangeTest",
            &[
                "lr_range_test_min_lr",
                "lr_range_test_step_size",
                "lr_range_test_step_rate",
                "lr_range_test_staircase",
                "last_batch_iteration",
            ],
            &[],
        )?;
        let n = groups.lrs.len();
        let min_lrs = match params.raw("lr_range_test_min_lr") {
            None => vec![1e-3; n],
            Some(value) => {
                params.per_group_value("lr_range_test_min_lr", value, n, |want, got| {
                    format!("expected {want} lr_range_test_min_lr, got {got}")
                })?
            }
        };
        let step_size = params.positive_int("lr_range_test_step_size", 2000, |repr| {
            format!("lr_range_test_step_size must be a positive integer, got {repr}")
        })?;
        let step_rate = params.number("lr_range_test_step_rate", 1.0)?;
        let interval = if params.truthy("lr_range_test_staircase", false) {
            Interval::Staircase
        } else {
            Interval::Continuous
        };
        let start = Start::parse(&mut params, groups)?;
        Ok((
            LrRangeTest {
                min_lrs,
                step_size: u64::try_from(step_size).unwrap_or(u64::MAX),
                step_rate,
                interval,
                start,
            },
            params.warnings,
        ))
    }

    /// `get_lr()` at `last_batch_iteration = t`: min_lr·(1 + rate·interval).
    pub fn lrs_at_iteration(&self, t: i64) -> Vec<f64> {
        let position = (t + 1) as f64 / self.step_size as f64;
        let interval = match self.interval {
            Interval::Continuous => position,
            Interval::Staircase => position.floor(),
        };
        let increase = 1.0 + self.step_rate * interval;
        self.min_lrs
            .iter()
            .map(|min_lr| min_lr * increase)
            .collect()
    }
}
