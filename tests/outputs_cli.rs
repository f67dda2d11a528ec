//! `dsplan run`'s outputs never destroy what the user gave it: an output that is an input (the
//! config, the data, a checkpoint's `latest`), directly or through a symlink or `..`, is
//! refused naming both flags; one writer per checkpoint directory; an output whose directory
//! is missing or not writable is refused before step 0; a `latest` that is a symlink is
//! replaced, its target untouched.

use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

mod support;
use support::{config_path, dsplan};

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn run(args: &[&str]) -> (i32, String) {
    let output = dsplan()
        .args(args)
        .timeout(Duration::from_secs(120))
        .output()
        .expect("dsplan runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const TINY: [&str; 4] = ["--steps", "2", "--seq-len", "16"];

#[test]
fn a_config_a_data_file_and_a_latest_survive_being_named_as_outputs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("c.json");
    std::fs::copy(config_path("zero0_fp32.json"), &config).expect("copied");
    let config_bytes = std::fs::read(&config).expect("read");
    let data = dir.path().join("d.txt");
    std::fs::write(
        &data,
        "the data to train on, which must not be emptied. ".repeat(40),
    )
    .expect("data");
    let data_bytes = std::fs::read(&data).expect("read");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&config, &link).expect("symlink");
    std::fs::create_dir(dir.path().join("sub")).expect("dir");
    let dotted = dir.path().join("sub/../c.json");

    let c = text(&config);
    let mut cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--metrics", c], "as the config"),
        (vec!["--save-model", c], "as the config"),
        (vec!["--metrics", text(&link)], "as the config"),
        (vec!["--save-model", text(&dotted)], "as the config"),
        (
            vec!["--data", text(&data), "--metrics", text(&data)],
            "as --data",
        ),
    ];
    let ckpt = dir.path().join("ckpt");
    let (code, stderr) =
        run(&[&["run", c][..], &TINY, &["--save-checkpoint", text(&ckpt)]].concat());
    assert_eq!(code, 0, "{stderr}");
    let latest = ckpt.join("latest");
    let latest_bytes = std::fs::read(&latest).expect("latest");
    let ck = text(&ckpt);
    cases.push((
        vec![
            "--save-checkpoint",
            ck,
            "--overwrite",
            "--metrics",
            text(&latest),
        ],
        "lies inside --save-checkpoint",
    ));
    cases.push((
        vec!["--resume", ck, "--metrics", text(&latest)],
        "lies inside --resume",
    ));
    for (extra, says) in &cases {
        let args = [&["run", c][..], &TINY, extra].concat();
        let (code, stderr) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
        let first = extra
            .iter()
            .rev()
            .nth(1)
            .expect("an output flag before its path");
        assert!(
            stderr.contains(&format!("error: {first} ")),
            "{extra:?}: {stderr}"
        );
        assert_eq!(std::fs::read(&config).expect("config"), config_bytes);
        assert_eq!(std::fs::read(&data).expect("data"), data_bytes);
        assert_eq!(std::fs::read(&latest).expect("latest"), latest_bytes);
    }
    // And the checkpoint still resumes.
    let (code, stderr) =
        run(&[&["run", c, "--seq-len", "16", "--steps", "3", "--resume", ck][..]].concat());
    assert_eq!(code, 0, "{stderr}");
}

