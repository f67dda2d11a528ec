//! [`train_cuda`]: a whole run on one GPU, the device counterpart of [`crate::train::train`]:
//! the same settings, model, initial parameters and data, the step of [`super::step`] run by
//! [`super::execute`]. **Needs a GPU.**

use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::{CudaBlasLT, Matmul};
use cudarc::driver::{CudaContext, CudaStream};
use dsplan_kernels::cache::CubinCache;

use super::buffers::{DeviceLayout, Region};
use super::execute::{DeviceBuffers, Executor, RunScalars};
use super::mfu::Mfu;
use super::step::{Boundary, StepControl, StepProgram};
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::error::CudaError;
use crate::cuda::gemm::Gemm;
use crate::cuda::launch::{Launcher, Storage};
use crate::cuda::modules::KernelModules;
use crate::data::{BatchLayout, MicroBatchIndex, TokenBatch};
use crate::metrics::ByCategory;
use crate::model::{BatchShape, Gpt2Config, ParamLayout, Recompute};
use crate::train::TrainSpec;
use crate::zero::Dtype as ModelDtype;

/// One optimizer step on the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CudaStepRecord {
    /// Mean loss over the micro-steps.
    pub loss: f64,
    /// Learning rate.
    pub lr: f64,
    /// Pre-clip global norm (`None`: skipped).
    pub grad_norm: Option<f64>,
    /// Loss scale of the backward.
    pub loss_scale: f64,
    /// Wall-clock seconds (synchronised).
    pub seconds: f64,
}

/// What a GPU run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaTrainReport {
    /// The device's name.
    pub device: String,
    /// Every step.
    pub steps: Vec<CudaStepRecord>,
    /// Final fp32 parameters (the master weights, or the f32 parameters).
    pub final_params: Vec<f32>,
    /// The layout's bytes per category (what was allocated).
    pub allocated: ByCategory,
    /// Device memory in use after the run (`total - free` from the driver).
    pub device_used_bytes: u64,
    /// Tokens per optimizer step.
    pub tokens_per_step: u64,
    /// Model FLOPs utilisation over the run (`None`: device not in the peak table).
    pub mfu: Option<f64>,
}

/// Errors of a GPU run.
#[derive(Debug)]
pub enum CudaTrainError {
    /// The CUDA backend failed.
    Cuda(CudaError),
    /// The run cannot be set up (data, world size, precision).
    Setup(String),
}

