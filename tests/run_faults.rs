//! `dsplan run` against a careless operator and a hostile machine: outputs that are not
//! regular files (FIFOs, symlinks, character devices made here, never the machine's `/dev`),
//! runs too large for the host's memory, data that is not a file, runs whose loss is NaN,
//! checkpoint directories of another run, and kill -9 at seeded moments of a checkpointing run.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command as Process;

use serde_json::Value;

mod support;
use support::{config_path, dsplan, run};

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A FIFO at `path` (by `mkfifo`); `false` after saying so when it cannot be made.
fn make_fifo(path: &Path) -> bool {
    match Process::new("mkfifo").arg(path).status() {
        Ok(status) if status.success() => true,
        other => {
            eprintln!("skipping: mkfifo failed ({other:?})");
            false
        }
    }
}

/// Reads a FIFO to its end in a thread; the bytes come back on join.
fn drain(fifo: PathBuf) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Ok(mut file) = std::fs::File::open(&fifo) {
            let _ = file.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Lets a reader blocked in `open` on `fifo` go (when nobody wrote to it): opens the write
/// end without blocking and closes it.
fn release(fifo: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(O_NONBLOCK)
        .open(fifo);
}

#[cfg(unix)]
fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo())
}

const TINY: [&str; 4] = ["--steps", "2", "--seq-len", "16"];

#[test]
fn a_fifo_given_as_model_or_metrics_is_written_through_not_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("model.fifo");
    let metrics_fifo = dir.path().join("metrics.fifo");
    let metrics_link = dir.path().join("metrics.jsonl");
    if !make_fifo(&model) || !make_fifo(&metrics_fifo) {
        return;
    }
    std::os::unix::fs::symlink(&metrics_fifo, &metrics_link).expect("symlink");
    let model_reader = drain(model.clone());
    let metrics_reader = drain(metrics_fifo.clone());
    let config = config_path("zero2_fp16.json");
    let mut args = vec!["run", &config];
    args.extend(TINY);
    args.extend([
        "--save-model",
        text(&model),
        "--metrics",
        text(&metrics_link),
    ]);
    let (code, _, stderr) = run(&args);
    release(&model);
    release(&metrics_fifo);
    let model_bytes = model_reader.join().expect("reader");
    let metrics_bytes = metrics_reader.join().expect("reader");
    assert_eq!(code, 0, "{stderr}");
    assert!(is_fifo(&model), "the model FIFO was replaced");
    assert!(is_fifo(&metrics_fifo), "the metrics FIFO was replaced");
    assert!(
        std::fs::symlink_metadata(&metrics_link)
            .expect("link")
            .file_type()
            .is_symlink(),
        "the symlink was replaced"
    );
    // The reader got the whole safetensors file and both metrics lines.
    let header = u64::from_le_bytes(model_bytes[..8].try_into().expect("8 bytes")) as usize;
    let json: Value = serde_json::from_slice(&model_bytes[8..8 + header]).expect("header");
    assert!(json.get("transformer.wte.weight").is_some(), "{json}");
    let lines: Vec<Value> = String::from_utf8(metrics_bytes)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), 2);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .expect("listed")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_character_device_stays_a_device_and_a_directory_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero2_fp16.json");
    // A directory is neither replaced nor written: refused before training, naming it.
    let mut args = vec!["run", &config];
    args.extend(TINY);
    let target = text(dir.path()).to_string();
    args.extend(["--metrics", &target]);
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("a directory"), "{stderr}");
    assert!(stderr.contains(&target), "{stderr}");
    assert!(dir.path().is_dir());

    // A null device made here (where mknod is allowed: as root).
    let null = dir.path().join("null");
    match Process::new("mknod")
        .arg(&null)
        .args(["c", "1", "3"])
        .status()
    {
        Ok(status) if status.success() => {}
        other => {
            eprintln!("skipping the character device: mknod failed ({other:?})");
            return;
        }
    }
    let link = dir.path().join("null-link");
    std::os::unix::fs::symlink(&null, &link).expect("symlink");
    let mut args = vec!["run", &config];
    args.extend(TINY);
    args.extend(["--save-model", text(&null), "--metrics", text(&link)]);
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::symlink_metadata(&null).expect("meta").file_type();
    assert!(kind.is_char_device(), "the device became {kind:?}");
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink()
    );
}

#[test]
fn data_that_is_not_a_regular_file_is_refused_without_reading_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("data.txt");
    if !make_fifo(&fifo) {
        return;
    }
    let config = config_path("zero2_fp16.json");
    let mut args = vec!["run", &config];
    args.extend(TINY);
    args.extend(["--data", text(&fifo)]);
    // Nothing writes to the FIFO: a run that opened it would block until the timeout.
    let output = dsplan()
        .args(&args)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("dsplan runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
    assert!(stderr.contains(text(&fifo)), "{stderr}");
}

