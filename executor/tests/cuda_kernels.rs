//! Every registered kernel against the CPU function it must match, on random inputs, in f32,
//! bf16 and f16, with per-precision tolerances: the cases of
//! [`dsplan_executor::cuda::check::kernels`], the same `dsplan report --check` runs, asserted
//! here row by row. **Needs an NVIDIA GPU** (sm_80 or newer) and `libnvrtc`, `libcublasLt`
//! (and `libnccl` for the NCCL case) on the loader path; run there with `cargo test -p
//! dsplan-executor --test cuda_kernels -- --ignored`, or the packed binary with `--ignored`.
//!
//! Run with `--ignored` on a machine without a usable GPU, each test prints `skipping: ...`
//! and then fails: a pass that checked nothing would read as one.

use dsplan_executor::cuda::check::gpu::Gpu;
use dsplan_executor::cuda::check::kernels::{CASES, compile_all};
use dsplan_executor::cuda::check::{CheckRow, Verdict};
use dsplan_executor::cuda::{DeviceChoice, choose_backend};

fn gpu() -> Gpu {
    match choose_backend(DeviceChoice::Cuda, 0) {
        Ok(choice) => eprintln!("running on {:?}", choice.backend),
        Err(error) => {
            eprintln!("skipping: no CUDA device ({error})");
            panic!("this test needs a usable NVIDIA GPU and was run with --ignored without one");
        }
    }
    Gpu::new(0).unwrap_or_else(|e| panic!("GPU 0: {e}"))
}

#[track_caller]
fn assert_rows(rows: &[CheckRow]) {
    assert!(!rows.is_empty(), "the case produced no rows");
    for row in rows {
        eprintln!(
            "{:?} {} [{}]: {:?} {:.3e} (tol {:.1e}) {}",
            row.verdict,
            row.name,
            row.dtype,
            row.metric,
            row.error,
            row.tol,
            row.detail.as_deref().unwrap_or("")
        );
    }
    let failed: Vec<&CheckRow> = rows.iter().filter(|r| r.verdict == Verdict::Fail).collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

fn case(name: &str) {
    let gpu = gpu();
    let (_, run) = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    assert_rows(&run(&gpu).unwrap_or_else(|e| panic!("{name}: {e}")));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_kernel_file_compiles_and_loads() {
    assert_rows(&compile_all(&gpu()));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn encoder_matches_cpu() {
    case("encoder");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn layernorm_matches_cpu() {
    case("layernorm");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gelu_and_bias_match_cpu() {
    case("gelu and bias");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn accumulate_adds_a_bucket_part_into_the_partition() {
    case("accumulate");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attention_matches_cpu_without_a_score_matrix() {
    case("attention");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn classifier_matches_cpu() {
    case("classifier");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rmsnorm_matches_cpu() {
    case("rmsnorm");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn rope_matches_cpu() {
    case("rope");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn swiglu_matches_cpu() {
    case("swiglu");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn grouped_query_attention_matches_cpu() {
    case("grouped-query attention");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn casts_round_like_the_half_crate() {
    case("casts");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn unscale_norm_matches_cpu_and_flags_overflow() {
    case("unscale and norm");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn adamw_matches_cpu_adam_step_and_writes_the_16_bit_copy() {
    case("adamw");
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cublaslt_gemms_match_cpu_matmul() {
    case("cuBLASLt");
}

#[test]
#[ignore = "needs an NVIDIA GPU and libnccl"]
fn nccl_world_of_one_round_trips() {
    case("NCCL");
}

/// Every case has a test above (the list cannot drift from the library's).
#[test]
fn every_case_has_a_test() {
    let names: Vec<&str> = CASES.iter().map(|(name, _)| *name).collect();
    assert_eq!(
        names,
        [
            "encoder",
            "layernorm",
            "gelu and bias",
            "accumulate",
            "attention",
            "classifier",
            "rmsnorm",
            "rope",
            "swiglu",
            "grouped-query attention",
            "casts",
            "unscale and norm",
            "adamw",
            "cuBLASLt",
            "NCCL"
        ]
    );
}
