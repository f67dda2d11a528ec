//! `dsplan plan` as a user runs it: the three formats, a trace that follows the trace-event
//! format, and the refusals (unresolved "auto", a plan that does not fit, a bad model).

use assert_cmd::Command;
use serde_json::{Value, json};
use std::collections::HashMap;

fn config_file(dir: &tempfile::TempDir, name: &str, config: &Value) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, serde_json::to_string_pretty(config).expect("json")).expect("write");
    path
}

fn stage3() -> Value {
    json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": 20000000, "offload_optimizer": {"device": "cpu"}}
    })
}

fn plan(args: &[&str]) -> assert_cmd::assert::Assert {
    Command::cargo_bin("dsplan")
        .expect("binary")
        .arg("plan")
        .args(args)
        .assert()
}

#[test]
fn human_summary_shows_each_part() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let output = plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "gpt2",
        "--world-size",
        "8",
    ])
    .success()
    .get_output()
    .stdout
    .clone();
    let text = String::from_utf8(output).expect("utf-8");
    for needle in [
        "ZeRO stage 3, 8 ranks",
        "Layout (PerParameter)",
        "persistent (kept whole)",
        "Gradient buckets:",
        "reduce-scatter",
        "Stage 3 schedule",
        "Offload:",
        "gpu peak",
        "cpu peak",
        "Step time",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
}

