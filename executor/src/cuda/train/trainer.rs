//! [`train_cuda`]: a whole run on one GPU through the one training loop of every backend
//! (`crate::train::step`): the same settings, model, initial parameters, data checks, loss
//! scaler, schedule, clipping, metrics, checkpoints and resume as [`crate::train::train`], the
//! step's operations run on the device by [`CudaStep`] (the op lists of [`super::step`], run by
//! [`super::execute`]). **Needs a GPU.**
//!
//! Checkpoints are the CPU rank's files: the device's whole flat state is handed out and taken
//! back in the layout a single CPU rank of the same plan holds ([`owned_from_whole`],
//! [`held_from_whole`], [`crate::checkpoint::consolidate`]), so a run saved on the GPU resumes
//! on the CPU and back.

use std::sync::Arc;
use std::time::Instant;

use cudarc::cublaslt::{CudaBlasLT, Matmul};
use cudarc::driver::{CudaContext, CudaStream};
use dsplan_kernels::cache::CubinCache;
use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::{ModelGraph, Plan, PlanBackend};
use dsplan_planner::schedule::clip::fp32_clip_coefficient;

use super::buffers::{Region, RegionSizes};
use super::device_model::DeviceModel;
use super::execute::{DeviceBuffers, Executor, RunScalars};
use crate::checkpoint::consolidate;
use crate::comm::{Comm, LocalComm};
use crate::cuda::adamw::AdamScalars;
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::error::CudaError;
use crate::cuda::gemm::Gemm;
use crate::cuda::launch::{Launcher, Storage};
use crate::cuda::modules::KernelModules;
use crate::data::TokenBatch;
use crate::metrics::{DeviceRun, MemoryReport, PhaseTimes, StepMetrics};
use crate::optim::AdamConfig;
use crate::train::step::drive;
use crate::train::{
    CheckpointOptions, StepBackend, TrainError, TrainReport, TrainSpec, compile_cuda_plan,
};
use crate::zero::{ClipRule, Dtype as ModelDtype, EnginePlan, OwnedState, Scales, ZeroError};

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

/// Checks on the host, before any CUDA call, that the GPU backend can run `spec`: one rank,
/// a GPT-2 or Llama-family model that is valid for the run's rows (the checks of every backend),
/// and a step whose every op and launch fits (the model's head size has
/// attention kernels). The data and the initial parameters are checked when the run starts,
/// as on every backend. [`train_cuda`] calls it first; the run command calls it to decide
/// before probing the device.
pub fn check_spec(spec: &TrainSpec) -> Result<(), CudaTrainError> {
    if spec.world > 1 {
        return Err(CudaTrainError::Setup(format!(
            "the CUDA trainer drives one GPU; for a world of {} the plan and each rank's \
             device step with its collectives are built (`dsplan plan --backend dsplan-cuda \
             --world-size {}` shows them) but no trainer runs them yet: run with --device cpu \
             for in-process ranks, or --world-size 1",
            spec.world, spec.world
        )));
    }
    crate::train::check_model(spec)?;
    let shape = crate::model::BatchShape {
        batch: spec.settings.batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let dtype = kernel_dtype(spec.settings.precision().model_dtype());
    let model = DeviceModel::new(&spec.model, shape, dtype, spec.settings.recompute);
    model
        .check(&model.program())
        .map_err(|e| CudaTrainError::Setup(e.to_string()))
}

/// Trains `spec` on GPU `ordinal` (world size 1 only) by its `dsplan-cuda` plan
/// ([`compile_cuda_plan`]), calling `observer` after each step. [`check_spec`] runs first: a
/// spec the kernels cannot run is an error before anything is allocated.
pub fn train_cuda(
    spec: &TrainSpec,
    ordinal: usize,
    observer: &dyn Fn(u64, &StepMetrics),
) -> Result<TrainReport, CudaTrainError> {
    check_spec(spec)?;
    let (plan, graph) = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .map_err(TrainError::Plan)?;
    train_cuda_planned(
        spec,
        &plan,
        &graph,
        &CheckpointOptions::default(),
        ordinal,
        &|m| observer(m.step, m),
    )
}

/// Runs `spec` on GPU `ordinal` by `plan` (compiled for `graph`, best with
/// [`compile_cuda_plan`]: then the device memory is the plan's to the byte), resumed and saved
/// as `checkpoints` says, calling `observer` with every step.
pub fn train_cuda_planned(
    spec: &TrainSpec,
    plan: &Plan,
    graph: &ModelGraph,
    checkpoints: &CheckpointOptions,
    ordinal: usize,
    observer: &dyn Fn(&StepMetrics),
) -> Result<TrainReport, CudaTrainError> {
    check_spec(spec)?;
    let prepared =
        crate::train::run::prepare(spec, plan, graph, checkpoints, PlanBackend::DsplanCuda)?;
    let run = Run {
        spec,
        prepared: &prepared,
        checkpoints,
        ordinal,
        observer,
    };
    match spec.settings.precision().model_dtype() {
        ModelDtype::F32 => run.on::<f32>(),
        ModelDtype::Bf16 => run.on::<half::bf16>(),
        ModelDtype::F16 => run.on::<half::f16>(),
    }
}

/// A checked run, before its storage type is chosen.
struct Run<'a> {
    spec: &'a TrainSpec,
    prepared: &'a crate::train::run::Prepared<'a>,
    checkpoints: &'a CheckpointOptions,
    ordinal: usize,
    observer: &'a dyn Fn(&StepMetrics),
}