/// A `save_pretrained` directory of `tiny-gpt2` whose every weight is NaN.
fn nan_model(dir: &Path) -> PathBuf {
    let model = dir.join("nan-model");
    std::fs::create_dir_all(&model).expect("created");
    let weights = model.join("model.safetensors");
    let config = config_path("zero0_fp32.json");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--steps",
        "1",
        "--seq-len",
        "16",
        "--save-model",
        text(&weights),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let mut bytes = std::fs::read(&weights).expect("weights");
    let header = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    for value in bytes[8 + header..].chunks_exact_mut(4) {
        value.copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(&weights, bytes).expect("written");
    std::fs::write(
        model.join("config.json"),
        r#"{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 64,
            "n_layer": 2, "n_head": 4}"#,
    )
    .expect("config");
    model
}

#[test]
fn a_run_whose_loss_is_nan_stops_at_the_step_with_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = nan_model(dir.path());
    let checkpoints = dir.path().join("ckpt");
    // fp32: nothing skips the step; the run stops at the first one.
    let config = config_path("zero0_fp32.json");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--model",
        text(&model),
        "--allow-non-finite-model",
        "--steps",
        "20",
        "--seq-len",
        "16",
        "--save-checkpoint",
        text(&checkpoints),
        "--checkpoint-every",
        "1",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("step 0: the loss is NaN"), "{stderr}");
    assert!(
        !checkpoints.join("latest").exists(),
        "a NaN state must not be checkpointed"
    );
    // fp16 with a dynamic scale: the scaler halves the scale on every overflow and stops at
    // its minimum, as DeepSpeed's does under ZeRO.
    let config = config_path("zero2_fp16.json");
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--model",
        text(&model),
        "--allow-non-finite-model",
        "--steps",
        "200",
        "--seq-len",
        "16",
    ]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("minimum"), "{stderr}");
    assert!(!stderr.contains("done:"), "{stderr}");
}

#[test]
fn a_fresh_run_refuses_another_runs_checkpoints_unless_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let checkpoints = dir.path().join("ckpt");
    let config = config_path("zero1_bf16.json");
    let base = ["run", config.as_str(), "--seq-len", "16"];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let call = |args: Vec<String>| run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let save = text(&checkpoints).to_string();
    let (code, _, stderr) = call(with(&["--steps", "2", "--save-checkpoint", &save]));
    assert_eq!(code, 0, "{stderr}");
    let before = std::fs::read(checkpoints.join("global_step2/manifest.json")).expect("saved");

    let (code, _, stderr) = call(with(&["--steps", "2", "--save-checkpoint", &save]));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("already holds another run's checkpoints"),
        "{stderr}"
    );
    assert!(stderr.contains("global_step2, latest"), "{stderr}");
    assert!(
        stderr.contains("--resume") && stderr.contains("--overwrite"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(checkpoints.join("global_step2/manifest.json")).expect("kept"),
        before
    );
    let (code, _, stderr) = call(with(&[
        "--steps",
        "4",
        "--save-checkpoint",
        &save,
        "--resume",
        &save,
    ]));
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = call(with(&[
        "--steps",
        "2",
        "--save-checkpoint",
        &save,
        "--overwrite",
    ]));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        std::fs::read_to_string(checkpoints.join("latest")).expect("latest"),
        "global_step2"
    );
}

#[test]
fn a_run_larger_than_the_machine_is_refused_before_allocating() {
    // gpt2-xl on 64 ranks needs more than a terabyte: refused on any machine that runs tests.
    let config = config_path("zero2_fp16.json");
    let started = std::time::Instant::now();
    let (code, _, stderr) = run(&[
        "run",
        &config,
        "--model",
        "gpt2-xl",
        "--steps",
        "1",
        "--world-size",
        "64",
    ]);
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("refused in {seconds:.2} s");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("memory pre-flight: the plan needs"),
        "{stderr}"
    );
    assert!(stderr.contains("GiB of host memory"), "{stderr}");
    assert!(stderr.contains("is available ("), "{stderr}");
    assert!(stderr.contains("fewer ranks"), "{stderr}");
    assert!(stderr.contains("--force"), "{stderr}");
    assert!(!stderr.contains("step="), "{stderr}");
    // A run that fits says what it checked.
    let mut args = vec!["run", &config];
    args.extend(TINY);
    let (code, _, stderr) = run(&args);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("memory pre-flight: the plan needs"),
        "{stderr}"
    );
    assert!(stderr.contains("checked in"), "{stderr}");
}

