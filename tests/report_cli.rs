//! `dsplan report` on this machine (no GPU, as in CI): it names what is missing and exits 0;
//! `--check` fails cleanly (exit 2) and says why. The check's table and JSON are tested with a
//! **fabricated** check result read through `--show-check` (its device is named as such): it
//! tests the rendering, and is no GPU result.

use serde_json::{Value, json};

mod support;
use support::run;

/// The machine part of `report --format json`, or `None` (after saying so) where a driver
/// works: these tests are about a machine without one.
fn machine_without_driver() -> Option<Value> {
    let (code, stdout, stderr) = run(&["report", "--format", "json"]);
    assert_eq!(code, 0, "{stderr}");
    let output: Value = serde_json::from_str(&stdout).expect("report --format json is JSON");
    assert_eq!(output["check"], Value::Null);
    let machine = output["machine"].clone();
    if machine["driver"]["status"] != "absent" {
        eprintln!("skipping: this machine has an NVIDIA driver; the no-GPU output is not shown");
        return None;
    }
    Some(machine)
}

#[test]
fn without_a_gpu_the_report_says_what_is_missing_and_exits_0() {
    let Some(machine) = machine_without_driver() else {
        return;
    };
    assert_eq!(machine["gpus"], json!([]));
    let missing: Vec<&str> = machine["missing"]
        .as_array()
        .expect("missing is a list")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        missing[0].starts_with("no NVIDIA driver: libcuda.so cannot be loaded"),
        "{missing:?}"
    );
    let libraries: Vec<&str> = machine["libraries"]
        .as_array()
        .expect("libraries")
        .iter()
        .filter_map(|l| l["name"].as_str())
        .collect();
    assert_eq!(
        libraries,
        ["libnvrtc", "libcublasLt", "libcublas", "libnccl"]
    );
    // Each library dsplan needs and cannot load is named with its fix.
    for library in machine["libraries"].as_array().expect("libraries") {
        let name = library["name"].as_str().expect("name");
        if library["loadable"] == false && library["need"] != "listed" {
            assert!(
                missing.iter().any(|m| m.starts_with(name)),
                "{name} is not loadable but not named as missing: {missing:?}"
            );
        }
    }
    for key in ["avx2", "fma", "avx512f", "avx512_bf16", "logical_cpus"] {
        assert!(machine["cpu"].get(key).is_some(), "cpu.{key}");
    }
    assert!(machine["kernel_cache"].get("entries").is_some());

    let (code, stdout, _) = run(&["report"]);
    assert_eq!(code, 0);
    for line in [
        "NVIDIA driver   not found (libcuda.so cannot be loaded)",
        "GPUs            none",
        "CUDA libraries (loaded at run time)",
        "SIMD            AVX2 ",
        "kernel cache    ",
        "missing for the CUDA backend:\n  - no NVIDIA driver",
    ] {
        assert!(stdout.contains(line), "`{line}` missing from:\n{stdout}");
    }
}

