//! `dsplan validate` and `dsplan schema` as a user runs them: exit codes, output streams and
//! formats.

use assert_cmd::Command;
use serde_json::Value;

fn dsplan() -> Command {
    Command::cargo_bin("dsplan").expect("binary built")
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("temp file written");
    path
}

#[test]
fn bundled_configs_are_valid() {
    let configs: Vec<_> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/configs"))
        .expect("configs/")
        .map(|entry| entry.expect("entry").path())
        .collect();
    assert!(configs.len() >= 6);
    dsplan()
        .arg("validate")
        .args(&configs)
        .args(["--world-size", "2"])
        .assert()
        .success();
}

#[test]
fn human_output_shows_the_line_and_a_caret_and_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        &dir,
        "ds.json",
        "{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\"overlap_com\": true}\n}\n",
    );
    let output = dsplan().arg("validate").arg(&path).output().expect("runs");
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty(), "human diagnostics go to stderr");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("error[unknown-key]: unknown key `overlap_com` in `zero_optimization`"),
        "{stderr}"
    );
    assert!(stderr.contains("ds.json:3:25"), "{stderr}");
    assert!(stderr.contains("^^^^^^^^^^^^^"), "{stderr}");
    assert!(stderr.contains("did you mean `overlap_comm`?"), "{stderr}");
}

#[test]
fn json_output_reports_every_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = write(
        &dir,
        "good.json",
        r#"{"train_micro_batch_size_per_gpu": 4}"#,
    );
    let bad = write(
        &dir,
        "bad.json",
        r#"{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1}"#,
    );
    let output = dsplan()
        .arg("validate")
        .args([&good, &bad])
        .args(["--world-size", "2", "--format", "json"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    let files = report["files"].as_array().expect("files");
    assert_eq!(files.len(), 2);
    assert_eq!(files[0]["valid"], true);
    assert_eq!(files[1]["valid"], false);
    let diagnostic = &files[1]["diagnostics"][0];
    assert_eq!(diagnostic["code"], "batch-size-mismatch");
    assert_eq!(diagnostic["severity"], "error");
    assert_eq!(diagnostic["pointer"], "/train_batch_size");
    assert_eq!(diagnostic["line"], 1);
    assert!(
        diagnostic["message"]
            .as_str()
            .expect("message")
            .contains("10 ≠")
    );
}

#[test]
fn strict_turns_warnings_into_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(
        &dir,
        "ds.json",
        r#"{"train_micro_batch_size_per_gpu": 4, "my_project_key": 1}"#,
    );
    dsplan().arg("validate").arg(&path).assert().success();
    dsplan()
        .arg("validate")
        .arg(&path)
        .arg("--strict")
        .assert()
        .code(1);
}

#[test]
fn an_unreadable_file_exits_2() {
    let output = dsplan()
        .args(["validate", "/nonexistent/ds_config.json"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("unreadable-file"));
}

#[test]
fn schema_prints_the_committed_file() {
    let committed = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/schemas/ds_config.schema.json"
    ))
    .expect("schema file");
    let output = dsplan().arg("schema").output().expect("runs");
    assert!(output.status.success());
    assert_eq!(output.stdout, committed);
}
