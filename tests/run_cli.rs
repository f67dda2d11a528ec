//! `dsplan run` as a user runs it: the README's main command, the metrics file against the
//! planner's learning-rate schedule and loss-scale state machine, the saved model, the data
//! formats, and the errors with their exit codes.

use dsplan_executor::data::{LlmcFormat, write_llmc_tokens};
use dsplan_executor::io::safetensors::load_params;
use dsplan_executor::model::ParamLayout;
use dsplan_executor::train::{TrainSettings, choose_model};
use serde_json::{Value, json};

mod support;
use support::{config_path, dsplan, run};

fn write_config(dir: &std::path::Path, config: &Value) -> String {
    let path = dir.join("ds_config.json");
    std::fs::write(&path, config.to_string()).expect("config written");
    path.display().to_string()
}

#[test]
fn the_readme_command_trains_and_reports_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    let metrics = dir.path().join("metrics.jsonl");
    let model = dir.path().join("model.safetensors");
    let config = config_path("zero2_fp16.json");
    let (code, stdout, stderr) = run(&[
        "run",
        &config,
        "--world-size",
        "2",
        "--steps",
        "12",
        "--seq-len",
        "32",
        "--metrics",
        metrics.to_str().expect("utf-8"),
        "--save-model",
        model.to_str().expect("utf-8"),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("running on the CPU"), "{stderr}");
    assert!(stderr.contains("[Rank 0] step=10, skipped="), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("summary JSON");
    assert_eq!(summary["steps"], 12);
    assert_eq!(summary["stage"], 2);
    assert_eq!(summary["precision"], "fp16");
    let memory = &summary["memory"];
    let ranks = memory["ranks"].as_array().expect("ranks");
    assert_eq!(ranks.len(), 2);
    for rank in ranks {
        assert_eq!(rank["peak"], memory["predicted"]);
        assert!(rank["peak_total"].as_u64().expect("bytes") > 0);
    }
    // Next to the plan's prediction (a dsplan-cpu plan: the executor's own buffers): equal in
    // every category and in total, with no note.
    let categories = memory["categories"].as_array().expect("categories");
    assert_eq!(categories.len(), 8);
    for category in categories {
        let name = category["category"].as_str().expect("name");
        assert_eq!(category["same_as_plan"], true, "{name}");
        assert!(category["note"].is_null(), "{name}");
        assert_eq!(&ranks[0]["peak"][name], &category["plan"], "{name}");
    }
    assert_eq!(ranks[0]["peak_total"], memory["plan"]["peak_total"]);
    assert!(memory["plan"]["peak_total"].as_u64().expect("bytes") > 0);

    // Every metrics line has the documented keys; lr and loss_scale follow the planner.
    let text = std::fs::read_to_string(&metrics).expect("metrics written");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(lines.len(), 12);
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(&config).expect("config")).expect("JSON");
    let settings = TrainSettings::from_config(&raw, 2).expect("settings");
    let schedule = settings.training.schedule.as_ref().expect("WarmupLR");
    let mut scaler = settings
        .precision()
        .loss_scaler(settings.stage)
        .expect("scaler");
    let mut applied = 0;
    for (step, line) in lines.iter().enumerate() {
        for key in [
            "step",
            "loss",
            "lr",
            "grad_norm",
            "loss_scale",
            "skipped",
            "tokens_per_s",
        ] {
            assert!(line.get(key).is_some(), "line {step} lacks {key}: {line}");
        }
        assert_eq!(line["step"], step);
        assert_eq!(
            line["lr"].as_f64(),
            Some(schedule.lr_at(applied)),
            "step {step}"
        );
        assert_eq!(
            line["loss_scale"].as_f64(),
            Some(scaler.scale()),
            "step {step}"
        );
        let skipped = line["skipped"].as_bool().expect("bool");
        scaler.update(skipped).expect("scale");
        if !skipped {
            applied += 1;
        }
    }

    let tiny = choose_model(None, 1234).expect("tiny preset");
    let layout = ParamLayout::new(tiny.config.gpt2().expect("a GPT-2"));
    let trained = load_params(&model, &layout).expect("saved model loads");
    assert_eq!(trained.len(), tiny.params.len());
    assert_ne!(trained, tiny.params, "training moved the parameters");
}