#[test]
fn check_without_a_gpu_fails_cleanly_with_exit_2() {
    if machine_without_driver().is_none() {
        return;
    }
    let (code, stdout, stderr) = run(&["report", "--check"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("error: --check cannot run: no NVIDIA driver"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stdout.contains("missing for the CUDA backend"));

    let (code, stdout, stderr) = run(&["report", "--check", "--format", "json"]);
    assert_eq!(code, 2, "{stderr}");
    let output: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(output["check"]["status"], "not-run");
    assert!(
        output["check"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("no NVIDIA driver"))
    );
}

/// A check result as `report --check --format json` writes it, **fabricated** for the test.
fn fabricated(fail: bool) -> Value {
    let row = |kind: &str, name: &str, dtype: &str, metric: &str, error: Value, tol: f64| {
        let pass = error.as_f64().is_some_and(|e| e <= tol);
        json!({
            "kind": kind, "name": name, "dtype": dtype, "metric": metric,
            "error": error, "max_abs_err": error, "tol": tol,
            "verdict": if metric == "none" || pass { "pass" } else { "fail" },
            "detail": if metric == "none" { json!("3 kernels, 6 entry points for sm_90, 0.41 s (Compiled)") } else { Value::Null },
        })
    };
    let mut rows = vec![
        row("compile", "encoder.cu", "-", "none", Value::Null, 0.0),
        row(
            "kernel",
            "encoder_forward",
            "f32",
            "relative",
            json!(1.5e-7),
            2e-5,
        ),
        row(
            "kernel",
            "encoder_forward",
            "bf16",
            "relative",
            json!(3.0e-3),
            2e-2,
        ),
        row(
            "kernel",
            "cast f32 -> bf16",
            "bf16",
            "mismatches",
            json!(0.0),
            0.0,
        ),
        row(
            "train-step",
            "train step loss",
            "f32",
            "scalar-relative",
            json!(2.0e-7),
            1e-5,
        ),
        row(
            "train-step",
            "train step update",
            "bf16",
            "update-norm",
            json!(0.04),
            0.1,
        ),
    ];
    rows.push(json!({
        "kind": "kernel", "name": "NCCL world of one", "dtype": "-", "metric": "none",
        "error": null, "max_abs_err": null, "tol": 0.0, "verdict": "skipped",
        "detail": "libnccl cannot be loaded",
    }));
    if fail {
        rows.push(row(
            "kernel",
            "attention_forward hs64",
            "f16",
            "relative",
            json!(0.5),
            4e-3,
        ));
        rows.push(json!({
            "kind": "kernel", "name": "adamw", "dtype": "-", "metric": "none",
            "error": null, "max_abs_err": null, "tol": 0.0, "verdict": "fail",
            "detail": "CUDA driver error: CUDA_ERROR_ILLEGAL_ADDRESS",
        }));
    }
    json!({
        "device": "FABRICATED host-test device (not a GPU result)",
        "compute_capability": "9.0",
        "rows": rows,
        "seconds": 1.5,
    })
}

fn write(dir: &std::path::Path, value: &Value) -> String {
    let path = dir.join("check.json");
    std::fs::write(&path, value.to_string()).expect("write");
    path.display().to_string()
}

#[test]
fn a_passing_check_renders_as_a_table_and_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The whole `report --format json` output is accepted too, not only its `check`.
    let path = write(dir.path(), &json!({"check": fabricated(false)}));
    let (code, stdout, stderr) = run(&["report", "--show-check", &path]);
    assert_eq!(code, 0, "{stderr}");
    let table = &stdout[stdout.find("check on ").expect("a check section")..];
    assert!(table.starts_with(
        "check on FABRICATED host-test device (not a GPU result) (compute capability 9.0), 1.5 s"
    ));
    let line = |name: &str, dtype: &str| {
        table
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("  {dtype} ")))
            .unwrap_or_else(|| panic!("no row {name} {dtype} in\n{table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        line("encoder_forward", "f32"),
        "encoder_forward f32 rel 1.50e-7 2.00e-5 1.50e-7 pass"
    );
    assert_eq!(
        line("train step update", "bf16"),
        "train step update bf16 update norm 4.00e-2 1.00e-1 4.00e-2 pass"
    );
    assert_eq!(line("encoder.cu", "-"), "encoder.cu - - - - - pass");
    assert!(table.contains("3 kernels, 6 entry points for sm_90"));
    assert!(table.contains("libnccl cannot be loaded"));
    assert!(
        table.ends_with("\npassed: 6 passed, 0 failed, 1 skipped\n"),
        "{table}"
    );

    let (code, stdout, _) = run(&["report", "--show-check", &path, "--format", "json"]);
    assert_eq!(code, 0);
    let output: Value = serde_json::from_str(&stdout).expect("JSON");
    let check = &output["check"];
    assert_eq!(check["status"], "passed");
    assert_eq!(
        check["kernels"],
        json!({"passed": 4, "failed": 0, "skipped": 1})
    );
    assert_eq!(check["step_vs_cpu"]["passed"], true);
    assert_eq!(check["step_vs_cpu"]["max_rel_err"], 0.04);
    assert_eq!(check["rows"].as_array().map(Vec::len), Some(7));
    assert_eq!(check["rows"][0]["error"], Value::Null);
}

#[test]
fn a_failing_check_exits_1_and_says_what_failed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write(dir.path(), &fabricated(true));
    let (code, stdout, _) = run(&["report", "--show-check", &path]);
    assert_eq!(code, 1, "{stdout}");
    let table = &stdout[stdout.find("check on ").expect("a check section")..];
    let row = table
        .lines()
        .find(|l| l.starts_with("attention_forward hs64"))
        .expect("the failing row");
    assert!(
        row.contains("5.00e-1") && row.contains("4.00e-3") && row.ends_with("FAIL"),
        "{row}"
    );
    assert!(table.contains("CUDA_ERROR_ILLEGAL_ADDRESS"));
    assert!(table.ends_with("\nfailed: 6 passed, 2 failed, 1 skipped\n"));
    let (code, stdout, _) = run(&["report", "--show-check", &path, "--format", "json"]);
    assert_eq!(code, 1);
    let output: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(output["check"]["status"], "failed");
    assert_eq!(output["check"]["kernels"]["failed"], 2);
}

#[test]
fn a_missing_or_wrong_check_file_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let absent = dir.path().join("absent.json").display().to_string();
    let (code, _, stderr) = run(&["report", "--show-check", &absent]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot read") && stderr.contains("absent.json"));
    let wrong = write(dir.path(), &json!({"device": "x"}));
    let (code, _, stderr) = run(&["report", "--show-check", &wrong]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("not a check result")
            && stderr.contains("dsplan report --check --format json"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["report", "--kernels-only"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, _) = run(&["report", "--check", "--show-check", &wrong]);
    assert_eq!(code, 2);
}
