//! The GPU runs: [`train_cuda_planned`] trains `W` thread ranks of this process (one at
//! `W = 1`), [`train_cuda_as_rank`] this process as one rank of a job of processes (torchrun,
//! the DeepSpeed launcher, `mpirun`, `srun`). Both go through the one training loop of every
//! backend (`crate::train::step::drive`) with a [`CudaStep`] per rank, and hand back the shared
//! [`TrainReport`]: the final parameters consolidated from every rank's master as on the CPU,
//! the memory of every rank, the traffic. **Needs a GPU.**
//!
//! Where the ranks train is data ([`super::placement`]): each thread rank gets its GPU
//! ordinal and the device collective from the rank count and the visible GPUs. Each rank has
//! its own context handle, compute stream, communication stream, kernels and buffers.
//!
//! At `W = 1` the step is one GPU's program ([`StepProgram::new`], no collectives, the
//! default stream); at `W > 1` it is [`world_program`] over the rank's shares of the plan
//! ([`DeviceLayout::for_plan_rank`]), for every model family. Every rank's program is built and checked on the host before anything touches the
//! GPU.

use std::sync::Arc;
use std::time::Instant;

use crate::cuda::gemm::GemmElement;
use cudarc::driver::{CudaContext, CudaStream};
use dsplan_kernels::cache::CubinCache;
use dsplan_planner::plan::{Plan, PlanBackend};

use super::device_step::StepParts;
use super::execute::{DeviceBuffers, Executor};
use super::layout::DeviceLayout;
use super::offload::{check_offload_plan, offload_program};
use super::owned::DeviceOwned;
use super::placement::{DeviceLink, NcclLibrary, Placement, place_ranks};
use super::rank::{CudaStep, Gpu, NcclWithHost, RankComm};
use super::spec::{CudaTrainError, check_spec, kernel_dtype};
use super::step::StepProgram;
use super::world_step::world_program;
use crate::checkpoint::consolidate;
use crate::comm::{Comm, CommTraffic, LocalComm, run_ranks};
use crate::cuda::device_comm::{HostStaged, Wire};
use crate::cuda::error::CudaError;
use crate::cuda::gemm::Gemm;
use crate::cuda::launch::Launcher;
use crate::cuda::modules::KernelModules;
use crate::cuda::nccl::{NcclComm, nccl_present};
use crate::metrics::{DeviceRun, MemoryReport, StepMetrics};
use crate::train::prepare::{Prepared, prepare};
use crate::train::step::{Driven, drive};
use crate::train::{
    CheckpointOptions, RankFailure, RankReaction, TrainError, TrainReport, TrainSpec,
    compile_cuda_plan, every_rank,
};
use crate::zero::Dtype as ModelDtype;

/// A rank's device model and its step, built and checked on the host.
pub struct RankModel {
    /// The rank's buffers (its shares of the plan at `W > 1`).
    pub layout: DeviceLayout,
    /// Its step.
    pub program: StepProgram,
}

