//! `dsplan report --check`: compiles every kernel file for the device, runs every kernel
//! against the CPU function it must match in every precision it is built for, and one
//! training step against the CPU backend; each comparison is a [`CheckRow`] with the measured
//! error and its tolerance. **Running needs a GPU**; the rows and their verdicts are plain
//! data, rendered by the CLI and tested on the host.
//!
//! The ignored GPU tests (`executor/tests/cuda_kernels.rs`, `cuda_train.rs`) call the same
//! functions and assert that every row passes, so the binary and the tests check one thing.
//!
//! | module | job |
//! |---|---|
//! | [`compare`] | rows: the error measures, tolerances and verdicts |
//! | [`bench`] | a kernel check's device buffers by operand name, launched through the launch table's bindings |
//! | [`gpu`] | a context, its kernels and stream, and typed copies to and from the device |
//! | [`kernels`] | every kernel (and cuBLASLt product) against its CPU reference, f32, bf16, f16 |
//! | [`step`] | one optimizer step on the GPU against the CPU backend, fp32 and bf16 |

pub mod bench;
pub mod compare;
pub mod gpu;
pub mod kernels;
pub mod step;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use compare::{CheckKind, CheckRow, Metric, Verdict};
use gpu::Gpu;

use super::error::CudaError;

/// Every row of a check run, on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// The device's name.
    pub device: String,
    /// Its compute capability, e.g. `9.0`.
    pub compute_capability: String,
    /// Every comparison, in the order run.
    pub rows: Vec<CheckRow>,
    /// Wall-clock seconds of the whole check.
    pub seconds: f64,
}

impl CheckReport {
    /// Rows with this verdict.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.rows.iter().filter(|r| r.verdict == verdict).count()
    }

    /// Whether no row failed (skipped rows do not fail the check).
    pub fn passed(&self) -> bool {
        self.count(Verdict::Fail) == 0
    }
}

/// Which parts to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Compilation and the kernels only.
    Kernels,
    /// Kernels, then the training step against the CPU backend.
    KernelsAndStep,
}

/// Runs the check on GPU `ordinal`, calling `progress` with each row as it is made. The
/// caller has probed the driver (see [`super::device::probe`]); an error here means the
/// device could not be set up at all (no context).
pub fn run(
    ordinal: usize,
    scope: Scope,
    progress: &dyn Fn(&CheckRow),
) -> Result<CheckReport, CudaError> {
    let start = Instant::now();
    let gpu = Gpu::new(ordinal)?;
    let mut rows = Vec::new();
    let mut push = |row: CheckRow| {
        progress(&row);
        rows.push(row);
    };
    for row in kernels::compile_all(&gpu) {
        push(row);
    }
    for (name, case) in kernels::CASES {
        for row in guarded(CheckKind::Kernel, name, || case(&gpu)) {
            push(row);
        }
    }
    if scope == Scope::KernelsAndStep {
        let step = || step::one_step_vs_cpu(ordinal);
        for row in guarded(CheckKind::TrainStep, "train step vs CPU backend", step) {
            push(row);
        }
    }
    Ok(CheckReport {
        device: gpu.name.clone(),
        compute_capability: format!("{}.{}", gpu.arch.major, gpu.arch.minor),
        rows,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// `case`'s rows; an error or a panic inside it becomes one failed row naming it.
fn guarded(
    kind: CheckKind,
    name: &str,
    case: impl FnOnce() -> Result<Vec<CheckRow>, String>,
) -> Vec<CheckRow> {
    match catch_unwind(AssertUnwindSafe(case)) {
        Ok(Ok(rows)) => rows,
        Ok(Err(error)) => vec![CheckRow::failed(kind, name, error)],
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".to_string());
            vec![CheckRow::failed(kind, name, format!("panicked: {message}"))]
        }
    }
}
