//! `dsplan estimate` held against DeepSpeed's measured peaks on a real GPU.
//!
//! `bench/results/gpu/*.json` are what the GPU kit (`bench/gpu_check.sh`) measured: DeepSpeed
//! 0.19.8 training Hugging Face's GPT-2 (random init, `sdpa` attention) for 5 steps, with
//! `torch.cuda.max_memory_allocated()` after them. Each measured row's config is rebuilt as
//! `bench/ds_memory.py` wrote it, and the estimate of its tensors (no CUDA context, no
//! fragmentation margin: what the allocator counts) must be within 2% of the measured peak.
//! (The stage-3 rows of 2026-11-26 alone met 1%, by a cancellation: gathered parameters
//! counted at W = 1, where DeepSpeed gathers none, made up for tensors left out. The H100 and
//! H200 runs of 2026-11-27 measured stages 0-2 too; with those two terms and the lazy IPG
//! bucket corrected, every row is 1.0-1.9% under the measured peak: about 1.6 bytes per token
//! and hidden unit and layer, and a 64 MiB constant, are still unaccounted for.)
//! The files are part of the repository, so this runs everywhere; a results file without a
//! measured row fails the test rather than passing it empty.

use serde_json::{Value, json};

mod support;
use support::dsplan;

/// The config `bench/ds_memory.py` trains with (its `ds_config`).
fn ds_config(stage: u64, offload: &str, micro_batch: u64) -> Value {
    let mut zero = json!({"stage": stage});
    if offload == "cpu" {
        zero["offload_optimizer"] = json!({"device": "cpu", "pin_memory": true});
    }
    json!({
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
        "zero_optimization": zero,
        "wall_clock_breakdown": false,
    })
}

/// The estimate's GPU peak of `row`'s run: tensors only.
fn estimated_tensor_peak(dir: &tempfile::TempDir, row: &Value) -> u64 {
    let field = |k: &str| row[k].clone();
    let stage = field("stage").as_u64().expect("stage");
    let offload = field("offload_optimizer");
    let offload = offload.as_str().expect("offload_optimizer");
    let micro_batch = field("micro_batch").as_u64().expect("micro_batch");
    let seq_len = field("seq_len").as_u64().expect("seq_len").to_string();
    let model = field("model");
    let model = model.as_str().expect("model");
    let path = dir.path().join(format!("{model}_z{stage}_{offload}.json"));
    std::fs::write(&path, ds_config(stage, offload, micro_batch).to_string()).expect("config");
    let output = dsplan()
        .args(["estimate", "--config"])
        .arg(&path)
        .args(["--model", model, "--seq-len", &seq_len, "--flash-attention"])
        .args([
            "--cuda-context",
            "0B",
            "--fragmentation",
            "0",
            "--format",
            "json",
        ])
        .output()
        .expect("dsplan runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let estimate: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    estimate["full"]["peaks"]["gpu"]["bytes"]
        .as_u64()
        .expect("a GPU peak")
}

#[test]
fn the_estimate_is_within_two_percent_of_deepspeeds_measured_peak() {
    let dir = tempfile::tempdir().expect("temp dir");
    let results = format!("{}/bench/results/gpu", env!("CARGO_MANIFEST_DIR"));
    let mut measured = 0;
    let mut report = Vec::new();
    for entry in std::fs::read_dir(&results).expect("bench/results/gpu") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("readable");
        let results: Value = serde_json::from_str(&text).expect("results JSON");
        let rows = results["deepspeed_memory"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for row in rows.iter().filter(|r| r["max_allocated"].is_u64()) {
            let allocated = row["max_allocated"].as_u64().expect("measured");
            let estimate = estimated_tensor_peak(&dir, row);
            let ratio = estimate as f64 / allocated as f64;
            report.push(format!(
                "{} {} stage {} offload {}: estimate {estimate} / measured {allocated} = {ratio:.4}",
                path.file_name().expect("name").to_string_lossy(),
                row["model"],
                row["stage"],
                row["offload_optimizer"],
            ));
            assert!(
                (ratio - 1.0).abs() <= 0.02,
                "more than 2% off:\n{}",
                report.join("\n")
            );
            measured += 1;
        }
    }
    assert!(
        measured >= 4,
        "too few measured rows:\n{}",
        report.join("\n")
    );
    eprintln!("{}", report.join("\n"));
}