impl Run<'_> {
    fn on<T: Storage>(&self) -> Result<TrainReport, CudaTrainError>
    where
        CudaBlasLT: Matmul<T>,
    {
        let (spec, prepared) = (self.spec, self.prepared);
        let model = DeviceModel::new(
            &spec.model,
            prepared.shape,
            T::DTYPE,
            spec.settings.recompute,
        );
        let program = model.program();
        let layout = model.sizes();

        let ctx = CudaContext::new(self.ordinal).map_err(CudaError::from)?;
        let device = ctx.name().map_err(CudaError::from)?;
        let stream = ctx.default_stream();
        let modules =
            KernelModules::new(ctx.clone(), CubinCache::default_dir().map(CubinCache::new))?;
        let executor = Executor {
            launcher: Launcher::new(&modules, stream.clone()),
            gemm: Gemm::new(stream.clone())?,
            eps: model.eps(),
        };
        let comm = LocalComm::group(1)
            .map_err(TrainError::Comm)?
            .pop()
            .ok_or(TrainError::Comm(crate::comm::CommError::EmptyGroup))?;
        let mut backend = CudaStep {
            bufs: DeviceBuffers::<T>::new(
                &stream,
                layout,
                model.param_table(),
                prepared.initial_params,
            )?,
            executor: &executor,
            stream: stream.clone(),
            program: &program,
            layout,
            plan: &prepared.engine_plan,
            comm,
            scalars: RunScalars {
                dloss: 0.0,
                inv_scale: 1.0,
                adam: None,
                bucket_groups: 0,
            },
            sum_of_squares: 0.0,
            found_inf: false,
            multiplier: 1.0,
            adam_steps: 0,
        };
        for constant in model.constants() {
            let span = constant.at.span;
            stream
                .memcpy_htod(
                    &constant.values,
                    &mut backend.bufs.stats.slice_mut(span.offset..span.end()),
                )
                .map_err(CudaError::from)?;
        }
        let started = Instant::now();
        let driven = drive(&mut backend, prepared, self.checkpoints, self.observer)
            .map_err(|failure| failure.into_train_error(0))?;
        let seconds = started.elapsed().as_secs_f64();
        let (free, total) = ctx.mem_get_info().map_err(CudaError::from)?;
        let final_params = download_master(&stream, layout, &backend.bufs)?;
        let tokens = prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step);
        let mfu = model
            .mfu(spec.seq_len, &device)
            .map(|m| m.utilisation(tokens as f64 / seconds.max(1e-9)));
        let allocated = model.bytes_by_category();
        Ok(TrainReport {
            steps: driven.steps,
            final_params,
            memory: vec![MemoryReport {
                peak_total: allocated.total(),
                peak: allocated,
                at_peak: allocated,
            }],
            predicted: prepared.predicted,
            plan_memory: prepared.plan_memory,
            correspondence: prepared.correspondence.clone(),
            traffic: vec![backend.comm.traffic().clone()],
            applied_steps: driven.applied_steps,
            seconds,
            tokens,
            nvme: None,
            first_step: prepared.first_step,
            checkpoints: driven.checkpoints,
            device: Some(DeviceRun {
                name: device,
                mfu,
                driver_used_bytes: (total - free) as u64,
            }),
        })
    }
}

