//! `dsplan schedule` as a user runs it: the rate of every step as JSON (checked against
//! DeepSpeed's own `reference/lr_schedules.json` when `../shared` is there), the human phases
//! and table, the SVG chart, and DeepSpeed's refusals with exit code 1.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

mod support;
use support::run;

fn write(dir: &Path, name: &str, value: &Value) -> String {
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).expect("temp file written");
    path.display().to_string()
}

fn hf_warmup_decay() -> Value {
    json!({
        "train_micro_batch_size_per_gpu": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
            "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto",
            "warmup_type": "linear"}}
    })
}

#[test]
fn json_lists_every_step_with_the_trainers_values() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "ds.json", &hf_warmup_decay());
    let (code, stdout, stderr) = run(&[
        "schedule",
        &config,
        "--learning-rate",
        "1e-3",
        "--num-training-steps",
        "20",
        "--warmup-steps",
        "4",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let rows: Vec<Value> = serde_json::from_str(&stdout).expect("JSON list");
    assert_eq!(rows.len(), 20, "--num-training-steps is the default length");
    assert_eq!(rows[0], json!({"step": 0, "lr": 0.0, "momentum": null}));
    // Linear warm-up over W = 4: step k runs with γ = (k-1)/4 until the top at step 5.
    assert_eq!(rows[3]["lr"], json!(0.0005));
    assert_eq!(rows[5]["lr"], json!(0.001));
    // Then linear decay: γ = (T − t)/(T − W) with T = 20, so step 19 (t = 18) has 2/16.
    let last = rows[19]["lr"].as_f64().expect("lr");
    assert!((last - 1.25e-4).abs() < 1e-18, "{last}");
}

#[test]
fn one_cycle_has_momentum_human_has_phases_svg_draws() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "cycle.json",
        &json!({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
            "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4,
                "cycle_max_lr": 1e-3, "cycle_first_step_size": 10}}}),
    );
    let (code, stdout, _) = run(&["schedule", &config, "--format", "json", "--steps", "12"]);
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&stdout).expect("JSON list");
    assert_eq!(rows.len(), 12);
    assert_eq!(rows[0]["momentum"], json!(0.8));
    assert_eq!(rows[10]["lr"], json!(0.001));
    let (code, human, _) = run(&["schedule", &config]);
    assert_eq!(code, 0);
    assert!(
        human.contains("rising from 0.0001 to 0.001; β₁ 0.9 → 0.8"),
        "{human}"
    );
    assert!(human.contains("steps 0–10"), "{human}");
    let (code, svg, _) = run(&["schedule", &config, "--format", "svg"]);
    assert_eq!(code, 0);
    assert!(svg.starts_with("<svg") && svg.contains("OneCycle"), "{svg}");
}

#[test]
fn refusals_exit_1_with_deepspeeds_message() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = write(
        dir.path(),
        "bad.json",
        &json!({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}}),
    );
    let (code, _, stderr) = run(&["schedule", &bad]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("warmup_num_steps must be a positive integer, got 0"),
        "{stderr}"
    );
    let none = write(dir.path(), "none.json", &json!({"train_batch_size": 8}));
    let (code, _, stderr) = run(&["schedule", &none]);
    assert_eq!(code, 1);
    assert!(stderr.contains("no `scheduler`"), "{stderr}");
    let hf = write(dir.path(), "hf.json", &hf_warmup_decay());
    let (code, _, stderr) = run(&["schedule", &hf]);
    assert_eq!(code, 1);
    assert!(stderr.contains("--num-training-steps"), "{stderr}");
    assert_eq!(run(&["schedule", "/nonexistent.json"]).0, 2);
}

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")));
    dir.join("reference/lr_schedules.json")
        .is_file()
        .then_some(dir)
}