/// Builds and checks the step of every rank of `plan` for `spec`, on
/// micro-batches of `spec`'s shape, before any CUDA call: one GPU's program at `W = 1`,
/// [`world_program`] over each rank's shares at `W > 1`.
pub fn rank_models(spec: &TrainSpec, plan: &Plan) -> Result<Vec<RankModel>, CudaTrainError> {
    let shape = crate::model::BatchShape {
        batch: spec.settings.batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let dtype = kernel_dtype(spec.settings.precision().model_dtype());
    let recompute = spec.settings.recompute;
    let world = spec.world.max(1);
    let stepping = check_offload_plan(plan).map_err(CudaTrainError::Setup)?;
    let offloaded = |mut model: RankModel| -> Result<RankModel, CudaTrainError> {
        let Some(stepping) = stepping else {
            return Ok(model);
        };
        model.layout.offload_optimizer(stepping);
        model.program = offload_program(model.program, stepping)
            .map_err(|e| CudaTrainError::Setup(format!("the offloaded step: {e}")))?;
        model
            .program
            .check(&model.layout)
            .map_err(|e| CudaTrainError::Setup(format!("the offloaded step: {e}")))?;
        Ok(model)
    };
    if world == 1 {
        let layout = DeviceLayout::recomputing(spec.model, shape, dtype, recompute);
        let program = StepProgram::new(&layout).with_attention(spec.settings.attention);
        return Ok(vec![offloaded(RankModel { layout, program })?]);
    }
    (0..world)
        .map(|rank| {
            let layout =
                DeviceLayout::for_plan_rank(spec.model, shape, dtype, recompute, plan, rank)
                    .map_err(|e| CudaTrainError::Setup(format!("rank {rank}'s buffers: {e}")))?;
            let program = world_program(&layout, plan)
                .map_err(|e| {
                    CudaTrainError::Setup(format!("rank {rank}'s step from the plan: {e}"))
                })?
                .with_attention(spec.settings.attention);
            program
                .check(&layout)
                .map_err(|e| CudaTrainError::Setup(format!("rank {rank}'s step: {e}")))?;
            offloaded(RankModel { layout, program })
        })
        .collect()
}

/// The GPUs this process sees (`CUDA_VISIBLE_DEVICES` applied by the driver).
pub fn visible_gpus() -> Result<usize, CudaError> {
    let count = CudaContext::device_count()?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Whether NCCL can be loaded, as data.
pub fn nccl_library() -> NcclLibrary {
    if nccl_present() {
        NcclLibrary::Present
    } else {
        NcclLibrary::Missing
    }
}

/// Where `world` thread ranks of a run on GPU `first` train on this machine.
pub fn thread_placement(world: usize, first: usize) -> Result<Placement, CudaTrainError> {
    place_ranks(world, visible_gpus()?, first, nccl_library())
        .map_err(|e| CudaTrainError::Setup(e.to_string()))
}

/// Runs `spec` by `plan` (best with
/// [`crate::train::compile_cuda_plan`]: then each rank's device memory is the plan's to the
/// byte), resumed and saved as `checkpoints` says, calling `observer` with every step of rank
/// 0. One rank trains on GPU `ordinal`; `W > 1` thread ranks are placed by
/// [`thread_placement`] from GPU `ordinal` on.
pub fn train_cuda_planned(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    ordinal: usize,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, CudaTrainError> {
    let (prepared, models) = prepared_ranks(spec, plan, checkpoints)?;
    let world = prepared.world;
    let placement = if world == 1 {
        Placement {
            ordinals: vec![ordinal],
            link: DeviceLink::Alone,
        }
    } else {
        thread_placement(world, ordinal)?
    };
    let run = RankRun::new(&prepared, checkpoints, observer, Collect::Own);
    let started = Instant::now();
    let outcomes: Vec<Result<RankResult, RankError>> = if world == 1 {
        vec![run.rank(0, &models[0], ordinal, |_, stream| {
            let alone = LocalComm::group(1)
                .map_err(|e| CudaError::Nccl(e.to_string()))?
                .pop()
                .ok_or_else(|| CudaError::Nccl("a group of one has no rank".to_string()))?;
            Ok(HostStaged::new(alone, stream.clone()))
        })]
    } else {
        run_ranks(world, |host: LocalComm| {
            let rank = host.rank();
            let on = placement.ordinals[rank];
            match placement.link {
                DeviceLink::Nccl => run.rank(rank, &models[rank], on, |ctx, _| {
                    let mut host = host;
                    let nccl = NcclComm::from_host_comm(
                        ctx.new_stream()?,
                        &mut host,
                        crate::comm::DEFAULT_TIMEOUT,
                    )?;
                    Ok(NcclWithHost { nccl, host })
                }),
                DeviceLink::HostStaged | DeviceLink::Alone => {
                    run.rank(rank, &models[rank], on, |ctx, _| {
                        Ok(HostStaged::new(host, ctx.new_stream()?))
                    })
                }
            }
        })
        .map_err(TrainError::Comm)?
    };
    let seconds = started.elapsed().as_secs_f64();
    let ranks = every_rank(outcomes).map_err(|(rank, error)| error.at(rank, world))?;
    let taken = |r: &mut RankResult| (std::mem::take(&mut r.master), r.memory, r.traffic.clone());
    let all = gather_ranks(ranks, taken)?;
    let gpus = placement.gpus();
    Ok(report(
        &prepared,
        &models[0].layout,
        all.first,
        all.masters,
        all.memory,
        all.traffic,
        seconds,
        gpus,
    ))
}

/// Runs this process as rank `rank` of a job of processes on GPU `ordinal`, by `plan`
/// (`spec.world` is the job's size), its communication made by
/// `connect` from the rank's context and compute stream (NCCL from the launcher's
/// rendezvous, or over MPI). Every rank returns the whole run's report: the final parameters
/// are consolidated from every rank's master (gathered over the host `Comm`), `memory` holds
/// every rank's; `steps` and `checkpoints` are rank 0's (empty elsewhere).
pub fn train_cuda_as_rank<C: RankComm>(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    (rank, ordinal): (usize, usize),
    connect: impl FnOnce(&Arc<CudaContext>, &Arc<CudaStream>) -> Result<C, CudaError>,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, CudaTrainError> {
    let (prepared, mut models) = prepared_ranks(spec, plan, checkpoints)?;
    let world = prepared.world;
    if rank >= world {
        return Err(CudaTrainError::Setup(format!(
            "this process is rank {rank}, but the run was planned for {world} rank(s)"
        )));
    }
    let model = models.swap_remove(rank);
    let run = RankRun::new(&prepared, checkpoints, observer, Collect::Everyone);
    let started = Instant::now();
    let mut result = run
        .rank(rank, &model, ordinal, connect)
        .map_err(|e| e.at(rank, world))?;
    let seconds = started.elapsed().as_secs_f64();
    let (masters, memory): (Vec<Vec<f32>>, Vec<MemoryReport>) =
        std::mem::take(&mut result.gathered).into_iter().unzip();
    let traffic = vec![result.traffic.clone()];
    Ok(report(
        &prepared,
        &model.layout,
        result,
        masters,
        memory,
        traffic,
        seconds,
        world,
    ))
}

/// `spec` checked against the kernels, prepared to run by `plan` (resumed as `checkpoints`
/// says), and every rank's layout and program.
fn prepared_ranks<'a>(
    spec: &'a TrainSpec,
    plan: &Plan,
    checkpoints: &'a CheckpointOptions,
) -> Result<(Prepared<'a>, Vec<RankModel>), CudaTrainError> {
    check_spec(spec)?;
    let prepared = prepare(spec, plan, checkpoints, PlanBackend::DsplanCuda)?;
    Ok((prepared, rank_models(spec, plan)?))
}

/// The shared report of a GPU run from rank 0's (or this process's) result.
#[allow(clippy::too_many_arguments)]
fn report(
    prepared: &Prepared<'_>,
    layout: &DeviceLayout,
    result: RankResult,
    masters: Vec<Vec<f32>>,
    memory: Vec<MemoryReport>,
    traffic: Vec<CommTraffic>,
    seconds: f64,
    gpus: usize,
) -> TrainReport {
    let spec = prepared.spec;
    let plan = &prepared.engine_plan;
    let final_params = consolidate(plan, plan.stage(), &masters);
    let tokens = prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step);
    // MFU of one GPU: the tokens each GPU processed per second.
    let per_gpu = tokens as f64 / seconds.max(1e-9) / gpus.max(1) as f64;
    let mfu = layout
        .recipe()
        .mfu(spec.seq_len, &result.device_name)
        .map(|m| m.utilisation(per_gpu));
    TrainReport {
        steps: result.driven.steps,
        final_params,
        memory,
        predicted: prepared.predicted,
        plan_memory: prepared.plan_memory,
        correspondence: prepared.correspondence.clone(),
        traffic,
        applied_steps: result.driven.applied_steps,
        seconds,
        tokens,
        nvme: None,
        first_step: prepared.first_step,
        checkpoints: result.driven.checkpoints,
        device: Some(DeviceRun {
            name: result.device_name,
            mfu,
            driver_used_bytes: result.driver_used_bytes,
            driver_runtime_bytes: result.driver_runtime_bytes,
        }),
    }
}

/// Every rank's end of a run, gathered: the first rank's result, and each rank's fp32
/// master (in the CPU rank's layout), memory and traffic, rank by rank.
pub(crate) struct Gathered<R> {
    pub first: R,
    pub masters: Vec<Vec<f32>>,
    pub memory: Vec<MemoryReport>,
    pub traffic: Vec<CommTraffic>,
}

/// [`Gathered`] of `ranks` (in rank order), `parts` taking each one's master, memory and
/// traffic out of it.
pub(crate) fn gather_ranks<R>(
    mut ranks: Vec<R>,
    parts: impl Fn(&mut R) -> (Vec<f32>, MemoryReport, CommTraffic),
) -> Result<Gathered<R>, CudaTrainError> {
    let (mut masters, mut memory, mut traffic) = (Vec::new(), Vec::new(), Vec::new());
    for rank in &mut ranks {
        let (master, used, sent) = parts(rank);
        masters.push(master);
        memory.push(used);
        traffic.push(sent);
    }
    let first = ranks
        .into_iter()
        .next()
        .ok_or_else(|| CudaTrainError::Setup("no rank finished".to_string()))?;
    Ok(Gathered {
        first,
        masters,
        memory,
        traffic,
    })
}

/// Whether a rank collects every rank's master and memory at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collect {
    /// Thread ranks: the caller joins every rank's result.
    Own,
    /// Process ranks: every rank gathers everyone's over the host `Comm`.
    Everyone,
}

/// What every rank of a run shares.
struct RankRun<'a> {
    prepared: &'a Prepared<'a>,
    checkpoints: &'a CheckpointOptions,
    observer: &'a (dyn Fn(&StepMetrics) + Sync),
    collect: Collect,
}

