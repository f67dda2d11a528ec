//! `dsplan resolve` as a user runs it: "auto" filled from flags, a training-arguments file and a
//! model; provenance; mismatches reported together; exit codes.

use std::path::Path;

use serde_json::{Value, json};

mod support;
use support::{dsplan, run};

const HF_CONFIG: &str = r#"{
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
  "bf16": {"enabled": "auto"},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
}
"#;

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("temp file written");
    path.display().to_string()
}

#[test]
fn fills_auto_from_flags_and_explains_every_value() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "ds.json", HF_CONFIG);
    let (code, stdout, stderr) = run(&[
        "resolve",
        &config,
        "--world-size",
        "8",
        "--hidden-size",
        "4096",
        "--per-device-train-batch-size",
        "2",
        "--gradient-accumulation-steps",
        "4",
        "--learning-rate",
        "2e-5",
        "--warmup-steps",
        "0.03",
        "--num-training-steps",
        "5000",
        "--bf16",
        "--explain",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let out: Value = serde_json::from_str(&stdout).expect("JSON");
    let c = &out["config"];
    assert_eq!(c["train_batch_size"], json!(64));
    assert_eq!(c["scheduler"]["params"]["warmup_num_steps"], json!(150));
    assert_eq!(
        c["zero_optimization"]["stage3_prefetch_bucket_size"],
        json!(15_099_494)
    );
    assert_eq!(c["bf16"]["enabled"], json!(true));
    assert_eq!(out["batch"]["gradient_accumulation_steps"], json!(4));
    let origin = &out["provenance"];
    assert_eq!(
        origin["/optimizer/params/lr"],
        json!({"kind": "flag", "name": "learning_rate", "given_by": "--learning-rate"})
    );
    assert_eq!(
        origin["/optimizer/params/eps"]["kind"],
        json!("training-arg-default")
    );
    assert_eq!(origin["/train_batch_size"]["kind"], json!("auto-rule"));
    assert_eq!(
        origin["/zero_optimization/stage"],
        json!({"kind": "file", "pointer": "/zero_optimization/stage", "line": 9})
    );
    assert_eq!(
        origin["/zero_optimization/sub_group_size"]["kind"],
        json!("deep-speed-default")
    );
    // Every value of the config has an origin.
    let leaves = count_leaves(c);
    assert_eq!(origin.as_object().map(|o| o.len()), Some(leaves));
}

fn count_leaves(value: &Value) -> usize {
    match value {
        Value::Object(map) => map.values().map(count_leaves).sum(),
        _ => 1,
    }
}

#[test]
fn human_output_is_the_config_or_the_explanation() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "ds.json",
        r#"{"train_batch_size": 32, "gradient_clipping": 0.5}"#,
    );
    let (code, stdout, stderr) = run(&["resolve", &config, "--world-size", "4"]);
    assert_eq!(code, 0, "{stderr}");
    let resolved: Value = serde_json::from_str(&stdout).expect("stdout is the config");
    assert_eq!(resolved["train_micro_batch_size_per_gpu"], json!(8));
    assert_eq!(resolved["gradient_clipping"], json!(0.5));
    assert!(stderr.contains("resolved at world size 4"), "{stderr}");
    let (_, explained, _) = run(&["resolve", &config, "--world-size", "4", "--explain"]);
    let micro = explained
        .lines()
        .find(|l| l.starts_with("/train_micro_batch_size_per_gpu "))
        .expect("a line per value");
    assert!(
        micro.contains(
            "derived: train_micro_batch_size_per_gpu = train_batch_size 32 // world size 4 = 8"
        ),
        "{micro}"
    );
    let clipping = explained
        .lines()
        .find(|l| l.starts_with("/gradient_clipping "))
        .expect("clipping line");
    assert!(
        clipping.ends_with("file /gradient_clipping (line 1)"),
        "{clipping}"
    );
}