/// The engine the executor runs is the plan's: bf16 at stage 1 accumulating in fp32 runs stage
/// 1's flat partition as `BF16_Optimizer`, with its parameter all-gather planned; bf16 without
/// ZeRO is `FP16_Optimizer` with the states on every rank; shown in both forms.
#[test]
fn the_run_policy_is_shown_in_both_forms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 1},
        "data_types": {"grad_accum_dtype": "fp32"},
    });
    let file = config_file(&dir, "bf16.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [path, "--model", "tiny-gpt2", "--world-size", "2"];
    let text = String::from_utf8(plan(&args).success().get_output().stdout.clone()).expect("utf-8");
    assert!(
        text.contains(
            "engine: flat partition (stage 1's), as BF16_Optimizer; gradient norm: BF16_Optimizer"
        ),
        "{text}"
    );
    assert!(
        text.contains("gradient average: summed, then divided by the world size"),
        "{text}"
    );
    assert!(
        text.contains("Parameter all-gather after the step"),
        "{text}"
    );
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let value: Value =
        serde_json::from_slice(&plan(&json_args).success().get_output().stdout).expect("json");
    assert_eq!(
        value["run"],
        json!({"optimizer": "bf16-optimizer", "engine": "flat-partition", "engine_stage": 1,
            "clip": "bf16-optimizer", "averaging": {"rule": "post-multiply", "predivide_factor": 1.0}})
    );
    assert_eq!(
        value["buckets"]["param_gather"]["shards"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    let mut zero0 = config.clone();
    zero0["zero_optimization"]["stage"] = json!(0);
    zero0
        .as_object_mut()
        .expect("an object")
        .remove("data_types");
    let file0 = config_file(&dir, "bf16_zero0.json", &zero0);
    let mut args0 = json_args.clone();
    args0[0] = file0.to_str().expect("utf-8");
    let value0: Value =
        serde_json::from_slice(&plan(&args0).success().get_output().stdout).expect("json");
    assert_eq!(
        value0["run"],
        json!({"optimizer": "fp16-optimizer", "engine": "replicated", "engine_stage": 0,
            "clip": "fp16-optimizer", "averaging": {"rule": "post-multiply", "predivide_factor": 1.0}})
    );
    assert!(value0["buckets"]["param_gather"].is_null(), "{value0}");
    // The run's loop: the optimizer as the executor builds it, the loss scaling, clipping
    // and schedule, in both forms.
    assert!(
        text.contains(
            "optimizer: AdamW lr 0.0001 betas (0.9, 0.999) eps 0.00000001 weight decay 0 (decoupled), bias correction"
        ),
        "{text}"
    );
    assert!(
        text.contains("training: bf16, loss scale 1, a step with inf/NaN gradients is skipped; clip at 1; constant lr"),
        "{text}"
    );
    assert_eq!(
        value["training"]["optimizer"],
        json!({"name": "AdamW", "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
            "weight_decay": 0.0, "decay": "decoupled", "bias_correction": "enabled"})
    );
    assert_eq!(
        value["training"]["loss_scaling"],
        json!({"precision": "bf16", "overflow": "skip-step"})
    );
    // DeepSpeed 0.19.8's default gradient_clipping is 1.0.
    assert_eq!(value["training"]["clip_threshold"], json!(1.0));
    assert_eq!(value["training"]["schedule"], Value::Null);
}

/// DeepSpeed's fp16 trap and a schedule, as `dsplan plan` shows them; what `dsplan run` would
/// refuse is a warning for dsplan's backends and no training policy for DeepSpeed's.
#[test]
fn the_training_policy_follows_deepspeeds_fp16_defaults_and_names_refusals() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "fp16": {"enabled": true},
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": false}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    });
    let file = config_file(&dir, "fp16.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [path, "--model", "tiny-gpt2", "--world-size", "2"];
    let text = String::from_utf8(plan(&args).success().get_output().stdout.clone()).expect("utf-8");
    assert!(
        text.contains("fp16, dynamic loss scale from 2^32 (window 1000, hysteresis 1, min 1; ZeRO's DynamicLossScaler defaults"),
        "{text}"
    );
    assert!(text.contains("clip at 1; WarmupLR schedule"), "{text}");
    assert!(text.contains("weight decay 0 (L2)"), "{text}");
    // One scaler key written: the config's values, 2^16 and hysteresis 2.
    let mut written = config.clone();
    written["fp16"]["loss_scale_window"] = json!(500);
    let file = config_file(&dir, "fp16_written.json", &written);
    let path = file.to_str().expect("utf-8");
    let mut json_args = vec![path, "--model", "tiny-gpt2", "--world-size", "2"];
    json_args.extend(["--format", "json"]);
    let value: Value =
        serde_json::from_slice(&plan(&json_args).success().get_output().stdout).expect("json");
    let scaling = &value["training"]["loss_scaling"];
    assert_eq!(scaling["args"], json!("config"), "{scaling}");
    assert_eq!(scaling["scale"]["initial_scale_power"], json!(16));
    assert_eq!(scaling["scale"]["hysteresis"], json!(2));
    assert_eq!(value["training"]["schedule"]["type"], json!("WarmupLR"));

    // Lamb: DeepSpeed trains it (no policy, no warning); dsplan run would refuse it.
    let mut lamb = config.clone();
    lamb["optimizer"] = json!({"type": "Lamb", "params": {"lr": 1e-3}});
    lamb["zero_allow_untested_optimizer"] = json!(true);
    let file = config_file(&dir, "lamb.json", &lamb);
    let path = file.to_str().expect("utf-8");
    let deepspeed = plan(&[
        path,
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--format",
        "json",
    ])
    .success()
    .get_output()
    .clone();
    let value: Value = serde_json::from_slice(&deepspeed.stdout).expect("json");
    assert!(value.get("training").is_none(), "{value}");
    let cpu = plan(&[
        path,
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--backend",
        "dsplan-cpu",
    ])
    .success()
    .get_output()
    .clone();
    let stderr = String::from_utf8_lossy(&cpu.stderr);
    assert!(
        stderr.contains("dsplan run refuses this config: optimizer `Lamb` is not implemented"),
        "{stderr}"
    );
}

#[test]
fn json_is_the_whole_plan_and_deterministic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let run = || {
        let out = plan(&[
            file.to_str().expect("utf-8"),
            "--model",
            "tiny-gpt2",
            "--world-size",
            "2",
            "--format",
            "json",
        ])
        .success()
        .get_output()
        .stdout
        .clone();
        String::from_utf8(out).expect("utf-8")
    };
    let first = run();
    assert_eq!(first, run());
    let plan: Value = serde_json::from_str(&first).expect("json");
    for key in [
        "layout",
        "shards",
        "buckets",
        "stage3",
        "offload",
        "buffers",
        "timeline",
        "graph",
        "diagnostics",
    ] {
        assert!(plan.get(key).is_some(), "missing {key}");
    }
    assert_eq!(plan["settings"]["stage"], 3);
}

/// Checks the trace-event format: metadata names every row used, complete events have a
/// non-negative start and duration, and slices on one row never partly overlap (Perfetto and
/// chrome://tracing need each row properly nested).
fn check_trace(trace: &Value) -> usize {
    let events = trace["traceEvents"].as_array().expect("traceEvents array");
    let mut named = std::collections::HashSet::new();
    let mut rows: HashMap<i64, Vec<(f64, f64)>> = HashMap::new();
    for event in events {
        let ph = event["ph"].as_str().expect("ph");
        assert!(
            event["name"].is_string() && event["pid"].is_i64() && event["tid"].is_i64(),
            "{event}"
        );
        let tid = event["tid"].as_i64().expect("tid");
        match ph {
            "M" => {
                if event["name"] == "thread_name" {
                    named.insert(tid);
                }
            }
            "X" => {
                let ts = event["ts"].as_f64().expect("ts");
                let dur = event["dur"].as_f64().expect("dur");
                assert!(ts >= 0.0 && dur >= 0.0, "{event}");
                rows.entry(tid).or_default().push((ts, ts + dur));
            }
            "C" => assert!(event["args"].is_object()),
            other => panic!("unexpected phase {other}"),
        }
    }
    for (tid, mut slices) in rows.clone() {
        assert!(named.contains(&tid), "row {tid} has no thread_name");
        slices.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in slices.windows(2) {
            assert!(
                pair[1].0 + 1e-3 >= pair[0].1,
                "row {tid}: slices overlap {pair:?}"
            );
        }
    }
    rows.len()
}

#[test]
fn trace_follows_the_trace_event_format() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let out = plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "gpt2",
        "--world-size",
        "16",
        "--format",
        "trace",
    ])
    .success()
    .get_output()
    .stdout
    .clone();
    let trace: Value = serde_json::from_slice(&out).expect("json");
    let rows = check_trace(&trace);
    assert!(rows >= 4, "compute, gather, reduce and copy rows: {rows}");
    assert_eq!(trace["otherData"]["zero_stage"], 3);
}