#[test]
fn llmc_tokens_and_text_files_train_and_breakdowns_print() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens: Vec<u32> = (0..4000u32).map(|i| (i * 7 + i / 13) % 256).collect();
    let bin = dir.path().join("tokens.bin");
    std::fs::write(
        &bin,
        write_llmc_tokens(LlmcFormat::Gpt2, &tokens).expect("encodable"),
    )
    .expect("written");
    let text = dir.path().join("corpus.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog. ".repeat(60),
    )
    .expect("written");
    let config = write_config(
        dir.path(),
        &json!({
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2,
            "steps_per_print": 2,
            "wall_clock_breakdown": true,
            "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        }),
    );
    for data in [&bin, &text] {
        let (code, _, stderr) = run(&[
            "run",
            &config,
            "--data",
            data.to_str().expect("utf-8"),
            "--world-size",
            "2",
            "--steps",
            "4",
            "--seq-len",
            "16",
            "--device",
            "cpu",
        ]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stderr.contains("[Rank 0] step=4, skipped=0"), "{stderr}");
        assert!(stderr.contains("time (ms) | fwd:"), "{stderr}");
        assert!(
            !stderr.contains("running on the CPU"),
            "--device cpu needs no notice"
        );
    }
}

#[test]
fn autos_are_resolved_as_the_trainer_resolves_them_and_the_plan_is_followed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        dir.path(),
        &json!({
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
            "steps_per_print": 3,
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
            "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0,
                "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
            "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto"},
        }),
    );
    let metrics = dir.path().join("metrics.jsonl");
    let (code, stdout, stderr) = run(&[
        "run",
        &config,
        "--world-size",
        "2",
        "--steps",
        "6",
        "--seq-len",
        "16",
        "--per-device-train-batch-size",
        "2",
        "--gradient-accumulation-steps",
        "2",
        "--learning-rate",
        "2e-3",
        "--warmup-steps",
        "2",
        "--metrics",
        metrics.to_str().expect("utf-8"),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("stage 3: "), "the plan's line: {stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("summary JSON");
    assert_eq!(summary["stage"], 3);
    assert_eq!(summary["steps"], 6);
    // Micro batch 2 × accumulation 2 × 2 ranks, from the flags.
    assert!(
        stderr.contains("2 x 16 tokens per rank and micro-step, 2 micro-step(s), global batch 8"),
        "{stderr}"
    );
    // WarmupDecayLR from 0 to the flag's 2e-3 over 2 steps, decaying to 0 at step 6 (--steps).
    let lrs: Vec<f64> = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("JSON");
            line["lr"].as_f64().expect("lr")
        })
        .collect();
    assert_eq!(lrs.len(), 6);
    assert_eq!(lrs[0], 0.0);
    assert!((lrs[2] - 2e-3).abs() < 1e-12, "{lrs:?}");
    assert!(lrs[5] < lrs[2], "{lrs:?}");
}

