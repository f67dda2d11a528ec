//! Bounded work and honest verdicts at the limits: a config of duplicate keys gives a page of
//! output, not gigabytes; `recommend` and `run`'s pre-flight stay fast at the legal maxima
//! (their planning was quadratic in the layer count); `--force` never runs into an allocation
//! the machine cannot make; `--tie-tolerance` is a fraction; weights given with `--model` are
//! checked for NaN and infinities; `validate` and `resolve` agree on a short-name stage-3
//! `"auto"`; fp16 `hysteresis: 0` is flagged.
//!
//! Timings are printed; bounds are asserted only where the old code took minutes (generous
//! bounds, for a debug build on a loaded machine).

use std::path::Path;
use std::time::{Duration, Instant};

mod support;
use support::{config_path, dsplan};

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Exit code, stdout, stderr and seconds, killed after `limit`.
fn timed(args: &[&str], limit: u64) -> (i32, String, String, f64) {
    let started = Instant::now();
    let output = dsplan()
        .args(args)
        .timeout(Duration::from_secs(limit))
        .output()
        .expect("dsplan runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
        started.elapsed().as_secs_f64(),
    )
}

#[test]
fn twenty_megabytes_of_duplicate_keys_give_a_page_of_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dup.json");
    let member = "\"a\": 1,";
    let count = 20 * 1024 * 1024 / member.len();
    let mut doc = String::with_capacity(count * member.len() + 16);
    doc.push('{');
    for _ in 0..count {
        doc.push_str(member);
    }
    doc.push_str("\"a\": 1}");
    std::fs::write(&path, &doc).expect("written");
    for command in [&["validate"][..], &["resolve", "--world-size", "1"][..]] {
        let args = [command, &[text(&path)][..]].concat();
        // The old code printed 0.85 GB for 12 MB of these and took three minutes.
        let (code, stdout, stderr, seconds) = timed(&args, 120);
        assert_eq!(code, 1, "{command:?}");
        let printed = stdout.len() + stderr.len();
        assert!(printed < 2_000_000, "{command:?}: {printed} bytes");
        assert!(
            stderr.contains(&format!("and {} more duplicate-key error(s)", count - 50)),
            "{command:?}: {}",
            &stderr[stderr.len().saturating_sub(2000)..]
        );
        eprintln!("{command:?}: {printed} bytes in {seconds:.2} s");
    }
}

fn deep_gpt2(dir: &Path, layers: u64) -> String {
    let path = dir.join(format!("deep{layers}.json"));
    std::fs::write(
        &path,
        format!(
            r#"{{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
                "n_embd": 64, "n_layer": {layers}, "n_head": 4}}"#
        ),
    )
    .expect("written");
    text(&path).to_string()
}

#[test]
fn recommend_and_the_preflight_at_the_layer_limit_take_seconds_not_hours() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = deep_gpt2(dir.path(), 16_384);
    // The old recommend took 39 s at 1,024 layers and 249 s at 2,048 (debug build), and grew
    // faster than the square.
    let (code, stdout, stderr, seconds) = timed(
        &[
            "recommend",
            "--model",
            &model,
            "--gpus-per-node",
            "8",
            "--gpu-memory",
            "80GiB",
            "--seq-len",
            "1024",
            "--global-batch",
            "64",
        ],
        300,
    );
    // A verdict either way (at sequence length 1,024 the activations of 16,384 layers fit no
    // 80 GiB GPU): every candidate is planned and reported.
    assert!(matches!(code, 0 | 1), "{stderr}");
    assert!(stdout.contains("ZeRO-3"), "{stdout}");
    eprintln!("recommend at 16,384 layers: {seconds:.2} s");
    // The largest world size and layer count a run takes: refused by the pre-flight.
    let config = config_path("zero3_bf16.json");
    let (code, _, stderr, seconds) = timed(
        &[
            "run",
            &config,
            "--model",
            &model,
            "--world-size",
            "1024",
            "--steps",
            "1",
            "--seq-len",
            "16",
        ],
        300,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("memory pre-flight"), "{stderr}");
    eprintln!("run's pre-flight at 16,384 layers and 1,024 ranks: {seconds:.2} s");
}

