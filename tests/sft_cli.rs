//! `dsplan run` on TRL 1.16 `SFTTrainer` + DeepSpeed fixtures (`../shared/reference/sft`):
//! the dataset, the model directory, the run's `ds_config_input` and `sft_config_explicit` as
//! they are, through the binary; every step's loss and the eval loss within 1e-5 relative of
//! `trajectory.json`. A malformed JSONL line exits 1 naming FILE:LINE. Skips without
//! `../shared`.

use std::path::PathBuf;

use assert_cmd::Command;
use serde_json::Value;

const REL_TOL: f64 = 1e-5;

fn sft_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")))
        .join("reference/sft");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared/reference/sft not found");
        None
    }
}

fn json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check(name: &str) {
    let Some(root) = sft_dir() else { return };
    let run_dir = root.join("runs").join(name);
    let run = json(&run_dir.join("run.json"));
    let trajectory = json(&run_dir.join("trajectory.json"));
    let work = tempfile::tempdir().expect("temp dir");
    let write = |file: &str, value: &Value| {
        let path = work.path().join(file);
        std::fs::write(&path, value.to_string()).expect("write");
        path
    };
    let ds = write("ds_config.json", &run["ds_config_input"]);
    let args = write("sft_config.json", &run["sft_config_explicit"]);
    // The data copied, so its token cache goes into the temp dir.
    let copy = |key: &str| {
        let source = root.join(run[key].as_str().expect("file"));
        let target = work.path().join(source.file_name().expect("name"));
        std::fs::copy(&source, &target).expect("copy");
        target
    };
    let (train, eval) = (copy("train_file"), copy("eval_file"));
    let metrics = work.path().join("metrics.jsonl");
    let world = trajectory["world_size"].as_u64().expect("world_size");
    let output = Command::cargo_bin("dsplan")
        .expect("binary")
        .arg("run")
        .arg(&ds)
        .arg("--model")
        .arg(root.join(run["model"].as_str().expect("model")))
        .arg("--data")
        .arg(&train)
        .arg("--eval-data")
        .arg(&eval)
        .arg("--training-args")
        .arg(&args)
        .arg("--world-size")
        .arg(world.to_string())
        .arg("--device")
        .arg("cpu")
        .arg("--metrics")
        .arg(&metrics)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name}: {stderr}");
    let lines: Vec<Value> = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let losses: Vec<f64> = lines.iter().filter_map(|l| l["loss"].as_f64()).collect();
    let reference: Vec<f64> = trajectory["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["loss"].as_f64().expect("loss"))
        .collect();
    assert_eq!(losses.len(), reference.len(), "{name}: one loss per step");
    let rel = |o: f64, r: f64| (o - r).abs() / r.abs();
    let worst = losses
        .iter()
        .zip(&reference)
        .map(|(&o, &r)| rel(o, r))
        .fold(0.0, f64::max);
    let eval_ours = lines
        .iter()
        .find_map(|l| l["eval_loss"].as_f64())
        .expect("an eval_loss line");
    let eval_ref = trajectory["eval"]["eval_loss"].as_f64().expect("eval_loss");
    let eval = rel(eval_ours, eval_ref);
    eprintln!(
        "{name:24} step loss max rel {worst:.2e} | eval loss rel {eval:.2e} ({eval_ours:.6} vs {eval_ref:.6})"
    );
    assert!(worst < REL_TOL, "{name}: step loss {worst:e}");
    assert!(eval < REL_TOL, "{name}: eval loss {eval:e}");
}

#[test]
fn text_run_matches_sft_trainer() {
    check("text");
}

#[test]
fn text_packed_run_matches_sft_trainer() {
    check("text_packed");
}

#[test]
fn prompt_completion_run_matches_sft_trainer() {
    check("prompt_completion");
}

#[test]
fn messages_assistant_only_run_matches_sft_trainer() {
    check("messages_assistant_only");
}

#[test]
fn text_shuffled_run_matches_sft_trainer() {
    check("text_shuffled");
}

#[test]
fn text_ws2_run_matches_sft_trainer() {
    check("text_ws2");
}

#[test]
fn a_malformed_jsonl_line_is_refused_naming_file_and_line() {
    let Some(root) = sft_dir() else { return };
    let work = tempfile::tempdir().expect("temp dir");
    let data = work.path().join("bad.jsonl");
    std::fs::write(&data, "{\"text\": \"fine\"}\n{\"text\": oops}\n").expect("write");
    let args = work.path().join("args.json");
    std::fs::write(
        &args,
        r#"{"lr_scheduler_type": "constant", "max_steps": 1}"#,
    )
    .expect("write");
    let ds = work.path().join("ds.json");
    std::fs::write(&ds, r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}"#).expect("write");
    let output = Command::cargo_bin("dsplan")
        .expect("binary")
        .arg("run")
        .arg(&ds)
        .arg("--model")
        .arg(root.join("models/llama_bpe"))
        .arg("--data")
        .arg(&data)
        .arg("--training-args")
        .arg(&args)
        .arg("--device")
        .arg("cpu")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad.jsonl:2"), "{stderr}");
}
