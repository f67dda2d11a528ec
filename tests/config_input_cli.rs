//! How every command reads its config, through the binary: bounded input (no hang on a FIFO,
//! no 256 MB excerpt, no unbounded read), duplicate keys refused by every command, and control
//! characters from the input escaped in everything printed.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;

fn dsplan() -> Command {
    let mut command = Command::cargo_bin("dsplan").expect("binary built");
    // A command that blocks on its input fails the test instead of hanging it.
    command.timeout(Duration::from_secs(60));
    command
}

fn write(dir: &tempfile::TempDir, name: &str, text: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("temp file written");
    path
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The command line of each command that reads a config, with `config` as its config.
fn every_command(config: &str) -> Vec<Vec<String>> {
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    vec![
        owned(&["validate", config]),
        owned(&["resolve", config, "--world-size", "1"]),
        owned(&["schedule", config]),
        owned(&["plan", config, "--model", "gpt2", "--world-size", "1"]),
        owned(&[
            "estimate",
            "--model",
            "gpt2",
            "--gpus",
            "1",
            "--seq-len",
            "128",
            "--config",
            config,
        ]),
        owned(&["run", config, "--steps", "1", "--device", "cpu"]),
    ]
}

fn run(args: &[String]) -> Output {
    dsplan().args(args).output().expect("runs")
}

#[test]
fn a_fifo_is_refused_without_blocking_in_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("pipe.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipping: mkfifo is not available here");
        return;
    }
    for args in every_command(text(&fifo)) {
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "cannot read {}: it is a FIFO (named pipe), not a regular file",
                fifo.display()
            )),
            "{args:?}: {stderr}"
        );
    }
    let json = dsplan()
        .args(["validate", text(&fifo), "--format", "json"])
        .output()
        .expect("runs");
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(doc["files"][0]["diagnostics"][0]["code"], "unreadable-file");
    assert_eq!(doc["files"][0]["diagnostics"][0]["pointer"], "");
}

#[test]
fn a_file_over_64_mib_is_refused_unread_in_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let big = dir.path().join("big.json");
    let file = std::fs::File::create(&big).expect("create");
    file.set_len(4 << 30).expect("a sparse 4 GiB file");
    for args in every_command(text(&big)) {
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(
                "it holds 4294967296 bytes; a config may hold at most 67108864 bytes (64 MiB)"
            ),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn standard_input_still_works() {
    for name in ["-", "/dev/stdin"] {
        let output = dsplan()
            .args(["validate", name])
            .write_stdin(r#"{"train_micro_batch_size_per_gpu": 4}"#)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{name}: {stderr}");
        assert!(stderr.contains(&format!("{name}: valid")), "{stderr}");
    }
}

#[test]
fn duplicate_keys_are_an_error_in_every_command() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(
        &dir,
        "dup.json",
        br#"{"train_micro_batch_size_per_gpu": 1,
 "gradient_accumulation_steps": 1,
 "gradient_accumulation_steps": 2}"#,
    );
    for args in every_command(text(&config)) {
        let output = run(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        let expected = if args[0] == "estimate" {
            "is not a usable JSON config: duplicate key `gradient_accumulation_steps` at the top level: first defined on line 2"
        } else {
            "error[duplicate-key]: duplicate key `gradient_accumulation_steps` at the top level: first defined on line 2"
        };
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        if args[0] != "estimate" {
            assert!(
                stderr.contains("dup.json:3:2 (/gradient_accumulation_steps)"),
                "{args:?}: {stderr}"
            );
        }
    }
}

#[test]
fn thousands_of_duplicate_keys_on_one_line_print_a_bounded_report() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut text_of = String::from("{");
    for _ in 0..4000 {
        text_of.push_str("\"train_batch_size\": 8, ");
    }
    text_of.push_str("\"steps_per_print\": 1}");
    let config = write(&dir, "dups.json", text_of.as_bytes());
    for args in [
        vec!["validate".to_string(), text(&config).to_string()],
        vec![
            "resolve".to_string(),
            text(&config).to_string(),
            "--world-size".to_string(),
            "1".to_string(),
        ],
    ] {
        let output = run(&args);
        assert_eq!(output.status.code(), Some(1));
        // 3,999 diagnostics of a few hundred bytes each; the line alone is 96 KB, so printing
        // it with each would be 380 MB.
        assert!(
            output.stderr.len() < 3_000_000,
            "{args:?}: {} bytes of stderr",
            output.stderr.len()
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        // Capped (issue 33): the first 50, then one line that counts the other 3,949.
        assert_eq!(
            stderr
                .matches("error[duplicate-key]: duplicate key `train_batch_size`")
                .count(),
            50
        );
        assert!(
            stderr.contains("error[duplicate-key]: and 3949 more duplicate-key error(s)"),
            "{args:?}"
        );
    }
}

#[test]
fn control_characters_in_keys_and_excerpts_are_escaped() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key =
        r#"{"train_batch_size": 8, "zero_optimization": {"\u001b]0;pwned\u0007\u001b[2J": 1}}"#;
    let config = write(&dir, "esc.json", key.as_bytes());
    let raw = write(&dir, "raw.json", b"{\"a\": 1,\x1b[2J \x07}");
    for (path, needle) in [
        (
            &config,
            "unknown key `\\u{1b}]0;pwned\\u{7}\\u{1b}[2J` in `zero_optimization`",
        ),
        (&raw, "1 | {\"a\": 1,\\u{1b}[2J \\u{7}}"),
    ] {
        for args in [
            vec!["validate".to_string(), text(path).to_string()],
            vec![
                "resolve".to_string(),
                text(path).to_string(),
                "--world-size".to_string(),
                "1".to_string(),
            ],
        ] {
            let output = run(&args);
            assert_eq!(output.status.code(), Some(1), "{args:?}");
            let stderr = String::from_utf8(output.stderr).expect("utf-8");
            assert!(
                !stderr.chars().any(|c| c.is_control() && c != '\n'),
                "{args:?}: {stderr:?}"
            );
            assert!(stderr.contains(needle), "{args:?}: {stderr}");
        }
    }
}