#[test]
fn force_never_runs_a_plan_larger_than_the_machine() {
    let config = config_path("zero2_fp16.json");
    // gpt2-xl on 1,024 ranks: tens of terabytes, more than any test machine has in all.
    let (code, _, stderr, _) = timed(
        &[
            "run",
            &config,
            "--model",
            "gpt2-xl",
            "--steps",
            "1",
            "--world-size",
            "1024",
            "--force",
        ],
        300,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("--force cannot run it"), "{stderr}");
    assert!(
        stderr.contains("MemTotal plus SwapTotal") || stderr.contains("cgroup"),
        "{stderr}"
    );
    assert!(!stderr.contains("step="), "{stderr}");
}

#[test]
fn a_tie_tolerance_is_a_fraction() {
    for bad in ["1e308", "2", "-0.1", "NaN"] {
        let flag = format!("--tie-tolerance={bad}");
        let (code, _, stderr, _) = timed(
            &[
                "recommend",
                "--model",
                "gpt2",
                "--gpus-per-node",
                "8",
                "--gpu-memory",
                "80GiB",
                "--seq-len",
                "1024",
                "--global-batch",
                "64",
                &flag,
            ],
            120,
        );
        assert_ne!(code, 0, "{bad}: {stderr}");
        assert!(stderr.contains("tie_tolerance"), "{bad}: {stderr}");
        assert!(!stderr.contains("inf %"), "{bad}: {stderr}");
    }
}

#[test]
fn weights_given_with_model_are_checked_for_nan() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("model");
    std::fs::create_dir(&model).expect("dir");
    let weights = model.join("model.safetensors");
    let config = config_path("zero0_fp32.json");
    let (code, _, stderr, _) = timed(
        &[
            "run",
            &config,
            "--steps",
            "1",
            "--seq-len",
            "16",
            "--save-model",
            text(&weights),
        ],
        120,
    );
    assert_eq!(code, 0, "{stderr}");
    let mut bytes = std::fs::read(&weights).expect("weights");
    let header = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let at = 8 + header + 4 * 7;
    bytes[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
    std::fs::write(&weights, bytes).expect("written");
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 64,
            "n_layer": 2, "n_head": 4}"#,
    )
    .expect("config");
    let (code, _, stderr, _) = timed(
        &[
            "run",
            &config,
            "--steps",
            "1",
            "--seq-len",
            "16",
            "--model",
            text(&model),
        ],
        120,
    );
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("1 NaN or infinite value(s)"), "{stderr}");
    assert!(stderr.contains("--allow-non-finite-model"), "{stderr}");
    assert!(!stderr.contains("step="), "{stderr}");
}

#[test]
fn validate_and_resolve_agree_on_short_name_autos_and_hysteresis_0_is_flagged() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("c.json");
    std::fs::write(
        &path,
        r#"{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
            "fp16": {"enabled": true, "hysteresis": 0},
            "zero_optimization": {"stage": 3, "prefetch_bucket_size": "auto",
                                  "param_persistence_threshold": "auto"}}"#,
    )
    .expect("written");
    let (code, _, stderr, _) = timed(&["validate", text(&path)], 120);
    assert_eq!(code, 0, "a warning is the verdict: {stderr}");
    for key in ["prefetch_bucket_size", "param_persistence_threshold"] {
        assert!(
            stderr.contains(&format!(
                "warning[unresolvable-auto]: `{key}` is \"auto\", which the Hugging Face Trainer fills only under the name `stage3_{key}`"
            )),
            "{key}: {stderr}"
        );
    }
    assert!(
        stderr.contains("warning[out-of-range]: `fp16.hysteresis` is 0"),
        "{stderr}"
    );
    let (code, _, stderr, _) = timed(&["resolve", text(&path), "--world-size", "1"], 120);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("warning[unresolvable-auto]"), "{stderr}");
}
