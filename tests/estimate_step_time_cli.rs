//! `dsplan estimate --step-time`: the step time `recommend`'s cost model predicts for one given
//! config. The config `recommend` chose, estimated again with the same constants, must get
//! the very figure `recommend` ranked it by; without `--step-time` the output has no step and
//! the cost flags are refused.

use serde_json::Value;

mod support;
use support::dsplan;

/// The cost constants both commands get (an H200's HBM, PCIe 5.0, a slower efficiency).
const COST: [&str; 6] = [
    "--hbm-gbps",
    "4800",
    "--host-link-gbps",
    "64",
    "--compute-efficiency",
    "0.3",
];

fn json_of(args: &[&str]) -> Value {
    let output = dsplan().args(args).output().expect("dsplan runs");
    assert!(
        output.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("stdout is JSON")
}

#[test]
fn the_estimate_predicts_the_step_recommend_ranked_the_config_by() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ds_config.json");
    let config = config.to_str().expect("utf-8");
    let mut args = vec![
        "recommend",
        "--model",
        "gpt2-medium",
        "--gpus-per-node",
        "1",
        "--gpu-memory",
        "12GiB",
        "--cpu-memory",
        "64GiB",
        "--seq-len",
        "1024",
        "--global-batch",
        "16",
        "--flash-attention",
        "--format",
        "json",
        "--output",
        config,
    ];
    args.extend(COST);
    let recommended = json_of(&args);
    let chosen = &recommended["chosen"]["step_time"];
    assert!(chosen["total"].as_f64().expect("a step time") > 0.0);

    let mut args = vec![
        "estimate",
        "--config",
        config,
        "--model",
        "gpt2-medium",
        "--lm-head",
        "include",
        "--seq-len",
        "1024",
        "--flash-attention",
        "--step-time",
        "--format",
        "json",
    ];
    args.extend(COST);
    let estimated = json_of(&args);
    assert_eq!(&estimated["step_time"]["seconds"], chosen);
    assert_eq!(
        estimated["step_time"]["cost_model"]["hbm_bandwidth"],
        4.8e12
    );
    assert_eq!(
        estimated["full"]["peaks"]["gpu"],
        recommended["chosen"]["gpu_peak"]
    );

    // Without --step-time: no step in the output, and the constants are refused.
    let plain: Vec<&str> = args
        .iter()
        .take(args.len() - COST.len())
        .filter(|arg| **arg != "--step-time")
        .copied()
        .collect();
    let plain = json_of(&plain);
    assert!(plain.get("step_time").is_none(), "{plain}");
    let refused = dsplan()
        .args(["estimate", "--config", config, "--model", "gpt2-medium"])
        .args(["--seq-len", "1024", "--hbm-gbps", "4800"])
        .output()
        .expect("dsplan runs");
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("need --step-time"), "{stderr}");
}

#[test]
fn a_meaningless_cost_constant_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("ds_config.json");
    std::fs::write(
        &config,
        r#"{"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}"#,
    )
    .expect("config");
    let output = dsplan()
        .args(["estimate", "--config"])
        .arg(&config)
        .args(["--model", "gpt2", "--seq-len", "128", "--step-time"])
        .args(["--compute-efficiency", "1.5"])
        .output()
        .expect("dsplan runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("compute_efficiency"), "{stderr}");
}
