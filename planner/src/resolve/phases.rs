//! A schedule described for people: its phases in training steps (step `k` runs with the rate
//! DeepSpeed's scheduler holds after `k` calls to `step()`), and how many steps show it whole.

use serde::Serialize;

use crate::schedule::lr::{Interval, Warmup, WarmupType};
use crate::schedule::{LrSchedule, py_float_repr};

/// One phase of a schedule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    /// First training step of the phase.
    pub from_step: u64,
    /// Training step where the phase ends (its last value is reached there); `None` when it
    /// lasts forever.
    pub to_step: Option<u64>,
    /// What the learning rate does.
    pub description: String,
}

/// The phases of `schedule` (first parameter group).
pub fn phases(schedule: &LrSchedule) -> Vec<Phase> {
    let offset = -schedule.start().last_batch_iteration;
    // Training step that runs with DeepSpeed's `last_batch_iteration = t`.
    let step = |t: f64| (t + offset as f64).max(0.0).ceil() as u64;
    let lr = py_float_repr;
    match schedule {
        LrSchedule::WarmupLr(s) => {
            let peak = step(peak_iteration(&s.warmup));
            vec![
                warmup_phase(&s.warmup, peak, lr(s.min_lrs[0]), lr(s.max_lrs[0])),
                phase(peak, None, format!("constant {}", lr(s.max_lrs[0]))),
            ]
        }
        LrSchedule::WarmupDecayLr(s) => {
            let peak = step(peak_iteration(&s.base.warmup));
            let end = step(s.total_num_steps).max(peak);
            let (min, max) = (lr(s.base.min_lrs[0]), lr(s.base.max_lrs[0]));
            vec![
                warmup_phase(&s.base.warmup, peak, min.clone(), max.clone()),
                phase(peak, Some(end), format!("linear decay from {max} to {min}")),
                phase(end, None, format!("constant {min}")),
            ]
        }
        LrSchedule::WarmupCosineLr(s) => {
            let base = s.base_lrs[0];
            let peak = step(peak_iteration(&s.warmup));
            let end = step(s.total_num_steps - 1.0).max(peak);
            vec![
                warmup_phase(&s.warmup, peak, lr(base * s.warmup_min_ratio), lr(base)),
                phase(
                    peak,
                    Some(end),
                    format!(
                        "cosine decay from {} to {} (cos_min_ratio {} of the optimizer's lr)",
                        lr(base),
                        lr(base * s.cos_min_ratio),
                        lr(s.cos_min_ratio)
                    ),
                ),
                phase(
                    end,
                    None,
                    "the cosine rises again after total_num_steps (DeepSpeed does not clamp it)"
                        .into(),
                ),
            ]
        }
        LrSchedule::OneCycle(s) => {
            let top = step(s.first_step_size - 1.0);
            let end = step(s.total_size() - 1.0).max(top);
            let (min, max) = (lr(s.min_lrs[0]), lr(s.max_lrs[0]));
            let momentum = |rising: bool| match &s.momentum {
                Some(m) => {
                    let (from, to) = (lr(m.max_moms[0]), lr(m.min_moms[0]));
                    if rising {
                        format!("; β₁ {from} → {to}")
                    } else {
                        format!("; β₁ {to} → {from}")
                    }
                }
                None => String::new(),
            };
            let after = if s.decay_step_size > 0.0 && s.decay_lr_rate != 0.0 {
                format!(
                    "decay: {min} / (1 + {} × k / {}) after k more steps",
                    lr(s.decay_lr_rate),
                    py_float_repr(s.decay_step_size)
                )
            } else {
                format!("constant {min}")
            };
            vec![
                phase(
                    0,
                    Some(top),
                    format!("rising from {min} to {max}{}", momentum(true)),
                ),
                phase(
                    top,
                    Some(end),
                    format!("falling from {max} to {min}{}", momentum(false)),
                ),
                phase(end, None, after),
            ]
        }
        LrSchedule::LrRangeTest(s) => {
            let growth = match s.interval {
                Interval::Continuous => format!(
                    "continuously, by {} every {} steps",
                    lr(s.step_rate),
                    s.step_size
                ),
                Interval::Staircase => format!(
                    "in stairs of {} steps, by {} each",
                    s.step_size,
                    lr(s.step_rate)
                ),
            };
            vec![phase(
                0,
                None,
                format!(
                    "from {}, growing linearly {growth} (× the start)",
                    lr(s.min_lrs[0])
                ),
            )]
        }
    }
}

/// How many training steps show the whole shape of `schedule`.
pub fn default_steps(schedule: &LrSchedule) -> u64 {
    let last_bounded = phases(schedule)
        .iter()
        .filter_map(|p| p.to_step)
        .max()
        .unwrap_or(0);
    let steps = match schedule {
        LrSchedule::LrRangeTest(s) => s.step_size.saturating_mul(10),
        LrSchedule::WarmupLr(_) => last_bounded.saturating_mul(2),
        _ => last_bounded.saturating_add(last_bounded / 4),
    };
    steps.clamp(10, 100_000)
}

fn phase(from_step: u64, to_step: Option<u64>, description: String) -> Phase {
    Phase {
        from_step,
        to_step,
        description,
    }
}

/// The iteration at which a warm-up reaches its top (γ = 1).
fn peak_iteration(warmup: &Warmup) -> f64 {
    let w = warmup.effective_steps as f64;
    match warmup.warmup_type {
        WarmupType::Log => w - 1.0,
        WarmupType::Linear => w,
    }
}

fn warmup_phase(warmup: &Warmup, peak: u64, from: String, to: String) -> Phase {
    phase(
        0,
        Some(peak),
        format!(
            "{} warm-up from {from} to {to} over {} steps",
            warmup.warmup_type.as_str(),
            warmup.effective_steps
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn built(kind: &str, params: serde_json::Value) -> LrSchedule {
        let params = params.as_object().cloned().expect("object");
        LrSchedule::from_params(kind, &params, 1e-3)
            .expect("valid schedule")
            .0
    }

    /// Each phase boundary is where the rate reaches the value the phase names.
    #[test]
    fn boundaries_are_where_the_rate_arrives() {
        let s = built(
            "WarmupDecayLR",
            json!({"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 10,
                   "total_num_steps": 50, "warmup_type": "linear"}),
        );
        let p = phases(&s);
        // Linear warm-up: γ = t/W reaches 1 at t = W, which training step W + 1 uses.
        assert_eq!((p[0].to_step, p[1].to_step), (Some(11), Some(51)));
        assert_eq!(s.lr_at(11), 0.01);
        assert!(s.lr_at(10) < 0.01);
        assert_eq!(s.lr_at(51), 0.0);
        assert!(s.lr_at(50) > 0.0);
        let log = built(
            "WarmupLR",
            json!({"warmup_max_lr": 0.01, "warmup_num_steps": 10}),
        );
        let top = phases(&log)[0].to_step.expect("bounded");
        // (1/ln W)·ln W is 1 only up to rounding.
        assert!((log.lr_at(top) - 0.01).abs() < 1e-15);
        assert!(log.lr_at(top - 1) < 0.0099);
        let cycle = built(
            "OneCycle",
            json!({"cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_step_size": 5}),
        );
        let p = phases(&cycle);
        assert!((cycle.lr_at(p[0].to_step.expect("top")) - 0.01).abs() < 1e-15);
        assert!((cycle.lr_at(p[1].to_step.expect("end")) - 0.001).abs() < 1e-15);
        assert_eq!(default_steps(&cycle), 12);
    }
}
