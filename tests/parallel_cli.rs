//! 3D parallelism through the binary: `estimate --megatron-args` and `--config` with
//! `--tp/--pp/--sp`, `plan`'s grid and timeline, `recommend --gpus`'s ds_config and Megatron
//! flags (both read back), the refusals (exit 1, naming the flag) and `run` refusing tensor or
//! pipeline parallelism.

use serde_json::Value;

mod support;
use support::run;

const LLAMA_7B: &str = "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 11008 --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights --vocab-size 32000 --seq-length 4096 --micro-batch-size 1 --global-batch-size 64 --bf16";

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout).expect("stdout is JSON")
}

#[test]
fn estimate_with_megatron_flags_gives_both_answers_per_stage() {
    let flags = format!(
        "{LLAMA_7B} --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --sequence-parallel --recompute-granularity selective --use-distributed-optimizer --lr 3e-4 --my-own-flag 3"
    );
    let (code, stdout, stderr) = run(&[
        "estimate",
        "--gpus",
        "16",
        "--megatron-args",
        &flags,
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("--my-own-flag") && !stderr.contains("--lr"),
        "{stderr}"
    );
    let doc = json(&stdout);
    let calculator = &doc["megatron_calculator"];
    assert_eq!(calculator["formula"], "with-sequence-parallel");
    assert!(
        calculator["printed"]
            .as_str()
            .expect("printed")
            .starts_with("Theoretical memory footprints: weight and optimizer=")
    );
    let stages = doc["full"]["pipeline_stages"].as_array().expect("stages");
    assert_eq!(stages.len(), 4);
    for stage in stages {
        let peak = stage["peak_bytes"].as_u64().expect("peak");
        let after = stage["after_step_bytes"].as_u64().expect("after");
        assert!(
            peak > after && after > 0 && stage["reserved_bytes"].as_u64().expect("reserved") > peak
        );
    }
    assert_eq!(doc["parallel"]["layout"]["data"], 2);
    let (code, human, _) = run(&["estimate", "--gpus", "16", "--megatron-args", &flags]);
    assert_eq!(code, 0);
    assert!(
        human.contains("Theoretical memory footprints") && human.contains("after step"),
        "{human}"
    );
}

#[test]
fn the_four_refusals_exit_1_naming_the_flag() {
    let cases = [
        (
            format!("{LLAMA_7B} --tensor-model-parallel-size 3"),
            "24",
            "--tensor-model-parallel-size",
        ),
        (
            format!("{LLAMA_7B} --tensor-model-parallel-size 2"),
            "5",
            "--gpus",
        ),
        (
            format!("{LLAMA_7B} --make-vocab-size-divisible-by 0"),
            "8",
            "--make-vocab-size-divisible-by",
        ),
        (
            format!("{LLAMA_7B} --sequence-parallel"),
            "8",
            "--sequence-parallel",
        ),
    ];
    for (flags, gpus, flag) in cases {
        let (code, stdout, stderr) = run(&["estimate", "--gpus", gpus, "--megatron-args", &flags]);
        assert_eq!(code, 1, "{flag}: {stderr}");
        assert!(stdout.is_empty());
        assert!(
            stderr.starts_with(&format!("error: {flag}:")) && stderr.contains("help:"),
            "{flag}: {stderr}"
        );
    }
    // A checkpoint's vocabulary cannot be padded: 50257 does not split over 2 ranks.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ds.json");
    std::fs::write(&config, r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "bf16": {"enabled": true}, "tensor_parallel": {"autotp_size": 2}}"#).expect("write");
    let config = config.to_str().expect("utf-8");
    let (code, _, stderr) = run(&[
        "estimate",
        "--model",
        "gpt2",
        "--gpus",
        "2",
        "--config",
        config,
        "--seq-len",
        "1024",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cannot be padded"), "{stderr}");
    let (code, _, stderr) = run(&[
        "estimate",
        "--model",
        "llama-2-7b",
        "--gpus",
        "2",
        "--config",
        config,
        "--seq-len",
        "1024",
        "--tp",
        "4",
    ]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("error: --tp:") && stderr.contains("/tensor_parallel/autotp_size"),
        "{stderr}"
    );
}

#[test]
fn a_config_with_a_pipeline_is_estimated_per_stage() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ds.json");
    std::fs::write(&config, r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}, "pipeline": {"stages": 4}}"#).expect("write");
    let config = config.to_str().expect("utf-8");
    let (code, stdout, stderr) = run(&[
        "estimate",
        "--model",
        "llama-2-7b",
        "--gpus",
        "16",
        "--config",
        config,
        "--seq-len",
        "4096",
        "--tp",
        "2",
        "--sp",
        "megatron",
        "--flash-attention",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let doc = json(&stdout);
    assert_eq!(
        doc["full"]["pipeline_stages"]
            .as_array()
            .expect("stages")
            .len(),
        4
    );
    assert_eq!(doc["parallel"]["training"]["runtime"]["zero"], 1);
    // ZeRO-2 with a pipeline is what DeepSpeed's PipelineEngine refuses.
    std::fs::write(dir.path().join("z2.json"), r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}, "pipeline": {"stages": 2}}"#).expect("write");
    let z2 = dir.path().join("z2.json");
    let (code, _, stderr) = run(&[
        "estimate",
        "--model",
        "llama-2-7b",
        "--gpus",
        "4",
        "--config",
        z2.to_str().expect("utf-8"),
        "--seq-len",
        "4096",
    ]);
    assert_eq!(code, 1);
    assert!(stderr.contains("/zero_optimization/stage"), "{stderr}");
}

#[test]
fn plan_shows_the_grid_the_stages_and_the_timeline() {
    let flags = format!("{LLAMA_7B} --pipeline-model-parallel-size 4 --global-batch-size 16");
    let (code, stdout, stderr) = run(&["plan", "--world-size", "8", "--megatron-args", &flags]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("GPU grid") && stdout.contains("stage 3: GPUs 6-7"),
        "{stdout}"
    );
    // 1F1B, p = 4, m = 8: (p-1)/(m+p-1) = 3/11.
    assert!(stdout.contains("bubble 27.3 %"), "{stdout}");
    assert!(stdout.contains("stage 0  |0123"), "{stdout}");
    let (code, stdout, _) = run(&[
        "plan",
        "--world-size",
        "8",
        "--megatron-args",
        &flags,
        "--format",
        "json",
        "--gpu-memory",
        "1GiB",
    ]);
    assert_eq!(code, 1, "a 7B stage does not fit 1 GiB");
    let doc = json(&stdout);
    assert_eq!(doc["timeline"]["ranks"].as_array().expect("ranks").len(), 4);
    assert!((doc["bubble_fraction"].as_f64().expect("bubble") - 3.0 / 11.0).abs() < 1e-12);
}

#[test]
fn recommend_searches_layouts_and_its_launch_files_read_back() {
    let dir = tempfile::tempdir().expect("temp dir");
    let written = dir.path().join("ds_config.json");
    let written = written.to_str().expect("utf-8");
    let (code, stdout, stderr) = run(&[
        "recommend",
        "--model",
        "llama-3-70b",
        "--gpus",
        "64",
        "--gpu-memory",
        "80GiB",
        "--seq-len",
        "4096",
        "--global-batch",
        "256",
        "--flash-attention",
        "--format",
        "json",
        "--output",
        written,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let doc = json(&stdout);
    assert!(doc["examined"].as_u64().expect("examined") > 1000);
    let chosen = &doc["chosen"];
    let reserved = chosen["stage_reserved_bytes"].as_array().expect("stages");
    assert!(
        reserved
            .iter()
            .all(|b| b.as_u64().expect("bytes") <= 80 << 30)
    );
    let data = chosen["layout"]["data"].as_u64().expect("d").to_string();
    let (code, _, stderr) = run(&["validate", written, "--world-size", &data]);
    assert_eq!(code, 0, "{stderr}");
    let flags = doc["megatron_flags"].as_str().expect("flags");
    let (code, stdout, stderr) = run(&[
        "estimate",
        "--gpus",
        "64",
        "--megatron-args",
        flags,
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let back = json(&stdout);
    assert_eq!(back["parallel"]["layout"], chosen["layout"]);
    let stages = back["full"]["pipeline_stages"].as_array().expect("stages");
    let peaks: Vec<u64> = stages
        .iter()
        .map(|s| s["peak_bytes"].as_u64().expect("peak"))
        .collect();
    let chosen_peaks: Vec<u64> = chosen["stage_peak_bytes"]
        .as_array()
        .expect("peaks")
        .iter()
        .map(|b| b.as_u64().expect("peak"))
        .collect();
    assert_eq!(
        peaks, chosen_peaks,
        "the flags read back to the same memory"
    );
    let (code, _, _) = run(&[
        "recommend",
        "--model",
        "llama-3-70b",
        "--gpus",
        "8",
        "--gpu-memory",
        "16GiB",
        "--seq-len",
        "4096",
        "--global-batch",
        "8",
    ]);
    assert_eq!(code, 1, "nothing fits");
}

#[test]
fn run_refuses_tensor_and_pipeline_parallelism() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ds.json");
    std::fs::write(&config, r#"{"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "pipeline": {"stages": 2}}"#).expect("write");
    let (code, _, stderr) = run(&[
        "run",
        config.to_str().expect("utf-8"),
        "--steps",
        "1",
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("/pipeline/stages") && stderr.contains("data parallelism only"),
        "{stderr}"
    );
}