impl<'a> RankRun<'a> {
    fn new(
        prepared: &'a Prepared<'a>,
        checkpoints: &'a CheckpointOptions,
        observer: &'a (dyn Fn(&StepMetrics) + Sync),
        collect: Collect,
    ) -> Self {
        RankRun {
            prepared,
            checkpoints,
            observer,
            collect,
        }
    }
}

/// What one rank hands back.
struct RankResult {
    /// Its fp32 master, in the CPU rank's layout.
    master: Vec<f32>,
    memory: MemoryReport,
    traffic: CommTraffic,
    driven: Driven,
    device_name: String,
    driver_used_bytes: u64,
    /// The driver's figure before the step's buffers (context, communicator, cuBLASLt).
    driver_runtime_bytes: u64,
    /// Every rank's master and memory ([`Collect::Everyone`]); empty otherwise.
    gathered: Vec<(Vec<f32>, MemoryReport)>,
}

/// How one rank failed.
enum RankError {
    /// Before or around the loop (the device, the kernels, the communicator).
    Setup(CudaTrainError),
    /// In the loop.
    Loop(Box<RankFailure>),
}

impl From<CudaError> for RankError {
    fn from(e: CudaError) -> Self {
        RankError::Setup(CudaTrainError::Cuda(e))
    }
}