/// The CUDA backend of the training loop: the step's op lists run on one GPU's buffers.
pub struct CudaStep<'a, T: Storage> {
    executor: &'a Executor<'a>,
    stream: Arc<CudaStream>,
    program: &'a super::StepProgram,
    layout: &'a dyn RegionSizes,
    plan: &'a EnginePlan,
    bufs: DeviceBuffers<T>,
    /// A group of one: the loop's loss average and checkpoint agreement.
    comm: LocalComm,
    scalars: RunScalars,
    /// The norm pass's sum of squares (of the gradients divided by the loss scale).
    sum_of_squares: f64,
    /// The norm pass's inf/NaN flag.
    found_inf: bool,
    /// What the fused AdamW multiplies each gradient by (`clip * S / S'`).
    multiplier: f32,
    /// Adam's step count.
    adam_steps: u64,
}

/// A CUDA failure as the loop's error.
fn device(e: impl Into<CudaError>) -> ZeroError {
    ZeroError::Device(e.into().to_string())
}

impl<T: Storage> CudaStep<'_, T>
where
    CudaBlasLT: Matmul<T>,
{
    fn run_ops(&mut self, ops: &[super::Op]) -> Result<(), ZeroError> {
        for op in ops {
            self.executor
                .run(op, &mut self.bufs, &self.scalars)
                .map_err(device)?;
        }
        Ok(())
    }

    /// The fp32 master (the parameters themselves in fp32 runs), whole and flat.
    fn whole_master(&self) -> Result<Vec<f32>, CudaError> {
        download_master(&self.stream, self.layout, &self.bufs)
    }

    fn whole(&self, region: Region) -> Result<Vec<f32>, CudaError> {
        let values = match region {
            Region::ExpAvg => self.stream.clone_dtoh(&self.bufs.exp_avg)?,
            Region::ExpAvgSq => self.stream.clone_dtoh(&self.bufs.exp_avg_sq)?,
            _ => self
                .stream
                .clone_dtoh(&self.bufs.params)?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
        };
        self.stream.synchronize()?;
        Ok(values[..self.layout.region_len(Region::Params)].to_vec())
    }

    fn upload_whole(&mut self, region: Region, values: &[f32]) -> Result<(), CudaError> {
        let n = values.len();
        match region {
            Region::ExpAvg => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg.slice_mut(..n))?,
            Region::ExpAvgSq => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg_sq.slice_mut(..n))?,
            _ if self.layout.trains_master() => self
                .stream
                .memcpy_htod(values, &mut self.bufs.master.slice_mut(..n))?,
            _ => {
                let rounded: Vec<T> = values.iter().map(|&x| T::from_f32(x)).collect();
                self.stream
                    .memcpy_htod(&rounded, &mut self.bufs.params.slice_mut(..n))?
            }
        }
        self.stream.synchronize()?;
        Ok(())
    }
}

