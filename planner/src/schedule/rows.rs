//! A schedule's steps for output, in memory that does not grow with the step count: the JSON
//! list of every step written row by row ([`write_json_rows`]) and the curve a chart draws,
//! thinned to a bounded number of points that keeps every bucket's extremes ([`curve`]).
//! `dsplan schedule` refuses more than [`MAX_STEPS`] steps.

use std::io::{self, Write};

use super::lr::LrSchedule;

/// The most steps `dsplan schedule` shows: ten million (a longer run is read in pieces with
/// `--steps`). At this bound the JSON list is about 600 MB of text, written in constant memory.
pub const MAX_STEPS: u64 = 10_000_000;

/// Writes `[{"step": k, "lr": x, "momentum": m_or_null}, ...]` for steps `0..steps`, one row at
/// a time as it is computed, so that memory stays constant however many steps are asked
/// (building the list first took 6.2 GB at 10^7 steps). Numbers use serde_json's formatting.
pub fn write_json_rows(schedule: &LrSchedule, steps: u64, out: &mut impl Write) -> io::Result<()> {
    out.write_all(b"[")?;
    for k in 0..steps {
        let beta1 = schedule.momentum_at(k).map(|(beta1, _)| beta1);
        let separator = if k == 0 { "\n  " } else { ",\n  " };
        write!(out, "{separator}{{\"step\": {k}, \"lr\": ")?;
        serde_json::to_writer(&mut *out, &schedule.lr_at(k))?;
        out.write_all(b", \"momentum\": ")?;
        serde_json::to_writer(&mut *out, &beta1)?;
        out.write_all(b"}")?;
    }
    out.write_all(b"\n]\n")?;
    out.flush()
}

/// The points of a chart of `steps` steps.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// (step, lr), in step order.
    pub lr: Vec<(u64, f64)>,
    /// (step, β₁), in step order, when the schedule cycles momentum.
    pub momentum: Option<Vec<(u64, f64)>>,
}

/// The curve of steps `0..steps` with at most about `max_points` points per line: every step
/// when they fit, otherwise the steps split into `max_points / 4` equal buckets, each kept as
/// its first, lowest, highest and last point (in step order), so no peak or jump is lost.
pub fn curve(schedule: &LrSchedule, steps: u64, max_points: u64) -> Curve {
    let lr = thinned(steps, max_points, |k| Some(schedule.lr_at(k)));
    let momentum = schedule
        .momentum_at(0)
        .map(|_| thinned(steps, max_points, |k| schedule.momentum_at(k).map(|m| m.0)));
    Curve { lr, momentum }
}

fn thinned(steps: u64, max_points: u64, value: impl Fn(u64) -> Option<f64>) -> Vec<(u64, f64)> {
    let point = |k: u64| value(k).map(|v| (k, v));
    if steps <= max_points {
        return (0..steps).filter_map(point).collect();
    }
    let buckets = (max_points / 4).max(1);
    let mut points = Vec::with_capacity((buckets * 4) as usize);
    for bucket in 0..buckets {
        let start = bucket * steps / buckets;
        let end = (bucket + 1) * steps / buckets;
        let mut kept: Vec<(u64, f64)> = Vec::with_capacity(4);
        let mut low: Option<(u64, f64)> = None;
        let mut high: Option<(u64, f64)> = None;
        for k in start..end {
            let Some(p) = point(k) else { continue };
            if low.is_none_or(|l| p.1 < l.1) {
                low = Some(p);
            }
            if high.is_none_or(|h| p.1 > h.1) {
                high = Some(p);
            }
        }
        kept.extend(point(start));
        kept.extend(low);
        kept.extend(high);
        kept.extend(
            end.checked_sub(1)
                .filter(|last| *last >= start)
                .and_then(point),
        );
        kept.sort_by_key(|(k, _)| *k);
        kept.dedup_by_key(|(k, _)| *k);
        points.extend(kept);
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::lr::{BetasSupport, OptimizerGroups};
    use serde_json::{Map, json};

    fn one_cycle() -> LrSchedule {
        let params: Map<String, serde_json::Value> = json!({
            "cycle_min_lr": 0.0001, "cycle_max_lr": 0.001, "cycle_first_step_size": 1000,
            "decay_lr_rate": 0.001, "decay_step_size": 100
        })
        .as_object()
        .cloned()
        .unwrap_or_default();
        let groups = OptimizerGroups {
            lrs: &[0.001],
            betas: BetasSupport::Betas,
        };
        LrSchedule::from_params_for("OneCycle", &params, groups)
            .expect("OneCycle")
            .0
    }

    #[test]
    fn a_short_curve_keeps_every_step() {
        let schedule = one_cycle();
        let curve = curve(&schedule, 50, 4000);
        assert_eq!(curve.lr.len(), 50);
        assert_eq!(curve.lr[7], (7, schedule.lr_at(7)));
        assert_eq!(curve.momentum.as_ref().map(Vec::len), Some(50));
    }

    #[test]
    fn a_long_curve_is_thinned_but_keeps_the_peak_and_the_ends() {
        let schedule = one_cycle();
        let steps = 100_000;
        let curve = curve(&schedule, steps, 400);
        assert!(curve.lr.len() <= 400, "{}", curve.lr.len());
        assert!(
            curve.lr.windows(2).all(|w| w[0].0 < w[1].0),
            "in step order"
        );
        let peak = (0..steps)
            .map(|k| schedule.lr_at(k))
            .fold(f64::MIN, f64::max);
        let kept_peak = curve.lr.iter().map(|p| p.1).fold(f64::MIN, f64::max);
        assert_eq!(kept_peak, peak);
        assert_eq!(curve.lr.first().map(|p| p.0), Some(0));
        assert_eq!(curve.lr.last().map(|p| p.0), Some(steps - 1));
    }

    #[test]
    fn json_rows_are_a_json_list_of_every_step() {
        let schedule = one_cycle();
        let mut out = Vec::new();
        write_json_rows(&schedule, 3, &mut out).expect("written");
        let rows: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(rows.as_array().map(Vec::len), Some(3));
        assert_eq!(rows[2]["step"], json!(2));
        assert_eq!(rows[2]["lr"].as_f64(), Some(schedule.lr_at(2)));
        assert_eq!(
            rows[2]["momentum"].as_f64(),
            schedule.momentum_at(2).map(|m| m.0)
        );
    }
}
