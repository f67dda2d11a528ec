//! Shared helpers of the CLI's end-to-end tests: the `dsplan` binary, one run's exit code and
//! output, and the shipped example configs.

#![allow(dead_code)]

use assert_cmd::Command;

/// The `dsplan` binary cargo built for the tests.
pub fn dsplan() -> Command {
    Command::cargo_bin("dsplan").expect("the dsplan binary is built")
}

/// Runs and returns (exit code, stdout, stderr).
pub fn run(args: &[&str]) -> (i32, String, String) {
    let output = dsplan().args(args).output().expect("dsplan runs");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The path of `configs/<name>`.
pub fn config_path(name: &str) -> String {
    format!("{}/configs/{name}", env!("CARGO_MANIFEST_DIR"))
}