#[test]
fn unresolved_auto_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = stage3();
    config["train_micro_batch_size_per_gpu"] = json!("auto");
    let file = config_file(&dir, "auto.json", &config);
    let assert = plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "gpt2",
        "--world-size",
        "8",
    ])
    .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    assert!(stderr.contains("needs-resolution"), "{stderr}");
}

#[test]
fn a_plan_over_the_gpu_memory_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let assert = plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "gpt2",
        "--world-size",
        "8",
        "--gpu-memory",
        "1GiB",
    ])
    .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    assert!(stderr.contains("exceeds --gpu-memory"), "{stderr}");
}

#[test]
fn silent_fallbacks_become_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"}}
    });
    let file = config_file(&dir, "z2.json", &config);
    let out = plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--format",
        "json",
    ])
    .success()
    .get_output()
    .stdout
    .clone();
    let plan: Value = serde_json::from_slice(&out).expect("json");
    let codes: Vec<&str> = plan["diagnostics"]
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|d| d["code"].as_str())
        .collect();
    assert_eq!(
        codes
            .iter()
            .filter(|c| **c == "ineffective-at-stage")
            .count(),
        2,
        "{codes:?}"
    );
    assert_eq!(plan["settings"]["offload_optimizer"]["device"], "cpu");
    assert_eq!(plan["settings"]["offload_param"]["device"], "none");
}

#[test]
fn a_count_only_model_cannot_be_planned() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    plan(&[
        file.to_str().expect("utf-8"),
        "--model",
        "no-such-model",
        "--world-size",
        "8",
    ])
    .failure();
}

