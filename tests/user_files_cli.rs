//! Every reader of a file a user names refuses a FIFO (and a device) at once, by what it is:
//! a model directory's `config.json` and `model.safetensors`, `--model` itself,
//! `--training-args`, `launch --hostfile`, `--data`, a checkpoint's `latest`, `report
//! --show-check`. Before the bounded reader (`dsplan_planner::user_file`) several of them
//! blocked until a writer came, forever; here nothing ever writes, so a reader that opens the
//! FIFO hangs until the test's timeout kills it and the test fails.

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

mod support;
use support::{config_path, dsplan};

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn mkfifo(path: &Path) -> bool {
    match Process::new("mkfifo").arg(path).status() {
        Ok(status) if status.success() => true,
        other => {
            eprintln!("skipping: mkfifo failed ({other:?})");
            false
        }
    }
}

const GPT2_CONFIG: &str = r#"{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64,
    "n_embd": 64, "n_layer": 2, "n_head": 4}"#;

/// One refusal: the arguments, and text its stderr must hold.
struct Case {
    what: &'static str,
    args: Vec<String>,
    says: String,
}

fn cases(dir: &Path) -> Option<Vec<Case>> {
    let config = config_path("zero0_fp32.json");
    let owned = |args: &[&str]| args.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let fifo_model = dir.join("fifo-config-model");
    std::fs::create_dir(&fifo_model).expect("dir");
    let fifo_weights = dir.join("fifo-weights-model");
    std::fs::create_dir(&fifo_weights).expect("dir");
    std::fs::write(fifo_weights.join("config.json"), GPT2_CONFIG).expect("config");
    let checkpoint = dir.join("ckpt");
    std::fs::create_dir(&checkpoint).expect("dir");
    let fifos = [
        fifo_model.join("config.json"),
        fifo_weights.join("model.safetensors"),
        dir.join("args.json"),
        dir.join("hostfile"),
        dir.join("data.txt"),
        checkpoint.join("latest"),
        dir.join("model.json"),
        dir.join("check.json"),
    ];
    for fifo in &fifos {
        if !mkfifo(fifo) {
            return None;
        }
    }
    let fifo = |i: usize| text(&fifos[i]).to_string();
    let run = |extra: &[&str]| {
        let mut args = owned(&["run", &config, "--steps", "1", "--seq-len", "16"]);
        args.extend(owned(extra));
        args
    };
    Some(vec![
        Case {
            what: "a model directory's config.json (run)",
            args: run(&["--model", text(&fifo_model)]),
            says: format!("{}: it is a FIFO (named pipe)", fifo(0)),
        },
        Case {
            what: "a model directory's config.json (estimate)",
            args: owned(&["estimate", "--model", text(&fifo_model)]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
        Case {
            what: "a model directory's model.safetensors (run)",
            args: run(&["--model", text(&fifo_weights)]),
            says: format!("{}: it is a FIFO (named pipe)", fifo(1)),
        },
        Case {
            what: "a model directory's model.safetensors (estimate)",
            args: owned(&["estimate", "--model", text(&fifo_weights)]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
        Case {
            what: "--training-args (run)",
            args: run(&["--training-args", &fifo(2)]),
            says: format!("--training-args {}: it is a FIFO (named pipe)", fifo(2)),
        },
        Case {
            what: "--training-args (resolve)",
            args: owned(&[
                "resolve",
                &config,
                "--world-size",
                "1",
                "--training-args",
                &fifo(2),
            ]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
        Case {
            what: "launch --hostfile",
            args: owned(&["launch", "--hostfile", &fifo(3), &config]),
            says: format!("the hostfile {}: it is a FIFO (named pipe)", fifo(3)),
        },
        Case {
            what: "--data",
            args: run(&["--data", &fifo(4)]),
            says: "it is a FIFO (named pipe), not a regular file".to_string(),
        },
        Case {
            what: "a checkpoint's latest (--resume)",
            args: run(&["--resume", text(&checkpoint)]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
        Case {
            what: "--model naming a FIFO",
            args: run(&["--model", &fifo(6)]),
            says: format!("{}: it is a FIFO (named pipe)", fifo(6)),
        },
        Case {
            what: "resolve --model naming a FIFO",
            args: owned(&["resolve", &config, "--world-size", "1", "--model", &fifo(6)]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
        Case {
            what: "report --show-check",
            args: owned(&["report", "--show-check", &fifo(7)]),
            says: "it is a FIFO (named pipe)".to_string(),
        },
    ])
}

#[test]
fn a_fifo_in_every_reader_is_refused_at_once_by_what_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(cases) = cases(dir.path()) else {
        return;
    };
    let mut slowest = (Duration::ZERO, "");
    for case in &cases {
        let started = Instant::now();
        // A reader that opens the FIFO blocks for good: the timeout kills it and fails here.
        let output = dsplan()
            .args(&case.args)
            .timeout(Duration::from_secs(30))
            .output()
            .expect("dsplan runs");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            matches!(output.status.code(), Some(1 | 2)),
            "{}: {:?}: {stderr}",
            case.what,
            output.status
        );
        assert!(stderr.contains(&case.says), "{}: {stderr}", case.what);
        assert!(
            !stderr.contains("does not exist"),
            "{}: {stderr}",
            case.what
        );
        if took > slowest.0 {
            slowest = (took, case.what);
        }
    }
    eprintln!(
        "{} FIFO readers refused; the slowest, {}, in {:.3} s",
        cases.len(),
        slowest.1,
        slowest.0.as_secs_f64()
    );
}

#[test]
fn an_oversized_model_config_is_refused_unread() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("model");
    std::fs::create_dir(&model).expect("dir");
    let config = model.join("config.json");
    let file = std::fs::File::create(&config).expect("create");
    file.set_len(100 << 20).expect("a sparse 100 MiB file");
    let config_arg: PathBuf = config_path("zero0_fp32.json").into();
    let output = dsplan()
        .args([
            "run",
            text(&config_arg),
            "--steps",
            "1",
            "--model",
            text(&model),
        ])
        .timeout(Duration::from_secs(30))
        .output()
        .expect("dsplan runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("it holds 104857600 bytes; a model's config.json may hold at most 16 MiB"),
        "{stderr}"
    );
}