/// Every one-group case of DeepSpeed's reference, written as a config and run through the
/// binary: the same rate at every step (relative 1e-12) or DeepSpeed's refusal.
#[test]
fn the_binary_matches_deepspeeds_reference() {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return;
    };
    let text =
        std::fs::read_to_string(shared.join("reference/lr_schedules.json")).expect("readable");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut matched, mut refused) = (0, 0);
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let optimizer = &case["optimizer"];
        if optimizer["param_group_lrs"].as_array().map(Vec::len) != Some(1) {
            continue;
        }
        let lr = &optimizer["param_group_lrs"][0];
        let optimizer = if optimizer["kind"] == "sgd" {
            json!({"type": "SGD", "params": {"lr": lr, "momentum": optimizer["momentum"]}})
        } else {
            json!({"type": "AdamW", "params": {"lr": lr}})
        };
        let config = json!({"optimizer": optimizer,
            "scheduler": {"type": case["scheduler"], "params": case["params"]}});
        let path = write(dir.path(), &format!("{name}.json"), &config);
        let states: Vec<&Value> = std::iter::once(&case["init"])
            .chain(case["steps"].as_array().into_iter().flatten())
            .collect();
        let steps = states.len().to_string();
        let (code, stdout, stderr) =
            run(&["schedule", &path, "--format", "json", "--steps", &steps]);
        if let Some(message) = case["error"]["message"].as_str() {
            assert_eq!(code, 1, "{name}");
            assert!(stderr.contains(message), "{name}: {stderr}");
            refused += 1;
            continue;
        }
        assert_eq!(code, 0, "{name}: {stderr}");
        let rows: Vec<Value> = serde_json::from_str(&stdout).expect("JSON");
        for (step, (row, state)) in rows.iter().zip(&states).enumerate() {
            let got = row["lr"].as_f64().expect("lr");
            let want = state["lr"][0].as_f64().expect("reference lr");
            let difference = if got == want {
                0.0
            } else {
                (got - want).abs() / got.abs().max(want.abs())
            };
            assert!(difference < 1e-12, "{name} step {step}: {got} vs {want}");
            if case["cycle_momentum_effective"] == json!(true) {
                assert_eq!(
                    row["momentum"].as_f64(),
                    state["betas"][0][0].as_f64(),
                    "{name} step {step}"
                );
            } else {
                assert!(row["momentum"].is_null(), "{name} step {step}");
            }
        }
        assert_eq!(rows.len(), states.len());
        matched += 1;
    }
    eprintln!(
        "dsplan schedule: {matched} reference cases matched step by step, {refused} refused as DeepSpeed does"
    );
    assert!(matched >= 30);
}

#[test]
fn the_step_count_is_bounded_and_stated() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "warmup.json",
        &json!({"optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
                "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}),
    );
    // Above the bound: a usage error naming the range, before any work.
    let (code, stdout, stderr) = run(&[
        "schedule", &config, "--format", "json", "--steps", "10000001",
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty());
    assert!(
        stderr.contains("10000001 is not in 1..=10000000"),
        "{stderr}"
    );
    // A longer run from the training arguments is shown up to the bound, and says so.
    let (code, stdout, stderr) = run(&["schedule", &config, "--num-training-steps", "20000000"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "the run has 20000000 steps; `dsplan schedule` shows at most 10000000, so these are the first 10000000"
        ),
        "{stderr}"
    );
    assert!(
        stdout.starts_with("WarmupLR over 10000000 training steps"),
        "{stdout}"
    );
    assert!(stdout.contains("   9999999  0.001"), "{stdout}");
    // A chart of a million steps is drawn from a bounded number of points (it was 27 MB).
    let (code, svg, stderr) = run(&["schedule", &config, "--format", "svg", "--steps", "1000000"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.len() < 1_000_000, "{} bytes of SVG", svg.len());
}

#[test]
fn a_value_every_command_refuses_is_refused_here_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("negative.json");
    std::fs::write(
        &path,
        "{\"optimizer\": {\"type\": \"AdamW\",\n  \"params\": {\"lr\": -0.001}},\n \"scheduler\": {\"type\": \"WarmupLR\", \"paramz\": {}}}\n",
    )
    .expect("written");
    let config = path.to_str().expect("utf-8").to_string();
    let (code, stdout, stderr) = run(&["schedule", &config, "--format", "json"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(
            "error[out-of-range]: `optimizer.params.lr` is -0.001, but it must be at least 0"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("negative.json:2:14 (/optimizer/params/lr)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("error[unknown-key]: unknown key `paramz` in `scheduler`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("negative.json:3:36 (/scheduler/paramz)"),
        "{stderr}"
    );
}