#[test]
fn every_mismatch_is_reported_at_once_with_exit_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        dir.path(),
        "ds.json",
        r#"{"train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.1}}}"#,
    );
    let args = [
        "resolve",
        &config,
        "--world-size",
        "2",
        "--per-device-train-batch-size",
        "8",
        "--learning-rate",
        "3e-5",
        "--weight-decay",
        "0.01",
    ];
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 1, "{stderr}");
    for line in [
        "ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=8",
        "ds optimizer.params.lr=0.001 vs hf learning_rate=3e-05",
        "ds optimizer.params.weight_decay=0.1 vs hf weight_decay=0.01",
        "help: pass --learning-rate 0.001, or set `optimizer.params.lr` to \"auto\"",
        "3 values disagree with the training arguments",
    ] {
        assert!(stderr.contains(line), "missing {line:?} in\n{stderr}");
    }
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let (code, stdout, _) = run(&json_args);
    assert_eq!(code, 1);
    let out: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(out["config"], Value::Null);
    let codes: Vec<&str> = out["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter_map(|d| d["code"].as_str())
        .collect();
    assert_eq!(codes.iter().filter(|c| **c == "auto-mismatch").count(), 3);
    assert!(out["diagnostics"][0]["line"].is_number(), "located");
}

#[test]
fn unresolvable_auto_names_the_flag_and_quoted_numbers_are_normalised() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "ds.json", HF_CONFIG);
    let (code, _, stderr) = run(&["resolve", &config, "--world-size", "1"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("error[unresolvable-auto]"), "{stderr}");
    assert!(
        stderr.contains("--hidden-size H (or --model M)"),
        "{stderr}"
    );

    let quoted = write(
        dir.path(),
        "quoted.json",
        r#"{"train_micro_batch_size_per_gpu": "8"}"#,
    );
    let (code, stdout, stderr) = run(&[
        "resolve",
        &quoted,
        "--world-size",
        "1",
        "--per-device-train-batch-size",
        "8",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("warning[normalised-string]"), "{stderr}");
    assert!(!stderr.contains("auto-mismatch"), "{stderr}");
    let resolved: Value = serde_json::from_str(&stdout).expect("config");
    assert_eq!(resolved["train_micro_batch_size_per_gpu"], json!(8));
}

#[test]
fn training_args_file_model_directory_and_flags_combine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "ds.json", HF_CONFIG);
    let args_file = write(
        dir.path(),
        "args.json",
        r#"{"learning_rate": 1e-4, "per_device_train_batch_size": 4, "max_steps": 200,
            "warmup_steps": 20, "output_dir": "out", "bf16": true}"#,
    );
    let model = dir.path().join("model");
    std::fs::create_dir(&model).expect("model dir");
    write(
        &model,
        "config.json",
        r#"{"model_type": "gpt2", "n_embd": 1600, "n_layer": 48}"#,
    );
    let (code, stdout, stderr) = run(&[
        "resolve",
        &config,
        "--world-size",
        "2",
        "--training-args",
        &args_file,
        "--learning-rate",
        "5e-4",
        "--model",
        &model.display().to_string(),
        "--format",
        "json",
        "--explain",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let out: Value = serde_json::from_str(&stdout).expect("JSON");
    let c = &out["config"];
    assert_eq!(c["optimizer"]["params"]["lr"], json!(5e-4), "the flag wins");
    assert_eq!(c["train_batch_size"], json!(8));
    assert_eq!(c["scheduler"]["params"]["warmup_num_steps"], json!(20));
    assert_eq!(
        c["zero_optimization"]["reduce_bucket_size"],
        json!(2_560_000)
    );
    assert_eq!(
        out["provenance"]["/train_micro_batch_size_per_gpu"]["given_by"],
        json!("--training-args")
    );
    let formula = out["provenance"]["/zero_optimization/reduce_bucket_size"]["inputs"][0]["from"]
        .as_str()
        .unwrap_or_default();
    assert!(formula.contains("n_embd"), "{formula}");
}

#[test]
fn usage_and_io_errors_exit_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(dir.path(), "ds.json", HF_CONFIG);
    assert_eq!(run(&["resolve", &config]).0, 2, "--world-size is required");
    assert_eq!(
        run(&["resolve", "/nonexistent/ds.json", "--world-size", "1"]).0,
        2
    );
    let (code, _, stderr) = run(&[
        "resolve",
        &config,
        "--world-size",
        "1",
        "--model",
        "gtp2-medum",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("gpt2-medium"), "a suggestion: {stderr}");
    let (code, _, _) = run(&[
        "resolve",
        &config,
        "--world-size",
        "1",
        "--warmup-steps",
        "-3",
    ]);
    assert_eq!(code, 2);
    let broken = write(dir.path(), "args.json", r#"{"fp16": "yes"}"#);
    let (code, _, stderr) = run(&[
        "resolve",
        &config,
        "--world-size",
        "1",
        "--training-args",
        &broken,
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("`fp16` must be true or false"), "{stderr}");
    let syntax = write(dir.path(), "bad.json", "{\"train_batch_size\": 8,,}");
    assert_eq!(run(&["resolve", &syntax, "--world-size", "1"]).0, 1);
}

/// `--format json` of `dsplan resolve`, with the exit code.
fn resolve_json(file: &str, flags: &[&str]) -> (Option<i32>, Value) {
    let output = dsplan()
        .args(["resolve", file, "--world-size", "1", "--format", "json"])
        .args(flags)
        .output()
        .expect("runs");
    let doc = serde_json::from_slice(&output.stdout).expect("json");
    (output.status.code(), doc)
}

fn diagnostic_at<'d>(doc: &'d Value, pointer: &str) -> &'d Value {
    doc["diagnostics"]
        .as_array()
        .expect("diagnostics")
        .iter()
        .find(|d| d["pointer"] == pointer)
        .unwrap_or_else(|| panic!("no diagnostic at {pointer}: {doc:#}"))
}

#[test]
fn auto_under_a_short_stage3_name_warns_with_deepspeeds_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        dir.path(),
        "short.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
            "prefetch_bucket_size": "auto", "param_persistence_threshold": "auto"}}"#,
    );
    let (code, doc) = resolve_json(&file, &["--hidden-size", "64"]);
    assert_eq!(code, Some(0), "{doc:#}");
    for (short, long, default) in [
        (
            "prefetch_bucket_size",
            "stage3_prefetch_bucket_size",
            50_000_000,
        ),
        (
            "param_persistence_threshold",
            "stage3_param_persistence_threshold",
            100_000,
        ),
    ] {
        let warning = diagnostic_at(&doc, &format!("/zero_optimization/{short}"));
        assert_eq!(warning["code"], "unresolvable-auto");
        assert_eq!(warning["severity"], "warning");
        assert_eq!(
            warning["message"],
            format!(
                "`{short}` is \"auto\", which the Hugging Face Trainer fills only under the name `{long}`: it stays \"auto\", and DeepSpeed then uses its default, {default}"
            )
        );
        assert_eq!(doc["config"]["zero_optimization"][long], json!(default));
    }
}

#[test]
fn a_precision_flag_against_the_configs_precision_is_the_trainers_mismatch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(
        dir.path(),
        "bf16.json",
        r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}"#,
    );
    let (code, doc) = resolve_json(&file, &["--fp16"]);
    assert_eq!(code, Some(1), "{doc:#}");
    let error = diagnostic_at(&doc, "/bf16/enabled");
    assert_eq!(error["code"], "auto-mismatch");
    assert_eq!(error["severity"], "error");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("ds bf16.enabled=True vs hf bf16|bf16_full_eval=False")),
        "{error:#}"
    );
    let (code, doc) = resolve_json(&file, &[]);
    assert_eq!(
        code,
        Some(0),
        "no flag: only TrainingArguments' default differs: {doc:#}"
    );
}
