//! Runtime overhead as named, adjustable margins, and the initialisation transients.
//!
//! | margin | default | source |
//! |---|---|---|
//! | [`Margins::cuda_context_bytes`] | 1 GiB per GPU (`--cuda-context`) | CUDA context plus cuBLAS/NCCL workspaces: 0.3-2 GB reported (research/peers.md §4.1, vram.asmirnov.xyz); 1 GiB is dsplan's middle value |
//! | [`Margins::fragmentation`] | 10 % (`--fragmentation`) | of the bytes allocated and freed during a step (buffers and activations); ColossalAI Gemini keeps 10 % of a GPU free for the same reason (peers.md §4.6) |
//! | [`Margins::host_process_bytes`] | 2 GiB per rank (`--host-overhead`) | interpreter, PyTorch, CUDA runtime host memory of one training process: dsplan's assumption, not a measurement |
//! | [`Margins::load_bytes_per_param`] | 4 | (`--model-load-bytes`) each rank materialises the model in fp32 on the host before DeepSpeed takes it, as DeepSpeed's own estimators assume (deepspeed-facts §1.1-1.2) |
//!
//! Initialisation also holds the loaded model on the host (`load_bytes_per_param` per
//! parameter per rank; only the largest layer under `zero.Init`), and, at ZeRO-3 without
//! `zero.Init`, the whole 16-bit model on every GPU until it is partitioned.

use crate::config::ZeroStage;
use crate::estimate::ZeroInit;
use serde::Serialize;
use std::fmt;

use super::context::Context;
use super::rows::{Category, Device, Phase, PhaseBytes, Row, Term, saturate};

/// The runtime margins the estimate adds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Margins {
    /// Bytes of CUDA context and library workspaces per GPU.
    pub cuda_context_bytes: u64,
    /// Fraction of the step's dynamic GPU bytes (buffers and activations) lost to the caching
    /// allocator's fragmentation.
    pub fragmentation: f64,
    /// Host bytes of each training process besides its tensors.
    pub host_process_bytes: u64,
    /// Bytes per parameter of the model each rank loads on the host before DeepSpeed.
    pub load_bytes_per_param: u64,
}

/// The default CUDA context margin: 1 GiB.
pub const DEFAULT_CUDA_CONTEXT_BYTES: u64 = 1 << 30;
/// The default fragmentation margin: 10 %.
pub const DEFAULT_FRAGMENTATION: f64 = 0.10;
/// The default host memory of one process: 2 GiB.
pub const DEFAULT_HOST_PROCESS_BYTES: u64 = 2 << 30;
/// The default load precision: fp32, 4 bytes per parameter.
pub const DEFAULT_LOAD_BYTES_PER_PARAM: u64 = 4;

impl Default for Margins {
    fn default() -> Margins {
        Margins {
            cuda_context_bytes: DEFAULT_CUDA_CONTEXT_BYTES,
            fragmentation: DEFAULT_FRAGMENTATION,
            host_process_bytes: DEFAULT_HOST_PROCESS_BYTES,
            load_bytes_per_param: DEFAULT_LOAD_BYTES_PER_PARAM,
        }
    }
}

/// A margin that makes no sense.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BadMargin(pub f64);

impl fmt::Display for BadMargin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the fragmentation margin must be a fraction between 0 and 1, not {}",
            self.0
        )
    }
}

impl std::error::Error for BadMargin {}

impl Margins {
    /// Checks the fragmentation fraction.
    pub fn check(&self) -> Result<(), BadMargin> {
        if self.fragmentation.is_finite() && (0.0..=1.0).contains(&self.fragmentation) {
            Ok(())
        } else {
            Err(BadMargin(self.fragmentation))
        }
    }
}

/// CUDA context, host processes and the initialisation transients.
pub fn overhead_rows(ctx: &Context<'_>, margins: &Margins) -> Vec<Row> {
    let mut rows = vec![
        ctx.row(
            Term::CudaContext,
            Category::Overhead,
            Device::Gpu,
            PhaseBytes::resident(margins.cuda_context_bytes),
            "margin: CUDA context, cuBLAS and NCCL workspaces",
        ),
        ctx.row(
            Term::HostProcess,
            Category::Overhead,
            Device::CpuPageable,
            PhaseBytes::resident(margins.host_process_bytes),
            "margin: one training process",
        ),
    ];
    let zero3 = ctx.setup.zero.stage == ZeroStage::Weights;
    let zero_init = zero3 && ctx.setup.zero_init == ZeroInit::Enabled;
    let load = u128::from(margins.load_bytes_per_param);
    let (loaded, what) = if zero_init {
        (
            u128::from(ctx.model.largest_layer),
            "largest layer (zero.Init builds the model partitioned)",
        )
    } else {
        (ctx.params(), "P (the whole model)")
    };
    rows.push(ctx.row(
        Term::ModelLoad,
        Category::Overhead,
        Device::CpuPageable,
        PhaseBytes::during(&[Phase::Init], saturate(load * loaded)),
        format!("{load}·{what}"),
    ));
    if zero3 && !zero_init {
        let e = u128::from(ctx.setup.precision.element_bytes());
        rows.push(ctx.row(
            Term::UnpartitionedModel,
            Category::Overhead,
            Device::Gpu,
            PhaseBytes::during(&[Phase::Init], saturate(e * ctx.params())),
            format!("{e}·P: the engine moves the whole model to the GPU before partitioning it (no zero.Init)"),
        ));
    }
    rows
}

/// The fragmentation row: `fraction ×` the GPU buffers and activations of each phase.
pub fn fragmentation_row(rows: &[Row], margins: &Margins) -> Row {
    let mut bytes = PhaseBytes::default();
    for phase in Phase::ALL {
        let dynamic: u64 = rows
            .iter()
            .filter(|row| row.device == Device::Gpu)
            .filter(|row| matches!(row.category, Category::Buffers | Category::Activations))
            .map(|row| row.bytes.get(phase))
            .fold(0, u64::saturating_add);
        // Exact enough: dynamic bytes stay far below 2^53.
        bytes.set(
            phase,
            (dynamic as f64 * margins.fragmentation).round() as u64,
        );
    }
    Row::new(
        Term::Fragmentation,
        Category::Overhead,
        Device::Gpu,
        bytes,
        format!(
            "margin: {} % of the GPU buffers and activations",
            margins.fragmentation * 100.0
        ),
    )
}