fn json_plan(file: &std::path::Path, extra: &[&str]) -> Value {
    let mut args = vec![
        file.to_str().expect("utf-8"),
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = plan(&args).success().get_output().stdout.clone();
    serde_json::from_slice(&out).expect("json")
}

#[test]
fn the_cpu_backend_lists_the_cpu_executors_buffers_in_host_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let offloaded = json!({
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    });
    for (name, config) in [("z2.json", offloaded), ("z3.json", stage3())] {
        let file = config_file(&dir, name, &config);
        let gpu = json_plan(&file, &[]);
        // The default is DeepSpeed on GPUs, printed as before: no backend key.
        assert!(gpu["settings"].get("backend").is_none(), "{name}");
        assert_eq!(
            gpu,
            json_plan(&file, &["--backend", "deepspeed-gpu"]),
            "{name}"
        );
        let cpu = json_plan(&file, &["--backend", "dsplan-cpu"]);
        assert_eq!(cpu["settings"]["backend"], "dsplan-cpu", "{name}");
        let buffers = cpu["buffers"].as_array().expect("buffers");
        let kinds: Vec<&str> = buffers.iter().filter_map(|b| b["kind"].as_str()).collect();
        for buffer in buffers {
            assert_eq!(buffer["device"], "cpu", "{name}: {buffer}");
        }
        // Nothing is copied between devices on a CPU: no offload staging.
        assert!(!kinds.contains(&"offload-staging"), "{name}: {kinds:?}");
        for kind in [
            "activation-arena",
            "gathered-parameters",
            "module-gradients",
        ] {
            assert!(kinds.contains(&kind), "{name}: no {kind} in {kinds:?}");
        }
        let devices = cpu["timeline"]["devices"].as_array().expect("devices");
        assert_eq!(devices.len(), 1, "{name}");
        assert_eq!(devices[0]["device"], "cpu", "{name}");
        // The same layout, shards and reduction buckets as the GPU plan (the parameter
        // all-gather is cut in pieces: the in-process collectives have no
        // all_gather_into_tensor).
        for part in ["layout", "shards"] {
            assert_eq!(cpu[part], gpu[part], "{name}: {part}");
        }
        assert_eq!(cpu["buckets"]["reduce"], gpu["buckets"]["reduce"], "{name}");
    }
}

#[test]
fn the_cpu_backend_is_named_in_the_summary_and_refuses_what_it_cannot_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let path = file.to_str().expect("utf-8");
    let out = plan(&[
        path,
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--backend",
        "dsplan-cpu",
    ])
    .success()
    .get_output()
    .stdout
    .clone();
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("backend: dsplan-cpu"), "{text}");
    assert!(text.contains("cpu peak"), "{text}");
    assert!(!text.contains("gpu peak"), "{text}");
    assert!(text.contains("activation arena"), "{text}");
    // A tiny model's table is in the unit its peak fills, not `0.00 GiB` throughout.
    assert!(text.contains(" MiB at "), "{text}");
    assert!(!text.contains("0.00 GiB"), "{text}");
    // The GPU cost model says nothing about a CPU run.
    assert!(
        text.contains("Step time: not predicted for the dsplan-cpu backend"),
        "{text}"
    );
    assert!(!text.contains("H100"), "{text}");

    // Only GPT-2 and the Llama family run on the CPU executor.
    let assert = plan(&[
        path,
        "--model",
        "t5-3b",
        "--world-size",
        "2",
        "--seq-len",
        "16",
        "--backend",
        "dsplan-cpu",
    ])
    .code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    assert!(
        stderr.contains("runs GPT-2 and Llama-family models only"),
        "{stderr}"
    );

    // A GPU memory limit means nothing for host buffers.
    let assert = plan(&[
        path,
        "--model",
        "tiny-gpt2",
        "--world-size",
        "2",
        "--backend",
        "dsplan-cpu",
        "--gpu-memory",
        "1GiB",
    ])
    .code(2);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    assert!(stderr.contains("--gpu-memory applies"), "{stderr}");
}