impl<T: Storage> StepBackend for CudaStep<'_, T>
where
    CudaBlasLT: Matmul<T>,
{
    fn rank(&self) -> usize {
        0
    }

    fn comm(&mut self) -> &mut dyn Comm {
        &mut self.comm
    }

    fn begin_step(&mut self) -> Result<(), ZeroError> {
        let program = self.program;
        self.run_ops(&program.start)
    }

    /// On the GPU the micro-step's kernels are queued, not timed per phase: `times` is left
    /// as it is.
    fn micro_step(
        &mut self,
        batch: &TokenBatch,
        grad_scale: f32,
        _times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError> {
        let inputs = batch.inputs();
        let targets: Vec<i32> = batch.targets().iter().map(|&t| t as i32).collect();
        let bufs = &mut self.bufs;
        if inputs.len() != bufs.tokens.len() {
            return Err(device(CudaError::Shape(format!(
                "a micro-batch of {} tokens for buffers of {}",
                inputs.len(),
                bufs.tokens.len()
            ))));
        }
        let buckets = TokenBuckets::new(&inputs)
            .ok_or_else(|| device(CudaError::Shape("batch too large for i32 rows".to_string())))?;
        upload_batch(&self.stream, bufs, &inputs, &targets, &buckets).map_err(device)?;
        self.scalars.bucket_groups = buckets.len();
        let count = targets.len().max(1);
        self.scalars.dloss = grad_scale / count as f32;
        let program = self.program;
        self.run_ops(&program.micro_step)?;
        let losses = self
            .stream
            .clone_dtoh(&self.bufs.stats.slice(losses_range(&self.bufs, count)))
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        Ok(total / count as f64)
    }

    /// One pass multiplies the gradients by `1/S`, sums their squares (f64) and flags inf/NaN.
    fn reduce_gradients(&mut self, loss_scale: f64) -> Result<(), ZeroError> {
        self.scalars.inv_scale = (1.0 / loss_scale) as f32;
        let program = self.program;
        self.run_ops(&program.norm)?;
        let total = self
            .stream
            .clone_dtoh(&self.bufs.norm_total)
            .map_err(device)?;
        let flag = self
            .stream
            .clone_dtoh(&self.bufs.found_inf)
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        self.sum_of_squares = total[0];
        self.found_inf = flag[0] != 0;
        Ok(())
    }

    fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        Ok(self.found_inf || !self.sum_of_squares.is_finite())
    }

    /// Nothing to do: the next step zeroes the gradients.
    fn discard(&mut self) {}

    /// The norm and clip coefficient over the whole flat buffer at once (the CPU reproduces
    /// each stage's per-tensor rounding, `rule`; the difference is rounding); the
    /// multiplication itself is fused into the optimizer step.
    fn unscale_and_clip(
        &mut self,
        _rule: ClipRule,
        scales: Scales,
        clip: f64,
    ) -> Result<f64, ZeroError> {
        let grad_norm = self.sum_of_squares.sqrt();
        let coefficient = if clip > 0.0 {
            fp32_clip_coefficient(grad_norm, clip)
        } else {
            1.0
        };
        self.multiplier = (coefficient * scales.grad_scale / scales.unscale_by) as f32;
        Ok(grad_norm)
    }

    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        self.adam_steps += 1;
        self.scalars.adam = Some(AdamScalars::new(adam, self.adam_steps, lr, self.multiplier));
        let program = self.program;
        let ran = self.run_ops(&program.update);
        self.scalars.adam = None;
        ran?;
        self.stream.synchronize().map_err(device)
    }

    fn export_owned(&mut self) -> Result<OwnedState, ZeroError> {
        let master = self.whole_master().map_err(device)?;
        let exp_avg = self.whole(Region::ExpAvg).map_err(device)?;
        let exp_avg_sq = self.whole(Region::ExpAvgSq).map_err(device)?;
        Ok(OwnedState {
            master: owned_from_whole(self.plan, 0, &master),
            exp_avg: owned_from_whole(self.plan, 0, &exp_avg),
            exp_avg_sq: owned_from_whole(self.plan, 0, &exp_avg_sq),
            adam_step: self.adam_steps,
        })
    }

    fn owned_len(&self) -> usize {
        self.plan.owned(0).len()
    }

    fn import_owned(&mut self, state: &OwnedState) -> Result<(), ZeroError> {
        let whole = |owned: &[f32]| consolidate(self.plan, self.plan.stage(), &[owned.to_vec()]);
        let (master, exp_avg, exp_avg_sq) = (
            whole(&state.master),
            whole(&state.exp_avg),
            whole(&state.exp_avg_sq),
        );
        self.upload_whole(Region::Master, &master).map_err(device)?;
        self.upload_whole(Region::ExpAvg, &exp_avg)
            .map_err(device)?;
        self.upload_whole(Region::ExpAvgSq, &exp_avg_sq)
            .map_err(device)?;
        self.adam_steps = state.adam_step;
        Ok(())
    }

    fn held_params(&mut self) -> Result<(ModelDtype, Vec<f32>), ZeroError> {
        let params = self.whole(Region::Params).map_err(device)?;
        Ok((
            self.plan.dtypes().model,
            held_from_whole(self.plan, 0, &params),
        ))
    }
}

