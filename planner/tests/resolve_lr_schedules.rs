//! Every case of `reference/lr_schedules.json` (DeepSpeed 0.19.8's schedulers driven step by
//! step) written as a `ds_config.json` and sent through the path `dsplan schedule` uses
//! ([`dsplan_planner::resolve::schedule::schedule`]: the Trainer's pass, then the schedule):
//! the same rate (and OneCycle β) at every step within a relative 1e-12, the same refusal
//! message where DeepSpeed's constructor refuses. Full resolution ([`resolve`]) must build the
//! same schedule, or refuse with the same message.
//!
//! A config has one parameter group, so the cases with two groups are not expressible here
//! (`schedule_reference.rs` covers them on the schedule module directly).
//!
//! The reference lives in `../shared` next to the workspace (or where `DSPLAN_SHARED_DIR`
//! points); without it the test says so and passes.

use std::path::PathBuf;

use dsplan_planner::resolve::schedule::schedule;
use dsplan_planner::resolve::{Environment, resolve};
use dsplan_planner::schedule::{BetasSupport, LrSchedule, OptimizerGroups};
use serde_json::{Value, json};

const TOLERANCE: f64 = 1e-12;

/// Cases DeepSpeed builds (with a warning) that full resolution refuses, with why.
const VALIDATION_STRICTER: &[(&str, &str)] = &[(
    "warmuplr_unknown_type",
    "`warmup_type: \"cosine\"` is not a warm-up type; DeepSpeed warns and falls back to log, dsplan's schema refuses the typo",
)];

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.join("reference/lr_schedules.json")
        .is_file()
        .then_some(dir)
}

fn relative_difference(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / a.abs().max(b.abs())
    }
}

/// The case as a config: its optimizer (AdamW, or SGD with momentum) and its scheduler.
fn config_of(case: &Value) -> Value {
    let optimizer = &case["optimizer"];
    let lr = optimizer["param_group_lrs"][0].clone();
    let optimizer = if optimizer["kind"] == "sgd" {
        json!({"type": "SGD", "params": {"lr": lr, "momentum": optimizer["momentum"]}})
    } else {
        json!({"type": "AdamW", "params": {"lr": lr}})
    };
    json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": optimizer,
        "scheduler": {"type": case["scheduler"], "params": case["params"]},
    })
}

/// The largest relative difference over every recorded state, and how many values were compared.
fn compare(name: &str, schedule: &LrSchedule, case: &Value) -> (f64, usize) {
    let momentum_cycled = case["cycle_momentum_effective"].as_bool().unwrap_or(false);
    let states = std::iter::once(&case["init"]).chain(case["steps"].as_array().expect("steps"));
    let (mut worst, mut values) = (0.0_f64, 0);
    for (step, state) in states.enumerate() {
        let want = state["lr"][0].as_f64().expect("lr");
        let got = schedule.lr_at(step as u64);
        let difference = relative_difference(got, want);
        assert!(
            difference < TOLERANCE,
            "{name} step {step}: lr {got:e}, DeepSpeed {want:e}"
        );
        worst = worst.max(difference);
        values += 1;
        let momentum = schedule.momentum_at(step as u64);
        if momentum_cycled {
            let (beta1, beta2) = momentum.unwrap_or_else(|| panic!("{name} step {step}: no β"));
            for (got, want) in [
                (beta1, &state["betas"][0][0]),
                (beta2, &state["betas"][0][1]),
            ] {
                let difference = relative_difference(got, want.as_f64().expect("beta"));
                assert!(
                    difference < TOLERANCE,
                    "{name} step {step}: β {got}, DeepSpeed {want}"
                );
                worst = worst.max(difference);
                values += 1;
            }
        } else {
            assert!(momentum.is_none(), "{name} step {step}: β set");
        }
    }
    (worst, values)
}

#[test]
fn every_expressible_case_matches_deepspeed_through_resolution() {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return;
    };
    let text =
        std::fs::read_to_string(shared.join("reference/lr_schedules.json")).expect("readable");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    let env = Environment {
        world_size: Some(1),
        ..Environment::default()
    };
    let (mut built, mut refused, mut skipped, mut stricter, mut values) = (0, 0, 0, 0, 0);
    let mut worst = 0.0_f64;
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        if case["optimizer"]["param_group_lrs"]
            .as_array()
            .map(Vec::len)
            != Some(1)
        {
            skipped += 1;
            continue;
        }
        let config = config_of(case);
        let cli_path = schedule(&config, &env);
        let full = resolve(&config, &env);
        if let Some(message) = case["error"]["message"].as_str() {
            let errors = cli_path.expect_err(name);
            assert!(
                errors
                    .iter()
                    .any(|d| d.message == message && d.pointer.starts_with("/scheduler/params/")),
                "{name}: DeepSpeed says {message:?}, dsplan {errors:#?}"
            );
            let errors = full.expect_err(name);
            assert!(
                errors.iter().any(|d| d.message == message),
                "{name}: resolve does not repeat DeepSpeed's refusal: {errors:#?}"
            );
            refused += 1;
            continue;
        }
        let resolved =
            cli_path.unwrap_or_else(|e| panic!("{name}: DeepSpeed builds, dsplan refuses {e:#?}"));
        let (w, n) = compare(name, &resolved.schedule, case);
        worst = worst.max(w);
        values += n;
        built += 1;
        if VALIDATION_STRICTER.iter().any(|(c, _)| *c == name) {
            assert!(full.is_err(), "{name}: listed as stricter but resolves");
            stricter += 1;
            continue;
        }
        let full = full.unwrap_or_else(|e| panic!("{name}: resolve refuses {e:#?}"));
        let same = full.schedule.as_ref().map(|s| &s.schedule) == Some(&resolved.schedule);
        assert!(same, "{name}: resolve builds another schedule");
        // The materialised parameters alone give the same rates (every default written out).
        let params = full.config["scheduler"]["params"]
            .as_object()
            .cloned()
            .expect("params");
        let kind = case["scheduler"].as_str().expect("type");
        let lr = case["optimizer"]["param_group_lrs"][0]
            .as_f64()
            .expect("lr");
        let betas = if case["optimizer"]["kind"] == "sgd" {
            BetasSupport::NoBetas
        } else {
            BetasSupport::Betas
        };
        let groups = OptimizerGroups { lrs: &[lr], betas };
        let again = LrSchedule::from_params_for(kind, &params, groups)
            .unwrap_or_else(|e| panic!("{name}: materialised params refused: {e}"));
        compare(name, &again.0, case);
    }
    eprintln!(
        "lr_schedules.json through resolution: {built} built and matched ({values} values, max relative difference {worst:e}), {refused} refused with DeepSpeed's message, {skipped} two-group cases not expressible in a config, {stricter} refused by full validation (listed)"
    );
}
