//! The scheduler's constructor defaults, written into `scheduler.params` from the schedule
//! DeepSpeed would build, so that the resolved config states every value the schedule uses
//! (the warm-up type, its length, the learning-rate bounds, OneCycle's momentum, ...).
//!
//! Only absent parameters are filled; what the file gives stays as written.

use super::provenance::Provenance;
use crate::config::primitives::{AutoOr, Integer, NonNegativeInt, PositiveInt};
use crate::config::{LearningRate, SchedulerParams, WarmupType};
use crate::schedule::lr::{Interval, Start, Warmup};
use crate::schedule::{LrSchedule, lr};

/// Fills the absent parameters of `params` with what `schedule` uses; the notes of the values
/// that are not plain constants.
pub(crate) fn materialise(
    params: &mut SchedulerParams,
    schedule: &LrSchedule,
) -> Vec<(String, Provenance)> {
    let mut notes = Vec::new();
    let mut note = |name: &str, text: &str| {
        notes.push((
            format!("/scheduler/params/{name}"),
            Provenance::DeepSpeedDefault {
                note: Some(text.to_string()),
            },
        ));
    };
    match schedule {
        LrSchedule::WarmupLr(s) => {
            if params.warmup_max_lr.is_none() {
                note("warmup_max_lr", "WarmupLR warms up to the optimizer's lr");
            }
            warmup_bounds(params, &s.min_lrs, &s.max_lrs, &s.warmup);
        }
        LrSchedule::WarmupDecayLr(s) => {
            warmup_bounds(params, &s.base.min_lrs, &s.base.max_lrs, &s.base.warmup);
        }
        LrSchedule::WarmupCosineLr(s) => {
            params.warmup_min_ratio.get_or_insert(s.warmup_min_ratio);
            params.cos_min_ratio.get_or_insert(s.cos_min_ratio);
            warmup_shape(params, &s.warmup);
        }
        LrSchedule::OneCycle(s) => {
            params.decay_lr_rate.get_or_insert(s.decay_lr_rate);
            fill_count(&mut params.cycle_first_step_size, s.first_step_size);
            if params.cycle_second_step_size.is_none() {
                note(
                    "cycle_second_step_size",
                    "the same as cycle_first_step_size",
                );
            }
            fill_count(&mut params.cycle_second_step_size, s.second_step_size);
            fill_count(&mut params.cycle_first_stair_count, s.first_stair_count);
            fill_count(&mut params.decay_step_size, s.decay_step_size);
            if params.cycle_momentum.is_none() && s.momentum.is_none() {
                note(
                    "cycle_momentum",
                    "true, but DeepSpeed turns cycling off: the optimizer has no betas",
                );
            }
            params.cycle_momentum.get_or_insert(true);
            let (min_mom, max_mom, decay_mom_rate) = match &s.momentum {
                Some(m) => (m.min_moms[0], m.max_moms[0], m.decay_mom_rate),
                None => (0.8, 0.9, 0.0),
            };
            params.cycle_min_mom.get_or_insert(min_mom);
            params.cycle_max_mom.get_or_insert(max_mom);
            params.decay_mom_rate.get_or_insert(decay_mom_rate);
        }
        LrSchedule::LrRangeTest(s) => {
            params
                .lr_range_test_min_lr
                .get_or_insert_with(|| LearningRate::Single(s.min_lrs[0]));
            params
                .lr_range_test_step_size
                .get_or_insert(NonNegativeInt(s.step_size));
            params.lr_range_test_step_rate.get_or_insert(s.step_rate);
            params
                .lr_range_test_staircase
                .get_or_insert(s.interval == Interval::Staircase);
        }
    }
    start(params, schedule.start());
    notes
}

fn warmup_bounds(params: &mut SchedulerParams, min: &[f64], max: &[f64], warmup: &Warmup) {
    params
        .warmup_min_lr
        .get_or_insert_with(|| AutoOr::Value(LearningRate::Single(min[0])));
    params
        .warmup_max_lr
        .get_or_insert_with(|| AutoOr::Value(LearningRate::Single(max[0])));
    warmup_shape(params, warmup);
}

fn warmup_shape(params: &mut SchedulerParams, warmup: &Warmup) {
    if let Some(steps) = PositiveInt::new(warmup.num_steps) {
        params.warmup_num_steps.get_or_insert(AutoOr::Value(steps));
    }
    params.warmup_type.get_or_insert(match warmup.warmup_type {
        lr::WarmupType::Log => WarmupType::Log,
        lr::WarmupType::Linear => WarmupType::Linear,
    });
}

fn start(params: &mut SchedulerParams, start: &Start) {
    params
        .last_batch_iteration
        .get_or_insert(Integer(start.last_batch_iteration));
}

/// A whole, non-negative count into an absent field.
fn fill_count(slot: &mut Option<NonNegativeInt>, value: f64) {
    if slot.is_none() && value >= 0.0 && value.fract() == 0.0 && value < 9.0e15 {
        *slot = Some(NonNegativeInt(value as u64));
    }
}
