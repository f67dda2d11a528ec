//! One set of rules for every command (issue 14): a value DeepSpeed takes though it cannot
//! work is refused the same way, at the same JSON pointer and line:col, by `validate`,
//! `resolve`, `schedule`, `plan` and `run`; and `resolve` places a nested field's error at the
//! field itself, however deep.

use std::path::Path;
use std::time::Duration;

use assert_cmd::Command;

fn dsplan() -> Command {
    let mut command = Command::cargo_bin("dsplan").expect("binary built");
    command.timeout(Duration::from_secs(120));
    command
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file written");
    path.to_str().expect("utf-8 path").to_string()
}

/// A config whose only problem is a negative learning rate, on line 3 at column 15.
const NEGATIVE_LR: &str = r#"{"train_micro_batch_size_per_gpu": 1,
 "optimizer": {"type": "AdamW",
   "params": {"lr": -0.001}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}
"#;

#[test]
fn a_negative_learning_rate_is_the_same_error_in_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "lr.json", NEGATIVE_LR);
    let commands: Vec<Vec<&str>> = vec![
        vec!["validate", &config],
        vec!["resolve", &config, "--world-size", "1"],
        vec!["schedule", &config],
        vec!["plan", &config, "--model", "gpt2", "--world-size", "1"],
        vec!["run", &config, "--steps", "1", "--device", "cpu"],
    ];
    for args in commands {
        let output = dsplan().args(&args).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "error[out-of-range]: `optimizer.params.lr` is -0.001, but it must be at least 0: DeepSpeed's optimizers use it as given"
            ),
            "{args:?}: {stderr}"
        );
        assert!(
            stderr.contains("lr.json:3:15 (/optimizer/params/lr)"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn validate_and_resolve_json_agree_on_code_pointer_and_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "lr.json", NEGATIVE_LR);
    let validate = dsplan()
        .args(["validate", &config, "--format", "json"])
        .output()
        .expect("runs");
    let resolve = dsplan()
        .args(["resolve", &config, "--world-size", "1", "--format", "json"])
        .output()
        .expect("runs");
    assert_eq!(validate.status.code(), Some(1));
    assert_eq!(resolve.status.code(), Some(1));
    let validate: serde_json::Value = serde_json::from_slice(&validate.stdout).expect("JSON");
    let resolve: serde_json::Value = serde_json::from_slice(&resolve.stdout).expect("JSON");
    let pick = |diagnostics: &serde_json::Value| {
        diagnostics
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["severity"] == "error")
            .map(|d| {
                (
                    d["code"].clone(),
                    d["pointer"].clone(),
                    d["line"].clone(),
                    d["column"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let expected = vec![(
        serde_json::json!("out-of-range"),
        serde_json::json!("/optimizer/params/lr"),
        serde_json::json!(3),
        serde_json::json!(15),
    )];
    assert_eq!(pick(&validate["files"][0]["diagnostics"]), expected);
    assert_eq!(pick(&resolve["diagnostics"]), expected);
}

#[test]
fn resolve_places_a_nested_fields_error_at_the_field_at_any_depth() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "deep.json",
        r#"{"train_micro_batch_size_per_gpu": 1,
 "zero_optimization": {"stage": 3,
   "offload_optimizer": {"device": "cpu",
     "buffer_count": -1}},
 "autotuning": {"model_info": {"num_layers": "many"}}}
"#,
    );
    let output = dsplan()
        .args(["resolve", &config, "--world-size", "1", "--format", "json"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let out: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let errors: Vec<(String, u64, u64)> = out["diagnostics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["severity"] == "error")
        .map(|d| {
            (
                d["pointer"].as_str().unwrap_or_default().to_string(),
                d["line"].as_u64().unwrap_or(0),
                d["column"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        errors,
        [
            (
                "/zero_optimization/offload_optimizer/buffer_count".to_string(),
                4,
                6
            ),
            ("/autotuning/model_info/num_layers".to_string(), 5, 32),
        ]
    );
    let human = dsplan()
        .args(["resolve", &config, "--world-size", "1"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&human.stderr);
    assert!(
        stderr.contains("deep.json:4:6 (/zero_optimization/offload_optimizer/buffer_count)"),
        "{stderr}"
    );
    assert!(!stderr.contains("deep.json:1:1"), "{stderr}");
}

#[test]
fn estimate_with_a_config_refuses_it_too() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "lr.json", NEGATIVE_LR);
    let output = dsplan()
        .args([
            "estimate",
            "--model",
            "gpt2",
            "--gpus",
            "1",
            "--seq-len",
            "128",
            "--config",
            &config,
        ])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("`optimizer.params.lr` is -0.001, but it must be at least 0"),
        "{stderr}"
    );
    assert!(stderr.contains("/optimizer/params/lr"), "{stderr}");
}