/// Copies a micro-batch's tokens, targets and token buckets to the device.
fn upload_batch<T: Storage>(
    stream: &Arc<CudaStream>,
    bufs: &mut DeviceBuffers<T>,
    inputs: &[u32],
    targets: &[i32],
    buckets: &TokenBuckets,
) -> Result<(), CudaError> {
    stream.memcpy_htod(inputs, &mut bufs.tokens)?;
    stream.memcpy_htod(targets, &mut bufs.targets)?;
    stream.memcpy_htod(
        &buckets.tokens,
        &mut bufs.bucket_tokens.slice_mut(..buckets.len()),
    )?;
    stream.memcpy_htod(
        &buckets.starts,
        &mut bufs.bucket_starts.slice_mut(..buckets.len() + 1),
    )?;
    stream.memcpy_htod(&buckets.rows, &mut bufs.bucket_rows)?;
    Ok(())
}

/// What rank `rank` of `plan` owns of a whole flat model state (`whole`: parameters,
/// master or a moment, in the flat order): its flat partition with the plan's padding as
/// zeros (stages 0-2), or its slice of every tensor in shard order (stage 3). A backend that
/// holds the whole state hands it out in this layout.
pub fn owned_from_whole(plan: &EnginePlan, rank: usize, whole: &[f32]) -> Vec<f32> {
    match plan.stage() {
        ZeroStage::Weights => {
            let shards = plan.shards();
            let mut owned = vec![0.0f32; plan.owned(rank).len()];
            for (t, span) in plan.tensors().iter().enumerate() {
                let piece = shards.piece(t, rank);
                let from = shards.offset(t);
                owned[from..from + piece.len()]
                    .copy_from_slice(&whole[span.offset + piece.start..span.offset + piece.end]);
            }
            owned
        }
        _ => plan
            .owned(rank)
            .map(|i| whole.get(i).copied().unwrap_or(0.0))
            .collect(),
    }
}

/// The model-dtype parameters rank `rank` of `plan` holds, from the whole flat parameters:
/// the whole flat buffer with its padding (stages 0-2), or the rank's shard (stage 3).
pub fn held_from_whole(plan: &EnginePlan, rank: usize, whole: &[f32]) -> Vec<f32> {
    match plan.stage() {
        ZeroStage::Weights => owned_from_whole(plan, rank, whole),
        _ => (0..plan.flat().padded)
            .map(|i| whole.get(i).copied().unwrap_or(0.0))
            .collect(),
    }
}

/// Where the losses live in `Stats` (the last `count` elements: `losses` is pushed last).
fn losses_range<T: Storage>(bufs: &DeviceBuffers<T>, count: usize) -> std::ops::Range<usize> {
    let end = bufs.stats.len();
    end - count..end
}

/// The fp32 weights after training.
pub fn download_master<T: Storage>(
    stream: &Arc<CudaStream>,
    layout: &dyn RegionSizes,
    bufs: &DeviceBuffers<T>,
) -> Result<Vec<f32>, CudaError> {
    let host = if layout.trains_master() {
        stream.clone_dtoh(&bufs.master)?
    } else {
        let params = stream.clone_dtoh(&bufs.params)?;
        params.iter().map(|x| x.to_f32()).collect()
    };
    stream.synchronize()?;
    Ok(host[..layout.region_len(Region::Params)].to_vec())
}
