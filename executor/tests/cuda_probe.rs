//! `--device` without a usable GPU: no panic, a clean fallback under `auto`, a clear error
//! under `cuda`.
//!
//! * No driver (this machine, CI): `libcuda` cannot be loaded; checked in this process.
//! * Driver present, no device: a stub `libcuda.so` (compiled here with `cc`) whose `cuInit`
//!   returns 100 (`CUDA_ERROR_NO_DEVICE`), or succeeds with zero devices. The loader path is
//!   read when a process starts, so this test binary re-runs itself as a child with
//!   `LD_LIBRARY_PATH` pointing at the stub, running only the ignored `probe_child` test, and
//!   checks what the child printed.

use std::path::{Path, PathBuf};
use std::process::Command;

use dsplan_executor::cuda::device::driver_present;
use dsplan_executor::cuda::{
    Backend, CudaAvailability, DeviceChoice, DeviceError, choose_backend, probe,
};

/// The four driver entry points cudarc touches on the no-device path.
const STUB_SOURCE: &str = r#"
typedef int CUresult;
CUresult cuInit(unsigned int flags) { (void)flags; return INIT_RESULT; }
CUresult cuDeviceGetCount(int *count) { *count = 0; return INIT_RESULT; }
CUresult cuGetErrorString(CUresult e, const char **s) {
    *s = e == 100 ? "no CUDA-capable device is detected" : "stub error";
    return 0;
}
CUresult cuGetErrorName(CUresult e, const char **s) {
    *s = e == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
"#;

/// Builds the stub as `dir/libcuda.so` (and `.so.1`); `None` (after saying so) without `cc`.
fn build_stub(dir: &Path, init_result: i32) -> Option<PathBuf> {
    let source = dir.join("stub_cuda.c");
    std::fs::write(&source, STUB_SOURCE).expect("write stub source");
    let library = dir.join("libcuda.so");
    let status = Command::new("cc")
        .arg("-shared")
        .arg("-fPIC")
        .arg(format!("-DINIT_RESULT={init_result}"))
        .arg("-o")
        .arg(&library)
        .arg(&source)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("cc failed to build the stub libcuda: {s}"),
        Err(e) => {
            eprintln!("skipping: no C compiler to build the stub libcuda ({e})");
            return None;
        }
    }
    std::fs::copy(&library, dir.join("libcuda.so.1")).expect("copy stub");
    Some(dir.to_path_buf())
}

/// Runs `probe_child` in a child process with `LD_LIBRARY_PATH=lib_dir`; returns its stdout.
fn run_child(lib_dir: &Path) -> String {
    let output = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "probe_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("LD_LIBRARY_PATH", lib_dir)
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the child failed ({}); a panic here is the bug this test guards against\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    stdout
}

fn line<'a>(stdout: &'a str, tag: &str) -> &'a str {
    // The harness prints `test probe_child ... ` in front of the first line.
    stdout
        .lines()
        .find_map(|l| l.find(tag).map(|at| &l[at..]))
        .unwrap_or_else(|| panic!("no `{tag}` line in:\n{stdout}"))
}

/// The child half: prints what the probe and both choices give under the stub driver.
#[test]
#[ignore = "child half of the stub-driver tests; they run it with the stub on LD_LIBRARY_PATH"]
fn probe_child() {
    println!("PROBE {:?}", probe());
    match choose_backend(DeviceChoice::Auto, 0) {
        Ok(choice) => println!(
            "AUTO {:?} | {}",
            choice.backend,
            choice.notice.unwrap_or_default()
        ),
        Err(e) => println!("AUTO-ERROR {e}"),
    }
    match choose_backend(DeviceChoice::Cuda, 0) {
        Ok(choice) => println!("CUDA-OK {:?}", choice.backend),
        Err(e) => println!("CUDA-ERROR {e}"),
    }
}

#[test]
fn stub_driver_without_device_is_a_clean_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(lib_dir) = build_stub(dir.path(), 100) else {
        return;
    };
    let stdout = run_child(&lib_dir);
    assert_eq!(
        line(&stdout, "PROBE "),
        "PROBE NoDevice(\"CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected\")"
    );
    assert_eq!(
        line(&stdout, "AUTO "),
        "AUTO Cpu | note: --device auto: no GPU (CUDA_ERROR_NO_DEVICE: no CUDA-capable device \
         is detected); running on the CPU"
    );
    let cuda = line(&stdout, "CUDA-ERROR ");
    assert!(
        cuda.starts_with("CUDA-ERROR --device cuda: the CUDA driver reports no GPU")
            && cuda.contains("CUDA_ERROR_NO_DEVICE"),
        "{cuda}"
    );
}

#[test]
fn stub_driver_with_zero_devices_is_a_clean_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(lib_dir) = build_stub(dir.path(), 0) else {
        return;
    };
    let stdout = run_child(&lib_dir);
    assert_eq!(
        line(&stdout, "PROBE "),
        "PROBE NoDevice(\"the driver lists 0 devices\")"
    );
    assert!(line(&stdout, "AUTO ").starts_with("AUTO Cpu | note: --device auto: no GPU"));
    assert!(
        line(&stdout, "CUDA-ERROR ")
            .starts_with("CUDA-ERROR --device cuda: the CUDA driver reports no GPU")
    );
}

#[test]
fn no_driver_falls_back_under_auto_and_errors_under_cuda() {
    if driver_present() {
        eprintln!(
            "skipping: a CUDA driver is installed here, so the no-driver path cannot be shown"
        );
        return;
    }
    assert_eq!(probe(), CudaAvailability::NoDriver);
    let auto = choose_backend(DeviceChoice::Auto, 0).expect("auto falls back");
    assert_eq!(auto.backend, Backend::Cpu);
    assert_eq!(
        auto.notice.as_deref(),
        Some("note: --device auto: no CUDA driver found; running on the CPU")
    );
    let error = choose_backend(DeviceChoice::Cuda, 0).expect_err("cuda needs a driver");
    assert_eq!(error, DeviceError::NoDriver);
    assert!(
        error
            .to_string()
            .starts_with("--device cuda: no CUDA driver found (libcuda.so could not be loaded)")
    );
    let cpu = choose_backend(DeviceChoice::Cpu, 0).expect("cpu always works");
    assert_eq!((cpu.backend, cpu.notice), (Backend::Cpu, None));
}