#[test]
fn a_model_dimension_out_of_bounds_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero2_fp16.json");
    for (key, value) in [
        ("n_layer", "1000000000"),
        ("n_embd", "1000000"),
        ("vocab_size", "1000000000000"),
        ("n_positions", "1000000000000"),
    ] {
        let mut shape = serde_json::json!({"model_type": "gpt2", "vocab_size": 256,
            "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4});
        shape[key] = serde_json::from_str(value).expect("number");
        let path = dir.path().join(format!("{key}.json"));
        std::fs::write(&path, shape.to_string()).expect("written");
        for command in [
            vec![
                "run",
                config.as_str(),
                "--steps",
                "1",
                "--model",
                text(&path),
            ],
            vec![
                "plan",
                config.as_str(),
                "--world-size",
                "1",
                "--model",
                text(&path),
            ],
        ] {
            let output = dsplan()
                .args(&command)
                .timeout(std::time::Duration::from_secs(60))
                .output()
                .expect("dsplan runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                matches!(output.status.code(), Some(1 | 2)),
                "{command:?}: {stderr}"
            );
            assert!(
                stderr.contains("must be between 1 and"),
                "{command:?}: {stderr}"
            );
        }
    }
}

/// SplitMix64: the kill points, the same on every machine.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn hidden_entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn kill_9_at_twenty_seeded_moments_resumes_bit_exactly_and_leaves_nothing_behind() {
    const KILLED_STEPS: &str = "6";
    const TOTAL_STEPS: &str = "8";
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero2_fp16.json");
    let common = [
        "run",
        config.as_str(),
        "--world-size",
        "2",
        "--seq-len",
        "16",
    ];
    let args = |extra: &[&str]| -> Vec<String> {
        common.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let reference = dir.path().join("reference.safetensors");
    let (code, _, stderr) = run(
        &args(&["--steps", TOTAL_STEPS, "--save-model", text(&reference)])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{stderr}");
    let reference = std::fs::read(&reference).expect("reference model");

    // How long the run to be killed takes, checkpointing every step.
    let timing = dir.path().join("timing");
    let started = std::time::Instant::now();
    let (code, _, stderr) = run(&args(&[
        "--steps",
        KILLED_STEPS,
        "--save-checkpoint",
        text(&timing),
        "--checkpoint-every",
        "1",
    ])
    .iter()
    .map(String::as_str)
    .collect::<Vec<_>>());
    assert_eq!(code, 0, "{stderr}");
    let duration = started.elapsed();

    let mut seed = 2026u64;
    let mut resumed_from = Vec::new();
    for point in 0..20 {
        let work = dir.path().join(format!("kill{point}"));
        std::fs::create_dir_all(&work).expect("created");
        let checkpoints = work.join("ckpt");
        let metrics = work.join("metrics.jsonl");
        let fraction = (splitmix(&mut seed) % 1000) as f64 / 1000.0;
        let delay = duration.mul_f64(fraction * 1.1);
        let mut child = Process::new(env!("CARGO_BIN_EXE_dsplan"))
            .args(args(&[
                "--steps",
                KILLED_STEPS,
                "--save-checkpoint",
                text(&checkpoints),
                "--checkpoint-every",
                "1",
                "--metrics",
                text(&metrics),
            ]))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawned");
        std::thread::sleep(delay);
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        // What the killed run wrote of its metrics is whole lines (the last may be cut).
        if let Ok(text) = std::fs::read_to_string(&metrics) {
            let complete = text.split_inclusive('\n').filter(|l| l.ends_with('\n'));
            for line in complete {
                serde_json::from_str::<Value>(line).expect("a whole metrics line");
            }
        }

        let model = work.join("model.safetensors");
        let latest = std::fs::read_to_string(checkpoints.join("latest")).ok();
        let mut next = vec![
            "--steps",
            TOTAL_STEPS,
            "--save-checkpoint",
            text(&checkpoints),
            "--checkpoint-every",
            "1",
            "--save-model",
            text(&model),
        ];
        match &latest {
            Some(_) => next.extend(["--resume", text(&checkpoints)]),
            None => next.push("--overwrite"),
        }
        let (code, _, stderr) = run(&args(&next).iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "kill point {point} ({delay:?}): {stderr}");
        resumed_from.push(latest.unwrap_or_else(|| "fresh".to_string()));
        assert!(
            std::fs::read(&model).expect("model") == reference,
            "kill point {point} ({delay:?}): the resumed run differs from the uninterrupted one"
        );
        for place in [&checkpoints, &work] {
            let left = hidden_entries(place);
            assert!(left.is_empty(), "kill point {point}: left behind {left:?}");
        }
        std::fs::remove_dir_all(&work).expect("cleaned");
    }
    eprintln!("run of {duration:?} killed at 20 points; resumed from {resumed_from:?}");
}
