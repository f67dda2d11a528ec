//! Every case of `reference/lr_schedules.json` (DeepSpeed 0.19.8's schedulers driven step by
//! step): every learning rate and every β within a relative 1e-12, and the same refusal where
//! DeepSpeed's constructor refuses.
//!
//! The reference lives in `../shared` next to the workspace (or where `DSPLAN_SHARED_DIR`
//! points); without it the test says so and passes.

use std::path::PathBuf;

use dsplan_planner::schedule::{BetasSupport, LrSchedule, OptimizerGroups};
use serde_json::Value;

const TOLERANCE: f64 = 1e-12;

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.is_dir().then_some(dir)
}

fn relative_difference(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

fn floats(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("list of numbers")
        .iter()
        .map(|v| v.as_f64().expect("number"))
        .collect()
}

fn betas(value: &Value) -> Vec<(f64, f64)> {
    value
        .as_array()
        .expect("list of betas")
        .iter()
        .map(|pair| {
            let pair = floats(pair);
            (pair[0], pair[1])
        })
        .collect()
}

/// Compares one recorded optimizer state with the schedule at `step`; returns the largest
/// relative difference and how many values were compared.
fn compare_state(
    name: &str,
    schedule: &LrSchedule,
    step: u64,
    state: &Value,
    momentum_cycled: bool,
) -> (f64, usize) {
    let mut worst = 0.0_f64;
    let mut compared = 0;
    let expected_lrs = floats(&state["lr"]);
    let lrs = schedule.lrs_at(step);
    assert_eq!(
        lrs.len(),
        expected_lrs.len(),
        "{name} step {step}: group count"
    );
    for (group, (got, want)) in lrs.iter().zip(&expected_lrs).enumerate() {
        let difference = relative_difference(*got, *want);
        assert!(
            difference < TOLERANCE,
            "{name} step {step} group {group}: lr {got:e}, DeepSpeed {want:e} (rel {difference:e})"
        );
        worst = worst.max(difference);
        compared += 1;
    }
    let momenta = schedule.momenta_at(step);
    match (&state.get("betas"), momentum_cycled) {
        (Some(recorded), true) => {
            let want = betas(recorded);
            let got = momenta.unwrap_or_else(|| panic!("{name} step {step}: no momentum"));
            assert_eq!(got.len(), want.len(), "{name} step {step}: beta groups");
            for (group, (g, w)) in got.iter().zip(&want).enumerate() {
                for (x, y) in [(g.0, w.0), (g.1, w.1)] {
                    let difference = relative_difference(x, y);
                    assert!(
                        difference < TOLERANCE,
                        "{name} step {step} group {group}: beta {x}, DeepSpeed {y}"
                    );
                    worst = worst.max(difference);
                    compared += 1;
                }
            }
        }
        (recorded, false) => {
            assert!(
                momenta.is_none(),
                "{name} step {step}: momentum should not be set"
            );
            // The optimizer's betas (AdamW's defaults) are left as they were.
            if let Some(recorded) = recorded {
                assert!(
                    betas(recorded).iter().all(|b| *b == (0.9, 0.999)),
                    "{name}: betas moved"
                );
            }
        }
        (None, true) => panic!("{name}: momentum cycled but no betas recorded"),
    }
    (worst, compared)
}

#[test]
fn every_lr_schedule_case_matches_deepspeed() {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return;
    };
    let text = std::fs::read_to_string(shared.join("reference/lr_schedules.json"))
        .expect("reference/lr_schedules.json is readable");
    let doc: Value = serde_json::from_str(&text).expect("reference is JSON");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 44, "expected the 44 recorded cases");

    let (mut built, mut refused, mut values, mut steps) = (0, 0, 0usize, 0usize);
    let mut worst = 0.0_f64;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let type_name = case["scheduler"].as_str().expect("scheduler");
        let params = case["params"].as_object().expect("params");
        let lrs = floats(&case["optimizer"]["param_group_lrs"]);
        let betas_support = match case["optimizer"]["kind"].as_str() {
            Some("sgd") => BetasSupport::NoBetas,
            _ => BetasSupport::Betas,
        };
        let groups = OptimizerGroups {
            lrs: &lrs,
            betas: betas_support,
        };
        let result = LrSchedule::from_params_for(type_name, params, groups);

        if let Some(error) = case.get("error") {
            let refusal = result
                .err()
                .unwrap_or_else(|| panic!("{name}: DeepSpeed refuses, dsplan builds"));
            assert_eq!(
                refusal.message,
                error["message"].as_str().expect("message"),
                "{name}: refusal message"
            );
            assert!(
                refusal.param.is_some(),
                "{name}: the refusal names a parameter"
            );
            refused += 1;
            continue;
        }

        let (schedule, warnings) =
            result.unwrap_or_else(|e| panic!("{name}: DeepSpeed builds, dsplan refuses: {e}"));
        if name == "warmuplr_unknown_type" {
            assert!(
                warnings
                    .iter()
                    .any(|w| w.param.as_deref() == Some("warmup_type")),
                "{name}: the fallback to log is reported"
            );
        }
        let momentum_cycled = case
            .get("cycle_momentum_effective")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if let LrSchedule::OneCycle(one_cycle) = &schedule {
            assert_eq!(
                one_cycle.momentum.is_some(),
                momentum_cycled,
                "{name}: cycle_momentum"
            );
        }

        let (w, n) = compare_state(name, &schedule, 0, &case["init"], momentum_cycled);
        worst = worst.max(w);
        values += n;
        let recorded = case["steps"].as_array().expect("steps");
        assert_eq!(
            recorded.len() as u64,
            case["num_steps"].as_u64().expect("num_steps")
        );
        for (k, state) in recorded.iter().enumerate() {
            assert_eq!(state["last_batch_iteration"].as_i64(), Some(k as i64));
            let (w, n) = compare_state(name, &schedule, k as u64 + 1, state, momentum_cycled);
            worst = worst.max(w);
            values += n;
        }
        steps += recorded.len() + 1;
        built += 1;
    }
    eprintln!(
        "lr_schedules.json: {} cases ({built} built, {refused} refused as DeepSpeed does), \
         {steps} steps, {values} values, max relative difference {worst:e}",
        cases.len()
    );
}
