//! Whether the GPU backend can run a spec, decided on the host before any CUDA call
//! ([`check_spec`]), and what a GPU run fails with ([`CudaTrainError`]). The runs themselves
//! (one GPU, thread ranks, a process rank, and the front door `train_cuda`) are in
//! [`super::world`], the backend of the training loop in [`super::rank::CudaStep`], the
//! checkpoint layout in [`super::owned`].

use super::layout::DeviceLayout;
use super::step::StepProgram;
use crate::cuda::error::CudaError;
use crate::train::AttentionKernel;
use crate::train::{TrainError, TrainSpec};
use crate::zero::Dtype as ModelDtype;

/// Errors of a GPU run.
#[derive(Debug)]
pub enum CudaTrainError {
    /// The CUDA backend failed.
    Cuda(CudaError),
    /// The GPU backend cannot run this spec (world size, model family, head size, sliding
    /// window).
    Setup(String),
    /// The run failed as it would on any backend (data, model, plan, checkpoints, a step).
    Run(TrainError),
}

impl std::fmt::Display for CudaTrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaTrainError::Cuda(e) => write!(f, "{e}"),
            CudaTrainError::Setup(e) => f.write_str(e),
            CudaTrainError::Run(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CudaTrainError {}

impl From<CudaError> for CudaTrainError {
    fn from(e: CudaError) -> Self {
        CudaTrainError::Cuda(e)
    }
}

impl From<TrainError> for CudaTrainError {
    fn from(e: TrainError) -> Self {
        CudaTrainError::Run(e)
    }
}

/// The kernel dtype of the run's model dtype.
pub fn kernel_dtype(dtype: ModelDtype) -> dsplan_kernels::Dtype {
    match dtype {
        ModelDtype::F32 => dsplan_kernels::Dtype::F32,
        ModelDtype::Bf16 => dsplan_kernels::Dtype::Bf16,
        ModelDtype::F16 => dsplan_kernels::Dtype::F16,
    }
}

/// Checks on the host, before any CUDA call, that the GPU backend can run `spec`: a GPT-2
/// or Llama-family model at any world size, that is valid for the run's rows (the checks of every backend),
/// and a step whose every op and launch fits (the model's head size has
/// attention kernels). The data and the initial parameters are checked when the run starts,
/// as on every backend. `train_cuda` calls it first; the run command calls it to decide
/// before probing the device.
pub fn check_spec(spec: &TrainSpec) -> Result<(), CudaTrainError> {
    crate::train::check_model(spec)?;
    let shape = crate::model::BatchShape {
        batch: spec.settings.batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let dtype = kernel_dtype(spec.settings.precision().model_dtype());
    let attention = spec.settings.attention;
    if attention != AttentionKernel::Scalar && dtype == dsplan_kernels::Dtype::F32 {
        return Err(CudaTrainError::Setup(format!(
            "--attention-kernel {attention} is built for bf16 and fp16 training; this config \
             trains in f32 (enable bf16 or fp16, or use --attention-kernel scalar)"
        )));
    }
    let layout = DeviceLayout::recomputing(spec.model, shape, dtype, spec.settings.recompute);
    StepProgram::new(&layout)
        .with_attention(attention)
        .check(&layout)
        .map_err(|e| CudaTrainError::Setup(e.to_string()))
}