#[test]
fn the_cuda_backend_lists_the_device_steps_buffers_on_one_and_two_gpus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2}
    });
    let file = config_file(&dir, "z2.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [
        path,
        "--model",
        "gpt2",
        "--world-size",
        "1",
        "--backend",
        "dsplan-cuda",
    ];
    let out = plan(&args).success().get_output().stdout.clone();
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("backend: dsplan-cuda"), "{text}");
    assert!(text.contains("gpu peak"), "{text}");

    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let out = plan(&json_args).success().get_output().stdout.clone();
    let plan_json: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(plan_json["settings"]["backend"], "dsplan-cuda");
    let buffers = plan_json["buffers"].as_array().expect("buffers");
    for buffer in buffers {
        assert_eq!(buffer["device"], "gpu", "{buffer}");
    }
    // bf16 parameters and gradients, fp32 master and two Adam moments of the unpadded
    // parameter count; no buckets at stage 2 on one GPU.
    let numel = |name: &str| {
        buffers
            .iter()
            .find(|b| b["name"] == name)
            .and_then(|b| b["numel"].as_u64())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let psi = plan_json["model"]["total_params"].as_u64().expect("params");
    for name in [
        "parameters",
        "gradients",
        "fp32 master weights",
        "AdamW exp_avg",
    ] {
        assert_eq!(numel(name), psi, "{name}");
    }
    assert!(
        !buffers.iter().any(|b| b["kind"] == "gradient-buckets"),
        "{buffers:?}"
    );

    // Two GPUs: one rank's buffers, the master and moments its half of the padded flat
    // buffer; bf16 without ZeRO (DeepSpeed's `FP16_Optimizer` over bf16) plans the master whole
    // on every rank.
    let mut two = json_args.clone();
    two[4] = "2";
    let out = plan(&two).success().get_output().stdout.clone();
    let plan_json: Value = serde_json::from_slice(&out).expect("json");
    let buffers = plan_json["buffers"].as_array().expect("buffers");
    let master = buffers
        .iter()
        .find(|b| b["name"] == "fp32 master weights")
        .and_then(|b| b["numel"].as_u64())
        .expect("master");
    assert_eq!(master, psi.div_ceil(4) * 2, "{buffers:?}");

    let mut zero0 = config.clone();
    zero0["zero_optimization"]["stage"] = json!(0);
    let file0 = config_file(&dir, "z0.json", &zero0);
    let mut replicated = json_args.clone();
    replicated[0] = file0.to_str().expect("utf-8");
    replicated[4] = "2";
    let out = plan(&replicated).success().get_output().stdout.clone();
    let plan_json: Value = serde_json::from_slice(&out).expect("json");
    let master = plan_json["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .find(|b| b["name"] == "fp32 master weights")
        .and_then(|b| b["numel"].as_u64())
        .expect("master");
    assert_eq!(master, psi, "the whole master on each of the two ranks");
}

/// At stage 3 on several GPUs the `dsplan-cuda` plan shows the gathered-parameter arena it
/// places (human: its size against the model's; JSON: every tensor's place), and its buffer
/// list allocates the arena: a schedule that releases needs less than the model.
#[test]
fn the_cuda_stage3_plan_shows_its_parameter_arena() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {
            "stage": 3,
            "stage3_max_reuse_distance": 0,
            "stage3_max_live_parameters": 30_000_000,
            "stage3_prefetch_bucket_size": 5_000_000
        }
    });
    let file = config_file(&dir, "z3.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [
        path,
        "--model",
        "gpt2",
        "--world-size",
        "8",
        "--backend",
        "dsplan-cuda",
    ];
    let out = plan(&args).success().get_output().stdout.clone();
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("device parameter arena"), "{text}");

    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let out = plan(&json_args).success().get_output().stdout.clone();
    let plan_json: Value = serde_json::from_slice(&out).expect("json");
    let arena = &plan_json["stage3"]["arena"];
    let numel = arena["numel"].as_u64().expect("arena size");
    let total = plan_json["model"]["total_params"].as_u64().expect("model");
    assert!(numel < total, "{numel} of {total}");
    assert!(!arena["spans"].as_array().expect("places").is_empty());
    let gathered = plan_json["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .find(|b| b["kind"] == "gathered-parameters")
        .expect("the arena's buffer");
    assert_eq!(gathered["numel"].as_u64(), Some(numel), "{gathered}");
}

/// The dsplan-cuda plan counts what the executor holds on the GPU beyond its buffers (the
/// CUDA context, cuBLASLt's workspace, the kernel modules, and NCCL's buffers on several
/// GPUs), and `--gpu-memory` holds that total, not the buffers alone, against the device.
#[test]
fn the_cuda_plan_counts_the_runtime_on_the_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 16,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 0}
    });
    let file = config_file(&dir, "gpt2.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [
        path,
        "--model",
        "gpt2",
        "--world-size",
        "1",
        "--seq-len",
        "1024",
        "--backend",
        "dsplan-cuda",
        "--format",
        "json",
    ];
    let value: Value =
        serde_json::from_slice(&plan(&args).success().get_output().stdout).expect("json");
    let runtime = value["device_runtime"]["bytes"]
        .as_u64()
        .expect("a runtime");
    // What an H200 and an H100 showed beyond the buffers for this job (2026-11-27).
    assert_eq!(runtime, 9_918_283_776 - 9_296_739_824);
    let peak = value["timeline"]["devices"][0]["peak"]["bytes"]
        .as_u64()
        .expect("a peak");
    assert_eq!(peak, 9_296_739_824, "the buffers the H200 allocated");
    // Fits in the buffers alone, not with the runtime.
    let limit = format!("{}B", peak + runtime / 2);
    let mut tight = args[..9].to_vec();
    tight.extend(["--gpu-memory", &limit]);
    let assert = plan(&tight).code(1);
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    assert!(stderr.contains("with the CUDA runtime"), "{stderr}");
    let human = plan(&args[..9]).success().get_output().stdout.clone();
    let text = String::from_utf8(human).expect("utf-8");
    assert!(
        text.contains("on the device (nvidia-smi): 9.24 GiB"),
        "{text}"
    );
}