impl std::fmt::Display for CudaTrainError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CudaTrainError::Cuda(e) => write!(f, "{e}"),
            CudaTrainError::Setup(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for CudaTrainError {}

impl From<CudaError> for CudaTrainError {
    fn from(e: CudaError) -> Self {
        CudaTrainError::Cuda(e)
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

/// Checks on the host, before any CUDA call, that the GPU backend can run `spec`: one rank,
/// a valid model and sequence length, the parameter count, and a step whose every op and
/// launch fits (the model's head size has attention kernels). [`train_cuda`] calls it first;
/// the run command calls it to decide before probing the device.
pub fn check_spec(spec: &TrainSpec) -> Result<(), CudaTrainError> {
    if spec.world > 1 {
        return Err(CudaTrainError::Setup(format!(
            "the CUDA backend trains on one GPU; a world of {} needs the multi-GPU gradient \
             all-reduce, which is not built yet (run with --device cpu for in-process ranks)",
            spec.world
        )));
    }
    let model = gpt2_model(spec)?;
    model.validate().map_err(setup)?;
    if spec.settings.recompute != Recompute::Nothing {
        return Err(CudaTrainError::Setup(
            "the CUDA backend keeps every activation; activation checkpointing (the \
             activation_checkpointing section, --gradient-checkpointing) recomputes on the CPU \
             backend only (run with --device cpu)"
                .into(),
        ));
    }
    if spec.seq_len > model.n_positions {
        return Err(CudaTrainError::Setup(format!(
            "rows of {} tokens are longer than the model's {} positions",
            spec.seq_len, model.n_positions
        )));
    }
    let expected = ParamLayout::new(&model).num_params();
    if spec.initial_params.len() != expected {
        return Err(CudaTrainError::Setup(format!(
            "{} initial parameters for a model of {expected}",
            spec.initial_params.len()
        )));
    }
    let shape = BatchShape {
        batch: spec.settings.batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let dtype = kernel_dtype(spec.settings.precision.model_dtype());
    let layout = DeviceLayout::new(model, shape, dtype);
    StepProgram::new(&layout).check(&layout).map_err(setup)
}

/// The GPT-2 of `spec`: the CUDA kernels exist for GPT-2 only.
fn gpt2_model(spec: &TrainSpec) -> Result<Gpt2Config, CudaTrainError> {
    spec.model.gpt2().copied().ok_or_else(|| {
        CudaTrainError::Setup(format!(
            "the CUDA backend trains GPT-2 only; this {} model runs with --device cpu",
            spec.model.family_name()
        ))
    })
}

/// Trains `spec` on GPU `ordinal` (world size 1 only), calling `observer` after each step.
/// [`check_spec`] runs first: a spec the kernels cannot run is an error before anything is
/// allocated.
pub fn train_cuda(
    spec: &TrainSpec,
    ordinal: usize,
    observer: &dyn Fn(u64, &CudaStepRecord),
) -> Result<CudaTrainReport, CudaTrainError> {
    check_spec(spec)?;
    match spec.settings.precision.model_dtype() {
        ModelDtype::F32 => train_typed::<f32>(spec, ordinal, observer),
        ModelDtype::Bf16 => train_typed::<half::bf16>(spec, ordinal, observer),
        ModelDtype::F16 => train_typed::<half::f16>(spec, ordinal, observer),
    }
}

fn setup(e: impl std::fmt::Display) -> CudaTrainError {
    CudaTrainError::Setup(e.to_string())
}

fn train_typed<T: Storage>(
    spec: &TrainSpec,
    ordinal: usize,
    observer: &dyn Fn(u64, &CudaStepRecord),
) -> Result<CudaTrainReport, CudaTrainError>
where
    CudaBlasLT: Matmul<T>,
{
    let settings = &spec.settings;
    let batch = settings.batch;
    let shape = BatchShape {
        batch: batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let model = gpt2_model(spec)?;
    let layout = DeviceLayout::new(model, shape, T::DTYPE);
    let program = StepProgram::new(&layout);
    let data_layout =
        BatchLayout::new(batch.micro_batch, spec.seq_len, batch.grad_accum, 1).map_err(setup)?;
    let mut source = spec.data.open(data_layout).map_err(setup)?;
    if source.token_bound() as usize > model.vocab_size {
        return Err(CudaTrainError::Setup(format!(
            "the data holds token ids up to {}, beyond the model's vocabulary of {}",
            source.token_bound().saturating_sub(1),
            model.vocab_size
        )));
    }
    if let Some(available) = source.steps()
        && available < spec.steps
    {
        return Err(CudaTrainError::Setup(format!(
            "the data holds {available} step(s); {} were asked for",
            spec.steps
        )));
    }

    let ctx = CudaContext::new(ordinal).map_err(CudaError::from)?;
    let device = ctx.name().map_err(CudaError::from)?;
    let stream = ctx.default_stream();
    let modules = KernelModules::new(ctx.clone(), CubinCache::default_dir().map(CubinCache::new))?;
    let executor = Executor {
        launcher: Launcher::new(&modules, stream.clone()),
        gemm: Gemm::new(stream.clone())?,
        eps: model.layer_norm_epsilon,
    };
    let mut bufs = DeviceBuffers::<T>::new(&stream, &layout, &spec.initial_params)?;
    let mut control = StepControl {
        grad_accum: batch.grad_accum.max(1),
        clip: settings.gradient_clipping,
        adam: settings.optimizer.adam,
        base_lr: settings.optimizer.lr,
        schedule: settings.schedule.clone(),
        checks_overflow: settings.precision.checks_overflow(),
        scaler: settings
            .precision
            .loss_scaler(settings.stage)
            .map_err(setup)?,
        applied_steps: 0,
    };

    let tokens_per_step = (batch.train_batch * spec.seq_len) as u64;
    let mut steps = Vec::new();
    let started = Instant::now();
    for step in 0..spec.steps {
        let step_started = Instant::now();
        let loss_scale = control.scaler.scale();
        let mut batches = Vec::with_capacity(control.grad_accum);
        for micro_step in 0..control.grad_accum {
            batches.push(
                source
                    .micro_batch(MicroBatchIndex {
                        step,
                        rank: 0,
                        micro_step,
                    })
                    .map_err(setup)?,
            );
        }
        let (loss, boundary) = run_step(
            &executor,
            &stream,
            &program,
            &mut bufs,
            &mut control,
            &batches,
        )?;
        stream.synchronize().map_err(CudaError::from)?;
        let (lr, grad_norm) = match boundary {
            Boundary::Applied { lr, grad_norm, .. } => (lr, Some(grad_norm)),
            Boundary::Skipped => (control.lr(), None),
        };
        let record = CudaStepRecord {
            loss,
            lr,
            grad_norm,
            loss_scale,
            seconds: step_started.elapsed().as_secs_f64(),
        };
        observer(step, &record);
        steps.push(record);
    }
    let seconds = started.elapsed().as_secs_f64();
    let (free, total) = ctx.mem_get_info().map_err(CudaError::from)?;
    let final_params = download_master(&stream, &layout, &bufs)?;
    let tokens = tokens_per_step * spec.steps;
    let mfu = Mfu::of(&model, spec.seq_len, &device)
        .map(|m| m.utilisation(tokens as f64 / seconds.max(1e-9)));
    Ok(CudaTrainReport {
        device,
        steps,
        final_params,
        allocated: layout.bytes_by_category(),
        device_used_bytes: (total - free) as u64,
        tokens_per_step,
        mfu,
    })
}

/// One optimizer step: micro-steps, norm, host decision, update. Returns the mean loss.
pub fn run_step<T: Storage>(
    executor: &Executor<'_>,
    stream: &Arc<CudaStream>,
    program: &StepProgram,
    bufs: &mut DeviceBuffers<T>,
    control: &mut StepControl,
    batches: &[TokenBatch],
) -> Result<(f64, Boundary), CudaError>
where
    CudaBlasLT: Matmul<T>,
{
    let mut scalars = RunScalars {
        dloss: 0.0,
        inv_scale: control.inv_scale(),
        adam: None,
        bucket_groups: 0,
    };
    for op in &program.start {
        executor.run(op, bufs, &scalars)?;
    }
    let mut loss_sum = 0.0f64;
    for batch in batches {
        let inputs = batch.inputs();
        let targets: Vec<i32> = batch.targets().iter().map(|&t| t as i32).collect();
        if inputs.len() != bufs.tokens.len() {
            return Err(CudaError::Shape(format!(
                "a micro-batch of {} tokens for buffers of {}",
                inputs.len(),
                bufs.tokens.len()
            )));
        }
        let buckets = TokenBuckets::new(&inputs)
            .ok_or_else(|| CudaError::Shape("batch too large for i32 rows".to_string()))?;
        stream.memcpy_htod(&inputs, &mut bufs.tokens)?;
        stream.memcpy_htod(&targets, &mut bufs.targets)?;
        stream.memcpy_htod(
            &buckets.tokens,
            &mut bufs.bucket_tokens.slice_mut(..buckets.len()),
        )?;
        stream.memcpy_htod(
            &buckets.starts,
            &mut bufs.bucket_starts.slice_mut(..buckets.len() + 1),
        )?;
        stream.memcpy_htod(&buckets.rows, &mut bufs.bucket_rows)?;
        scalars.bucket_groups = buckets.len();
        let count = targets.len().max(1);
        scalars.dloss = control.grad_scale() / count as f32;
        for op in &program.micro_step {
            executor.run(op, bufs, &scalars)?;
        }
        let losses = stream.clone_dtoh(&bufs.stats.slice(losses_range(bufs, count)))?;
        stream.synchronize()?;
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        loss_sum += total / count as f64;
    }
    for op in &program.norm {
        executor.run(op, bufs, &scalars)?;
    }
    let total = stream.clone_dtoh(&bufs.norm_total)?;
    let flag = stream.clone_dtoh(&bufs.found_inf)?;
    stream.synchronize()?;
    let boundary = control
        .boundary(total[0], flag[0] != 0)
        .map_err(|e| CudaError::Shape(e.to_string()))?;
    if let Boundary::Applied { scalars: adam, .. } = boundary {
        scalars.adam = Some(adam);
        for op in &program.update {
            executor.run(op, bufs, &scalars)?;
        }
    }
    Ok((loss_sum / batches.len().max(1) as f64, boundary))
}

/// Where the losses live in `Stats` (the last `count` elements: `losses` is pushed last).
fn losses_range<T: Storage>(bufs: &DeviceBuffers<T>, count: usize) -> std::ops::Range<usize> {
    let end = bufs.stats.len();
    end - count..end
}

/// The fp32 weights after training.
pub fn download_master<T: Storage>(
    stream: &Arc<CudaStream>,
    layout: &DeviceLayout,
    bufs: &DeviceBuffers<T>,
) -> Result<Vec<f32>, CudaError> {
    let host = if layout.has_master() {
        stream.clone_dtoh(&bufs.master)?
    } else {
        let params = stream.clone_dtoh(&bufs.params)?;
        params.iter().map(|x| x.to_f32()).collect()
    };
    stream.synchronize()?;
    Ok(host[..layout.len(Region::Params)].to_vec())
}
