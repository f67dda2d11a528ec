//! Every `.cu` file compiles through NVRTC for sm_90 (H100/H200) and sm_80 (A100), and the PTX
//! defines every registered entry point.
//!
//! Needs `libnvrtc` on the loader path: `pip install nvidia-cuda-nvrtc` installs
//! `site-packages/nvidia/cu13/lib/libnvrtc.so.13`; put that directory on `LD_LIBRARY_PATH`
//! before starting the tests (`.ci/run` does). Without it the tests print
//! `skipping: libnvrtc not found (pip install nvidia-cuda-nvrtc)` and pass, unless
//! `DSPLAN_REQUIRE_NVRTC=1` (set by `.ci/run` once the wheel is installed), where they fail.

use std::time::Instant;

use dsplan_kernels::nvrtc::nvrtc_version;
use dsplan_kernels::{CudaSource, GpuArch, KERNELS, NvrtcError, SOURCES, compile, nvrtc_available};

/// True when the tests can run; prints the skip line (or fails, when NVRTC is required).
fn nvrtc_or_skip() -> bool {
    if nvrtc_available() {
        return true;
    }
    let required = std::env::var("DSPLAN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "DSPLAN_REQUIRE_NVRTC=1 but libnvrtc cannot be opened; LD_LIBRARY_PATH={:?}",
        std::env::var("LD_LIBRARY_PATH").ok()
    );
    eprintln!("skipping: libnvrtc not found (pip install nvidia-cuda-nvrtc)");
    false
}

fn compile_all(arch: GpuArch) -> Vec<(String, f64)> {
    let mut times = Vec::new();
    for source in SOURCES {
        let start = Instant::now();
        let module = compile(source, arch).unwrap_or_else(|e| panic!("{e}"));
        let seconds = start.elapsed().as_secs_f64();
        assert!(
            module.ptx.contains(&format!(".target {}", arch.sm_name())),
            "{}: PTX is not for {arch}",
            source.file_name
        );
        assert!(
            module.cubin.starts_with(b"\x7fELF"),
            "{}: the CUBIN is not an ELF image",
            source.file_name
        );
        for spec in KERNELS.iter().filter(|k| k.source == source) {
            for entry in spec.entry_points {
                assert!(
                    module.ptx_has_entry(entry),
                    "{}: PTX for {arch} lacks entry `{entry}`",
                    source.file_name
                );
            }
        }
        times.push((format!("{} {arch}", source.file_name), seconds));
    }
    times
}

#[test]
fn every_source_compiles_for_sm90_and_sm80() {
    if !nvrtc_or_skip() {
        return;
    }
    let version = nvrtc_version().expect("NVRTC version");
    let start = Instant::now();
    // One thread per architecture: NVRTC compiles independent programs concurrently.
    let times: Vec<(String, f64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = [GpuArch::SM90, GpuArch::SM80]
            .into_iter()
            .map(|arch| scope.spawn(move || compile_all(arch)))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("compile thread"))
            .collect()
    });
    eprintln!("NVRTC {}.{}:", version.0, version.1);
    for (what, seconds) in &times {
        eprintln!("  {what:<24} {seconds:6.2} s");
    }
    eprintln!(
        "  wall (2 threads)         {:6.2} s",
        start.elapsed().as_secs_f64()
    );
}

const BROKEN: CudaSource = CudaSource {
    file_name: "broken.cu",
    text: "extern \"C\" __global__ void broken(float* x) {\n  x[0] = undefined_name;\n}\n",
};

#[test]
fn a_compile_error_names_the_file_and_line() {
    if !nvrtc_or_skip() {
        return;
    }
    match compile(&BROKEN, GpuArch::SM90) {
        Err(NvrtcError::Compile { file_name, log, .. }) => {
            assert_eq!(file_name, "broken.cu");
            assert!(log.contains("broken.cu(2)"), "log: {log}");
            assert!(log.contains("undefined_name"), "log: {log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}