/// `--compare deepspeed-gpu` sets DeepSpeed's GPU peak beside dsplan's, kind by kind, each at
/// its own peak: at ZeRO stage 2 on 8 GPUs dsplan's peak is below DeepSpeed's, and each side's
/// rows add up to its peak.
#[test]
fn compare_sets_deepspeeds_peak_beside_dsplans_kind_by_kind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "overlap_comm": true}
    });
    let file = config_file(&dir, "z2.json", &config);
    let path = file.to_str().expect("utf-8");
    let args = [
        path,
        "--model",
        "gpt2-medium",
        "--world-size",
        "8",
        "--seq-len",
        "1024",
        "--backend",
        "dsplan-cuda",
        "--compare",
        "deepspeed-gpu",
    ];
    let text = String::from_utf8(plan(&args).success().get_output().stdout.clone()).expect("utf-8");
    assert!(text.contains("GPU peak against deepspeed-gpu"), "{text}");
    let mut json_args = args.to_vec();
    json_args.extend(["--format", "json"]);
    let value: Value =
        serde_json::from_slice(&plan(&json_args).success().get_output().stdout).expect("json");
    let compare = &value["compare"];
    assert_eq!(compare["backend"], "deepspeed-gpu");
    let ours = compare["plan_gpu_peak_bytes"].as_u64().expect("ours");
    let theirs = compare["gpu_peak_bytes"].as_u64().expect("theirs");
    assert!(0 < ours && ours < theirs, "{ours} vs {theirs}");
    let rows = compare["by_kind"].as_array().expect("rows");
    let sum = |side: &str| -> u64 { rows.iter().map(|r| r[side].as_u64().unwrap_or(0)).sum() };
    assert_eq!(sum("bytes"), ours, "dsplan's rows add up to its peak");
    assert_eq!(
        sum("compared_bytes"),
        theirs,
        "DeepSpeed's rows add up to its peak"
    );
    let parameters = rows
        .iter()
        .find(|r| r["kind"] == "parameters")
        .expect("a parameters row");
    assert_eq!(
        parameters["bytes"], parameters["compared_bytes"],
        "both hold the whole bf16 parameters at stage 2"
    );
}

/// Under offload the `dsplan-cuda` plan lists the host buffers, pinned or not, and the copies
/// of a step with their bytes; `--format json` carries the same buffers and transfers.
#[test]
fn a_dsplan_cuda_offload_plan_lists_host_buffers_and_copies() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = config_file(&dir, "z3.json", &stage3());
    let args = |format: &'static str| {
        vec![
            file.to_str().expect("utf-8").to_string(),
            "--model".into(),
            "gpt2".into(),
            "--world-size".into(),
            "2".into(),
            "--seq-len".into(),
            "128".into(),
            "--backend".into(),
            "dsplan-cuda".into(),
            "--format".into(),
            format.into(),
        ]
    };
    let text_args = args("human");
    let text = plan(&text_args.iter().map(String::as_str).collect::<Vec<_>>())
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).expect("utf-8");
    assert!(text.contains("Host and NVMe buffers of one rank"), "{text}");
    assert!(text.contains("pageable  fp32 master (host)"), "{text}");
    assert!(
        text.contains("pinned    gradient staging (host, bf16)"),
        "{text}"
    );
    assert!(
        text.contains("gradients to the host (bf16, copy stream)"),
        "{text}"
    );
    let json_args = args("json");
    let json = plan(&json_args.iter().map(String::as_str).collect::<Vec<_>>())
        .success()
        .get_output()
        .stdout
        .clone();
    let json: Value = serde_json::from_slice(&json).expect("json");
    let host: Vec<&Value> = json["buffers"]
        .as_array()
        .expect("buffers")
        .iter()
        .filter(|b| b["device"] == "cpu")
        .collect();
    assert!(host.iter().any(|b| b["pinning"] == "pinned"), "{host:?}");
    assert!(
        json["offload"]["totals"]["device_to_host"]
            .as_u64()
            .is_some_and(|b| b > 0)
    );
}