/// `dsplan run` with `args`, started in the background.
fn spawn(args: &[&str]) -> std::process::Child {
    Process::new(env!("CARGO_BIN_EXE_dsplan"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawned")
}

#[test]
fn two_runs_on_one_checkpoint_directory_one_writes_the_other_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero0_fp32.json");
    let ckpt = dir.path().join("ckpt");
    let ck = text(&ckpt);
    let lock = ckpt.join(".dsplan.lock");
    let long = [
        "run",
        &config,
        "--seq-len",
        "16",
        "--steps",
        "1000000",
        "--save-checkpoint",
        ck,
        "--checkpoint-every",
        "1",
    ];
    let mut first = spawn(&long);
    let started = Instant::now();
    while !lock.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no lock taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    let owner = format!("pid {}", first.id());
    for extra in [&[][..], &["--overwrite"][..]] {
        let args = [
            &[
                "run",
                config.as_str(),
                "--seq-len",
                "16",
                "--steps",
                "2",
                "--save-checkpoint",
                ck,
            ][..],
            extra,
        ]
        .concat();
        let (code, stderr) = run(&args);
        assert_eq!(code, 2, "{extra:?}: {stderr}");
        assert!(stderr.contains(&owner), "{extra:?}: {stderr}");
        assert!(
            stderr.contains("one run writes a checkpoint directory at a time"),
            "{stderr}"
        );
    }
    assert!(
        std::fs::read_to_string(&lock)
            .expect("lock")
            .starts_with(&format!("pid={} ", first.id())),
        "the refused runs left the lock to its owner"
    );
    let _ = first.kill(); // SIGKILL: the lock file stays, its flock goes
    let _ = first.wait();
    assert!(lock.exists());
    let (code, stderr) = run(&[
        "run",
        &config,
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--save-checkpoint",
        ck,
        "--overwrite",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(&format!("took over the lock of {owner}")),
        "{stderr}"
    );
    assert!(!lock.exists(), "released at exit");
    // The killed run's later tags are gone: `latest` is the newest tag; its earlier ones are
    // named as remaining.
    let steps: Vec<u64> = std::fs::read_dir(&ckpt)
        .expect("listed")
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("global_step")?.parse().ok()
        })
        .collect();
    assert!(steps.contains(&2), "{steps:?}");
    assert!(steps.iter().all(|&s| s <= 2), "{steps:?}: {stderr}");
    if steps.contains(&1) {
        assert!(
            stderr.contains("still holds the other run's tag(s) global_step1"),
            "{stderr}"
        );
    }
}

#[cfg(target_os = "linux")]
#[test]
fn a_save_model_place_that_cannot_be_written_is_refused_before_step_0() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero0_fp32.json");
    let missing = dir.path().join("absent/model.safetensors");
    // /proc takes no new files, not even root's.
    for (target, says) in [
        (text(&missing), "does not exist"),
        ("/proc/model.safetensors", "cannot write in /proc"),
    ] {
        let started = Instant::now();
        // A million steps: a run that trained first would run into the timeout.
        let (code, stderr) = run(&[
            "run",
            &config,
            "--seq-len",
            "16",
            "--steps",
            "1000000",
            "--save-model",
            target,
        ]);
        let took = started.elapsed();
        assert_eq!(code, 2, "{target}: {stderr}");
        assert!(stderr.contains(says), "{target}: {stderr}");
        assert!(stderr.contains("--save-model"), "{stderr}");
        assert!(!stderr.contains("step="), "no step ran: {stderr}");
        eprintln!(
            "--save-model {target}: refused in {:.3} s",
            took.as_secs_f64()
        );
    }
}

#[test]
fn a_latest_that_is_a_symlink_is_replaced_and_its_target_untouched() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = config_path("zero0_fp32.json");
    let precious = dir.path().join("precious.txt");
    std::fs::write(&precious, b"not a tag").expect("write");
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir(&ckpt).expect("dir");
    std::os::unix::fs::symlink(&precious, ckpt.join("latest")).expect("symlink");
    let (code, stderr) = run(&[
        "run",
        &config,
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--save-checkpoint",
        text(&ckpt),
        "--overwrite",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(std::fs::read(&precious).expect("read"), b"not a tag");
    let latest = ckpt.join("latest");
    assert!(std::fs::symlink_metadata(&latest).expect("meta").is_file());
    assert_eq!(
        std::fs::read_to_string(&latest).expect("read"),
        "global_step2"
    );
}

#[test]
fn recommend_output_never_overwrites_the_model_it_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("config.json");
    let text_of_model = r#"{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
        "n_embd": 768, "n_layer": 12, "n_head": 12}"#;
    std::fs::write(&model, text_of_model).expect("model");
    for output in [model.clone(), dir.path().join("./config.json")] {
        let (code, stderr) = run(&[
            "recommend",
            "--model",
            text(&model),
            "--gpus-per-node",
            "8",
            "--gpu-memory",
            "80GiB",
            "--seq-len",
            "1024",
            "--global-batch",
            "64",
            "--output",
            text(&output),
        ]);
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains("--output") && stderr.contains("--model"),
            "{stderr}"
        );
        assert_eq!(
            std::fs::read_to_string(&model).expect("model"),
            text_of_model
        );
    }
}