impl RankReaction for RankError {
    fn is_secondary(&self) -> bool {
        match self {
            RankError::Setup(_) => false,
            RankError::Loop(failure) => failure.is_secondary(),
        }
    }
}

impl RankError {
    /// The run's error for this failure of rank `rank` of `world`.
    fn at(self, rank: usize, world: usize) -> CudaTrainError {
        match self {
            RankError::Setup(CudaTrainError::Cuda(e)) if world > 1 => {
                CudaTrainError::Setup(format!("rank {rank}: {e}"))
            }
            RankError::Setup(e) => e,
            RankError::Loop(failure) => CudaTrainError::Run((*failure).into_train_error(rank)),
        }
    }
}

impl RankRun<'_> {
    /// Runs rank `rank` of `model` on GPU `ordinal`, its communication made by `connect`.
    fn rank<C: RankComm>(
        &self,
        rank: usize,
        model: &RankModel,
        ordinal: usize,
        connect: impl FnOnce(&Arc<CudaContext>, &Arc<CudaStream>) -> Result<C, CudaError>,
    ) -> Result<RankResult, RankError> {
        match self.prepared.spec.settings.precision().model_dtype() {
            ModelDtype::F32 => self.rank_on::<f32, C>(rank, model, ordinal, connect),
            ModelDtype::Bf16 => self.rank_on::<half::bf16, C>(rank, model, ordinal, connect),
            ModelDtype::F16 => self.rank_on::<half::f16, C>(rank, model, ordinal, connect),
        }
    }

    fn rank_on<T: GemmElement + Wire, C: RankComm>(
        &self,
        rank: usize,
        model: &RankModel,
        ordinal: usize,
        connect: impl FnOnce(&Arc<CudaContext>, &Arc<CudaStream>) -> Result<C, CudaError>,
    ) -> Result<RankResult, RankError> {
        let prepared = self.prepared;
        let RankModel { layout, program } = model;
        let owned = DeviceOwned::of_layout(layout);
        let ctx = CudaContext::new(ordinal).map_err(CudaError::from)?;
        let device_name = ctx.name().map_err(CudaError::from)?;
        let stream = if prepared.world == 1 {
            ctx.default_stream()
        } else {
            ctx.new_stream().map_err(CudaError::from)?
        };
        let comm = connect(&ctx, &stream)?;
        let modules =
            KernelModules::new(ctx.clone(), CubinCache::default_dir().map(CubinCache::new))?;
        let executor = Executor {
            launcher: Launcher::new(&modules, stream.clone()),
            gemm: Gemm::new(stream.clone())?,
            eps: layout.recipe().eps(),
        };
        let (runtime_free, runtime_total) = ctx.mem_get_info().map_err(CudaError::from)?;
        let bufs = DeviceBuffers::<T>::new(
            &stream,
            layout,
            layout.param_table(),
            prepared.initial_params,
        )?;
        let gpu = Gpu::new(
            &executor,
            stream.clone(),
            bufs,
            comm,
            &layout.recipe().constants(&layout.step),
        )?;
        let parts = StepParts::of_rank((program, &owned), prepared, rank, layout, gpu);
        let mut backend = CudaStep::new(parts);
        let driven = drive(&mut backend, prepared, self.checkpoints, self.observer)
            .map_err(|f| RankError::Loop(Box::new(f)))?;
        let (free, total) = ctx.mem_get_info().map_err(CudaError::from)?;
        let master = backend
            .export_master()
            .map_err(|e| RankError::Loop(Box::new(RankFailure::from(e))))?;
        let allocated = layout.bytes_by_category();
        let memory = MemoryReport {
            peak_total: allocated.total(),
            peak: allocated,
            at_peak: allocated,
        };
        let gathered = match self.collect {
            Collect::Own => Vec::new(),
            Collect::Everyone => crate::train::gather_everyone(
                backend.target_mut().comm_mut().host(),
                &master,
                &memory,
            )
            .map_err(|e| RankError::Loop(Box::new(RankFailure::from(e))))?,
        };
        let traffic = backend.target_mut().comm_mut().traffic();
        Ok(RankResult {
            master,
            memory,
            traffic,
            driven,
            device_name,
            driver_used_bytes: total.saturating_sub(free) as u64,
            driver_runtime_bytes: runtime_total.saturating_sub(runtime_free) as u64,
            gathered,
        })
    }
}

/// Trains `spec` by its `dsplan-cuda` plan ([`compile_cuda_plan`]) from GPU `ordinal` on
/// (`W > 1` thread ranks are placed by [`thread_placement`]), calling
/// `observer` after each step. [`check_spec`] runs first: a spec the kernels cannot run is an
/// error before anything is allocated.
pub fn train_cuda(
    spec: &TrainSpec,
    ordinal: usize,
    observer: &(dyn Fn(u64, &StepMetrics) + Sync),
) -> Result<TrainReport, CudaTrainError> {
    check_spec(spec)?;
    let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .map_err(TrainError::Plan)?;
    train_cuda_planned(spec, &plan, &CheckpointOptions::default(), ordinal, &|m| {
        observer(m.step, m)
    })
}