#[test]
fn the_human_summary_puts_the_plans_prediction_next_to_each_measured_category() {
    let (code, _, stderr) = run(&[
        "run",
        &config_path("zero2_offload_cpu.json"),
        "--world-size",
        "2",
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("measured by the executor vs predicted by the plan"),
        "{stderr}"
    );
    for row in [
        "params",
        "master",
        "optimizer",
        "grads",
        "buckets",
        "activations",
    ] {
        assert!(
            stderr.lines().any(|l| l.trim_start().starts_with(row)),
            "no {row} row: {stderr}"
        );
    }
    assert!(stderr.contains("same buffers"), "{stderr}");
    // The dsplan-cpu plan lists the executor's own buffers: no category differs, and under
    // optimizer offload there is no staging to copy through on a CPU.
    assert!(!stderr.contains("differs"), "{stderr}");
    assert!(!stderr.contains("offload staging"), "{stderr}");
    assert!(!stderr.contains("plan only"), "{stderr}");
}

#[test]
fn refusals_say_why_with_the_contract_exit_codes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let zero2 = config_path("zero2_fp16.json");

    let (code, _, stderr) = run(&["run", "/nonexistent/ds_config.json"]);
    assert_eq!(code, 2, "{stderr}");

    // A mismatch with a given training argument is the Trainer's error, with the file's line.
    let explicit = write_config(
        dir.path(),
        &json!({"train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}),
    );
    let (code, _, stderr) = run(&["run", &explicit, "--steps", "1", "--learning-rate", "5e-4"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("auto-mismatch"), "{stderr}");
    assert!(stderr.contains("/optimizer/params/lr"), "{stderr}");
    assert!(stderr.contains("dsplan resolve"), "{stderr}");

    // An "auto" nothing fills: a bucket size needs a hidden size, total_num_steps the steps.
    let decay = write_config(
        dir.path(),
        &json!({"train_micro_batch_size_per_gpu": 2,
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}}),
    );
    let (code, _, stderr) = run(&["run", &decay]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("total_num_steps"), "{stderr}");

    let lamb = write_config(
        dir.path(),
        &json!({"train_micro_batch_size_per_gpu": 1,
                "optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}),
    );
    let (code, _, stderr) = run(&["run", &lamb, "--steps", "1"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("`Lamb` is not implemented"), "{stderr}");

    // A family the executor does not train is a usage error; a Llama-family model it trains
    // but that cannot fit this machine is refused by the memory pre-flight, before allocating.
    let (code, _, stderr) = run(&["run", &zero2, "--model", "t5-3b", "--steps", "1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("Llama-family"), "{stderr}");
    let (code, _, stderr) = run(&["run", &zero2, "--model", "llama-2-7b", "--steps", "1"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("memory pre-flight"), "{stderr}");

    // The NVMe config's `/local_nvme`, where it does not exist: an error on its nvme_path.
    if !std::path::Path::new("/local_nvme").exists() {
        let nvme = config_path("zero3_offload_nvme.json");
        let (code, _, stderr) = run(&["run", &nvme, "--steps", "1"]);
        assert_eq!(code, 1, "{stderr}");
        assert!(
            stderr.contains("/zero_optimization/offload_optimizer/nvme_path")
                && stderr.contains("--nvme-path"),
            "{stderr}"
        );
    }
}

/// `--device cuda` with the default model fails cleanly on any machine: without a usable GPU
/// it names what is missing (driver, device, libraries); with one, tiny-gpt2's head size of
/// 16, which has no attention kernel. The same at `--world-size 2` and as rank 1 of a
/// torchrun-style job. `--device auto` trains on the CPU after exactly one notice line saying
/// why.
#[test]
fn device_cuda_fails_cleanly_and_auto_falls_back_with_one_notice() {
    let zero2 = config_path("zero2_fp16.json");
    let (code, stdout, stderr) = run(&["run", &zero2, "--device", "cuda", "--steps", "1"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let error: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(error.len(), 1, "{stderr}");
    let reasons = [
        "no CUDA driver found",
        "reports no GPU",
        "failed to initialise",
        "is not supported",
        "cannot be loaded",
        "head size (n_embd / n_head) is 16",
    ];
    assert!(
        error[0].starts_with("error: --device cuda: ")
            && reasons.iter().any(|r| error[0].contains(r)),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // World size 2 (thread ranks) fails where world size 1 does: the device probe (or, on a
    // GPU, tiny-gpt2's head size), never the world size.
    let (code, stdout, stderr_two) = run(&[
        "run",
        &zero2,
        "--device",
        "cuda",
        "--world-size",
        "2",
        "--steps",
        "1",
    ]);
    assert_eq!(code, 2, "{stderr_two}");
    assert!(stdout.is_empty(), "{stdout}");
    let error_two: Vec<&str> = stderr_two
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(error_two, error, "W = 2 fails as W = 1: {stderr_two}");

    // A rank started by torchrun (or the DeepSpeed launcher) with --device cuda gets past the
    // launcher's refusal to the same probe: it is a GPU rank, not a CPU rank wanting MPI.
    let output = dsplan()
        .args(["run", &zero2, "--device", "cuda", "--steps", "1"])
        .envs([
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29533"),
        ])
        .output()
        .expect("dsplan runs");
    let stderr_rank = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr_rank}");
    let error_rank: Vec<&str> = stderr_rank
        .lines()
        .filter(|l| l.starts_with("error:"))
        .collect();
    assert_eq!(error_rank.len(), 1, "{stderr_rank}");
    assert!(
        error_rank[0].starts_with("error: rank 1: --device cuda: ")
            && reasons.iter().any(|r| error_rank[0].contains(r)),
        "{stderr_rank}"
    );
    assert!(!stderr_rank.contains("MPI"), "{stderr_rank}");
    assert!(!stderr_rank.contains("panicked"), "{stderr_rank}");

    let (code, stdout, stderr) = run(&[
        "run",
        &zero2,
        "--device",
        "auto",
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("note: --device auto:"))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(notices[0].ends_with("; running on the CPU"), "{stderr}");
    assert!(stderr.contains("1 rank(s) on the CPU"), "{stderr}");
    let summary: Value = serde_json::from_str(&stdout).expect("summary JSON");
    assert_eq!(summary["steps"], 2);
    assert!(
        summary.get("device").is_none(),
        "a CPU run has no device: {summary}"
    );
}

/// `--attention-kernel tensor-core` selects CUDA kernels: a CPU run (asked for, or `auto`
/// falling back) is refused with exit 2 and one error naming the option and the fix, before
/// anything trains; `scalar` (the default) trains on the CPU as before.
#[test]
fn tensor_core_attention_is_refused_on_the_cpu() {
    let zero2 = config_path("zero2_fp16.json");
    for device in ["cpu", "auto"] {
        let (code, stdout, stderr) = run(&[
            "run",
            &zero2,
            "--device",
            device,
            "--attention-kernel",
            "tensor-core",
            "--steps",
            "1",
        ]);
        assert_eq!(code, 2, "{device}: {stderr}");
        assert!(stdout.is_empty(), "{stdout}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{stderr}");
        assert!(
            errors[0].contains("--attention-kernel tensor-core selects CUDA kernels")
                && errors[0].contains("trains on the CPU"),
            "{stderr}"
        );
        assert!(!stderr.contains("step="), "nothing trained: {stderr}");
    }
    let (code, _, stderr) = run(&[
        "run",
        &zero2,
        "--device",
        "cpu",
        "--attention-kernel",
        "scalar",
        "--steps",
        "1",
        "--seq-len",
        "16",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run(&["run", &zero2, "--attention-kernel", "flash"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("tensor-core"),
        "clap lists the choices: {stderr}"
    );
}

/// `../shared` next to the workspace (or `$DSPLAN_SHARED_DIR`), if it exists.
fn shared_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../shared").into());
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared not found");
        None
    }
}

#[test]
fn a_pretrained_model_on_stored_batches_reproduces_deepspeed_stage2() {
    let Some(shared) = shared_dir() else {
        return;
    };
    let reference = shared.join("reference/gpt2");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        dir.path(),
        &json!({
            "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95],
                "eps": 1e-8, "weight_decay": 0.1, "torch_adam": true}},
            "zero_optimization": {"stage": 2},
            "steps_per_print": 1_000_000,
        }),
    );
    let saved = dir.path().join("final.safetensors");
    let model_dir = reference.join("forward_backward");
    let batches = reference.join("adamw_trajectory/batches.safetensors");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--model",
        model_dir.to_str().expect("utf-8"),
        "--data",
        batches.to_str().expect("utf-8"),
        "--world-size",
        "2",
        "--device",
        "cpu",
        "--save-model",
        saved.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("20 steps"),
        "the stored steps set the default: {stderr}"
    );
    let model = choose_model(Some(model_dir.to_str().expect("utf-8")), 0).expect("fixture");
    let gpt2 = model.config.gpt2().copied().expect("a GPT-2");
    let layout = ParamLayout::new(&gpt2);
    let ours = load_params(&saved, &layout).expect("saved");
    let theirs = load_params(
        &reference.join("deepspeed_zero/final_model_stage2.safetensors"),
        &layout,
    )
    .expect("reference");
    let c = gpt2.n_embd;
    let (mut params, mut key_bias) = (0.0f32, 0.0f32);
    for entry in layout.table().entries() {
        let ours = entry.span.of(&ours);
        let theirs = entry.span.of(&theirs);
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            if entry.name.ends_with("attn.c_attn.bias") && (c..2 * c).contains(&i) {
                key_bias = key_bias.max((a - b).abs());
            } else {
                params = params.max((a - b).abs());
            }
        }
    }
    eprintln!(
        "dsplan run vs DeepSpeed stage 2: max |Δ| {params:.3e}, key-bias entries {key_bias:.3e}"
    );
    // The library test's tolerances (zero_deepspeed_reference.rs): 1.6e-5 for the parameters,
    // 5e-5 absolute for the key-bias entries, whose values are rounding noise.
    assert!(
        params < 1.6e-5 && key_bias < 5e-5,
        "{params:e} {key_bias:e}"
    );
}

/// Every config in `configs/` runs as it is for a few steps of its own schedule: `--steps`
/// shorter than the config's `total_num_steps` runs the first steps of that schedule (only an
/// `"auto"` schedule length is taken from `--steps`).
#[test]
fn every_shipped_config_runs_the_first_steps_of_its_schedule() {
    let dir =
        std::fs::read_dir(format!("{}/configs", env!("CARGO_MANIFEST_DIR"))).expect("configs/");
    let mut names: Vec<String> = dir
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    names.sort();
    assert!(names.len() >= 6, "{names:?}");
    for name in names {
        let temp = tempfile::tempdir().expect("temp dir");
        let metrics = temp.path().join("metrics.jsonl");
        let config = config_path(&name);
        // The NVMe config names DeepSpeed's example `/local_nvme`; its swap files go to a
        // temporary directory instead (the flag changes nothing for the other configs).
        let swap = temp.path().join("nvme");
        std::fs::create_dir(&swap).expect("swap dir");
        let (code, _, stderr) = run(&[
            "run",
            &config,
            "--steps",
            "2",
            "--seq-len",
            "16",
            "--metrics",
            metrics.to_str().expect("utf-8"),
            "--nvme-path",
            swap.to_str().expect("utf-8"),
        ]);
        assert_eq!(code, 0, "{name}: {stderr}");
        let lines = std::fs::read_to_string(&metrics).expect("metrics written");
        assert_eq!(lines.lines().count(), 2, "{name}: {lines}");
        let left: Vec<_> = std::fs::read_dir(&swap).expect("listed").collect();
        assert!(left.is_empty(), "{name}: swap files left behind: {left:?}");
    }
}

#[test]
fn nvme_offload_reports_its_files_and_refuses_a_missing_path() {
    let temp = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero3_offload_nvme.json");
    let swap = temp.path().join("nvme");
    std::fs::create_dir(&swap).expect("swap dir");
    let (code, stdout, stderr) = run(&[
        "run",
        &config,
        "--steps",
        "1",
        "--seq-len",
        "16",
        "--nvme-path",
        swap.to_str().expect("utf-8"),
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let nvme = &summary["nvme"];
    let rank = &nvme["ranks"][0];
    let resident = rank["resident_bytes"].as_u64().expect("resident bytes");
    assert!(resident > 0, "{nvme}");
    let plan = nvme["plan_bytes"].as_u64().expect("plan bytes");
    assert_eq!(resident, plan, "{nvme}");
    assert_eq!(
        rank["steps_written_bytes"].as_u64(),
        Some(resident),
        "{nvme}"
    );
    assert!(std::fs::read_dir(&swap).expect("listed").next().is_none());

    // Without the flag the config's /local_nvme is used; when it does not exist that is an
    // error naming the file and the JSON path, exit 1.
    let missing = temp.path().join("absent");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--steps",
        "1",
        "--nvme-path",
        missing.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("zero3_offload_nvme.json"), "{stderr}");
    assert!(
        stderr.contains("/zero_optimization/offload_optimizer/nvme_path"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!missing.exists());
}

#[test]
fn a_checkpoint_resumed_ends_where_the_uninterrupted_run_ends() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero2_fp16.json");
    let path = |name: &str| dir.path().join(name).display().to_string();
    let common = ["run", &config, "--world-size", "2", "--seq-len", "16"];
    let with = |extra: &[&str]| -> Vec<String> {
        common.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let args = with(&["--steps", "6", "--save-model", &path("whole.safetensors")]);
    let (code, _, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");

    let args = with(&["--steps", "3", "--save-checkpoint", &path("ckpt")]);
    let (code, _, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("global_step3"), "{stderr}");
    assert!(
        dir.path()
            .join("ckpt/global_step3/engine_state.json")
            .is_file()
    );
    assert!(
        dir.path()
            .join("ckpt/global_step3/zero_pp_rank_1_mp_rank_00_optim_states.safetensors")
            .is_file()
    );

    let args = with(&[
        "--steps",
        "6",
        "--resume",
        &path("ckpt"),
        "--metrics",
        &path("metrics.jsonl"),
        "--save-model",
        &path("resumed.safetensors"),
    ]);
    let (code, _, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("resuming from"), "{stderr}");
    assert!(stderr.contains("at step 3"), "{stderr}");
    let whole = std::fs::read(path("whole.safetensors")).expect("whole");
    let resumed = std::fs::read(path("resumed.safetensors")).expect("resumed");
    assert!(
        whole == resumed,
        "the resumed model differs from the uninterrupted one"
    );
    let metrics = std::fs::read_to_string(path("metrics.jsonl")).expect("metrics");
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).expect("json")["step"]
                .as_u64()
                .expect("step")
        })
        .collect();
    assert_eq!(steps, [3, 4, 5]);

    // A checkpoint that is not there is an I/O error (2); one of another precision does
    // not fit the run (1).
    let args = with(&["--steps", "6", "--resume", &path("nowhere")]);
    let (code, _, stderr) = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("nowhere"), "{stderr}");
    let fp32 = config_path("zero0_fp32.json");
    let (code, _, stderr) = run(&[
        "run",
        &fp32,
        "--world-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "6",
        "--resume",
        &path("ckpt"),
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("dtypes.model"), "{stderr}");
}

/// A checkpoint directory that cannot hold checkpoints is refused before the first step, not
/// after the run has trained up to its first save.
#[test]
fn an_unusable_checkpoint_directory_is_refused_before_training() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"").expect("file written");
    let config = config_path("zero1_bf16.json");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--steps",
        "2",
        "--save-checkpoint",
        file.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("not a directory"), "{stderr}");
    assert!(!stderr.contains("done:"), "no step may run first: {stderr}");
}

/// An `activation_checkpointing` section, `--gradient-checkpointing` or a `--training-args`
/// file with `gradient_checkpointing` turn per-layer recomputation on: no "has no effect"
/// line, a note saying what is done, measured activations equal to the plan's and below a run
/// without it. A key dsplan cannot act on is refused with its JSON path.
#[test]
fn activation_checkpointing_is_acted_on() {
    let activations = |stdout: &str| -> (u64, u64) {
        let summary: Value = serde_json::from_str(stdout).expect("summary JSON");
        let memory = &summary["memory"];
        (
            memory["ranks"][0]["peak"]["activations"]
                .as_u64()
                .expect("measured"),
            memory["predicted"]["activations"]
                .as_u64()
                .expect("predicted"),
        )
    };
    let common = ["--steps", "2", "--seq-len", "32", "--format", "json"];
    let plain = config_path("zero2_fp16.json");
    let (code, stdout, stderr) = run(&[&["run", plain.as_str()][..], &common].concat());
    assert_eq!(code, 0, "{stderr}");
    let (kept, kept_plan) = activations(&stdout);
    assert_eq!(kept, kept_plan);

    let dir = tempfile::tempdir().expect("temp dir");
    let training_args = dir.path().join("training_args.json");
    std::fs::write(&training_args, r#"{"gradient_checkpointing": true}"#).expect("written");
    let checkpointed = config_path("zero2_activation_checkpointing.json");
    for (args, asked_by) in [
        (
            vec!["run", checkpointed.as_str()],
            "`activation_checkpointing`",
        ),
        (
            vec!["run", plain.as_str(), "--gradient-checkpointing"],
            "gradient_checkpointing",
        ),
        (
            vec![
                "run",
                plain.as_str(),
                "--training-args",
                training_args.to_str().expect("utf-8"),
            ],
            "gradient_checkpointing",
        ),
    ] {
        let (code, stdout, stderr) = run(&[&args[..], &common].concat());
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(!stderr.contains("has no effect"), "{stderr}");
        assert!(!stderr.contains("not acted on"), "{stderr}");
        assert!(
            stderr.contains(&format!("note: activation checkpointing ({asked_by})")),
            "{args:?}: {stderr}"
        );
        let (measured, predicted) = activations(&stdout);
        assert_eq!(measured, predicted, "{args:?}");
        assert!(measured < kept, "{args:?}: {measured} < {kept}");
    }

    let mut refused: Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpointed).expect("read")).expect("JSON");
    refused["activation_checkpointing"]["profile"] = json!(true);
    let path = write_config(dir.path(), &refused);
    let (code, _, stderr) = run(&["run", &path, "--steps", "1", "--seq-len", "16"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("/activation_checkpointing/profile"),
        "{stderr}"
    );
}

/// Activation checkpointing of a Llama-family model: `--model tiny-llama` with the
/// checkpointing config recomputes each layer (a note says so, nothing "not acted on"), its
/// measured activations equal the plan's and are below those of a run without it.
#[test]
fn tiny_llama_activation_checkpointing_is_acted_on() {
    let activations = |stdout: &str| -> (u64, u64) {
        let summary: Value = serde_json::from_str(stdout).expect("summary JSON");
        let memory = &summary["memory"];
        (
            memory["ranks"][0]["peak"]["activations"]
                .as_u64()
                .expect("measured"),
            memory["predicted"]["activations"]
                .as_u64()
                .expect("predicted"),
        )
    };
    let common = [
        "--model",
        "tiny-llama",
        "--steps",
        "2",
        "--seq-len",
        "32",
        "--format",
        "json",
    ];
    let plain = config_path("zero2_fp16.json");
    let (code, stdout, stderr) = run(&[&["run", plain.as_str()][..], &common].concat());
    assert_eq!(code, 0, "{stderr}");
    let (kept, kept_plan) = activations(&stdout);
    assert_eq!(kept, kept_plan);
    let checkpointed = config_path("zero2_activation_checkpointing.json");
    let (code, stdout, stderr) = run(&[&["run", checkpointed.as_str()][..], &common].concat());
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("not acted on"), "{stderr}");
    assert!(!stderr.contains("has no effect"), "{stderr}");
    assert!(
        stderr.contains("note: activation checkpointing (`activation_checkpointing`)"),
        "{stderr}"
    );
    let (measured, predicted) = activations(&stdout);
    assert_eq!(measured, predicted);
    assert!(measured < kept, "{measured} < {kept}");
}

/// The Llama family's main-job example: `--model tiny-llama` trains under ZeRO-3 bf16 on two
/// ranks, and `--save-model` writes a Hugging Face directory that loads back.
#[test]
fn tiny_llama_trains_under_zero3_and_saves_a_hugging_face_directory() {
    use dsplan_executor::io::llama_pretrained::load_llama_pretrained;
    let dir = tempfile::tempdir().expect("temp dir");
    let saved = dir.path().join("tiny-llama-trained");
    let (code, _, stderr) = run(&[
        "run",
        &config_path("zero3_bf16.json"),
        "--model",
        "tiny-llama",
        "--world-size",
        "2",
        "--steps",
        "3",
        "--seq-len",
        "16",
        "--save-model",
        saved.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("tiny-llama"), "{stderr}");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(saved.join("config.json")).expect("config.json written"),
    )
    .expect("json");
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["dtype"], "bfloat16");
    assert_eq!(config["num_key_value_heads"], 2);
    let (loaded, params) = load_llama_pretrained(&saved).expect("the directory loads back");
    let fresh = choose_model(Some("tiny-llama"), 0).expect("preset");
    assert_eq!(
        dsplan_executor::model::ModelConfig::Llama(loaded),
        fresh.config
    );
    assert_eq!(params.len(), fresh.params.len());
    assert!(
        params.iter().all(|&p| p.to_bits() & 0xFFFF == 0),
        "saved in the run's dtype (bf16)"
    );
}

/// A Llama-family config the executor does not compute is refused before the first step,
/// naming the field.
#[test]
fn unsupported_llama_configs_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("config.json");
    std::fs::write(
        &model,
        json!({
            "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128,
            "max_position_embeddings": 64,
            "rope_scaling": {"rope_type": "yarn", "factor": 4.0}
        })
        .to_string(),
    )
    .expect("written");
    let (code, _, stderr) = run(&[
        "run",
        &config_path("zero0_fp32.json"),
        "--model",
        model.to_str().expect("utf-8"),
        "--steps",
        "1",
    ]);
    // `run` reports every `--model` that cannot be loaded as a usage error (exit 2).
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("rope_scaling.rope_type"), "{stderr}");
}
