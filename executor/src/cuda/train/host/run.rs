//! [`train_program_on_host`]: a run of the CUDA plan's programs on host thread ranks, the
//! host counterpart of `super::super::world::train_cuda_planned`. Every rank's program is
//! the one the GPU would run (`super::super::world::rank_models`: one GPU's program at
//! `W = 1`, [`crate::cuda::train::world_program`] over the rank's shares of the plan at
//! `W > 1`), each rank runs it through a [`HostStep`] driven by the one training loop, and
//! the report is the GPU run's: the final parameters consolidated from every rank's master.

use std::time::Instant;

use dsplan_planner::plan::{Plan, PlanBackend};

use super::HostError;
use super::backend::{HostStep, HostTarget};
use super::buffers::HostBuffers;
use crate::checkpoint::consolidate;
use crate::comm::{Comm, CommTraffic, LocalComm, run_ranks};
use crate::cuda::train::device_step::StepParts;
use crate::cuda::train::owned::DeviceOwned;
use crate::cuda::train::spec::{CudaTrainError, kernel_dtype};
use crate::cuda::train::world::{RankModel, gather_ranks, rank_models};
use crate::metrics::{MemoryReport, StepMetrics};
use crate::train::prepare::{Prepared, prepare};
use crate::train::step::{Driven, drive};
use crate::train::{
    CheckpointOptions, RankFailure, RankReaction, TrainError, TrainReport, TrainSpec, every_rank,
};

/// What one rank hands back.
struct RankResult {
    master: Vec<f32>,
    memory: MemoryReport,
    traffic: CommTraffic,
    driven: Driven,
    rollbacks: u64,
}

/// A host run's report, and what the GPU's does not carry: each rank's undone speculative
/// host steps (ZeRO-Offload's `super_offload`).
#[derive(Debug)]
pub struct HostRun {
    /// The run's report.
    pub report: TrainReport,
    /// Rank by rank, the speculative host steps undone (clipped or skipped after they ran).
    pub rollbacks: Vec<u64>,
}

/// How one rank failed.
enum RankError {
    /// Building its buffers.
    Setup(HostError),
    /// In the loop.
    Loop(Box<RankFailure>),
}

impl RankReaction for RankError {
    fn is_secondary(&self) -> bool {
        match self {
            RankError::Setup(_) => false,
            RankError::Loop(failure) => failure.is_secondary(),
        }
    }
}

/// Runs `spec` by `plan` (compiled as for the GPU: `compile_cuda_plan`) with
/// every rank's CUDA program interpreted on the host, `W` thread ranks over a [`LocalComm`]
/// (resumed and saved as `checkpoints` says; `observer` sees rank 0's steps). A 16-bit
/// model is stored as the device stores it ([`super::buffers::ModelRounding`]).
pub fn train_program_on_host(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, CudaTrainError> {
    crate::cuda::train::check_spec(spec)?;
    let models = rank_models(spec, plan)?;
    run_rank_models_on_host(spec, plan, &models, checkpoints, observer).map(|run| run.report)
}

/// [`train_program_on_host`] with each rank's program given (`models[rank]`, as
/// [`rank_models`] builds them from `plan`, or changed by a test to see that the comparison
/// notices), with what only the host run reports ([`HostRun`]).
pub fn run_rank_models_on_host(
    spec: &TrainSpec,
    plan: &Plan,
    models: &[RankModel],
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<HostRun, CudaTrainError> {
    let prepared = prepare(spec, plan, checkpoints, PlanBackend::DsplanCuda)?;
    let world = prepared.world;
    if models.len() != world {
        return Err(CudaTrainError::Setup(format!(
            "{} rank program(s) for a run of {world} rank(s)",
            models.len()
        )));
    }
    let started = Instant::now();
    let one_rank = |rank: usize, comm: LocalComm| {
        run_rank(&prepared, &models[rank], rank, comm, checkpoints, observer)
    };
    let outcomes: Vec<Result<RankResult, RankError>> = if world == 1 {
        let alone = LocalComm::group(1)
            .map_err(TrainError::Comm)?
            .pop()
            .ok_or_else(|| CudaTrainError::Setup("a group of one has no rank".into()))?;
        vec![one_rank(0, alone)]
    } else {
        run_ranks(world, |comm: LocalComm| one_rank(comm.rank(), comm)).map_err(TrainError::Comm)?
    };
    let seconds = started.elapsed().as_secs_f64();
    let ranks = every_rank(outcomes).map_err(|(rank, error)| match error {
        RankError::Setup(e) => CudaTrainError::Setup(format!("rank {rank}: {e}")),
        RankError::Loop(failure) => CudaTrainError::Run((*failure).into_train_error(rank)),
    })?;
    let rollbacks = ranks.iter().map(|r| r.rollbacks).collect();
    let taken = |r: &mut RankResult| (std::mem::take(&mut r.master), r.memory, r.traffic.clone());
    let all = gather_ranks(ranks, taken)?;
    let engine = &prepared.engine_plan;
    let report = TrainReport {
        steps: all.first.driven.steps,
        final_params: consolidate(engine, engine.stage(), &all.masters),
        memory: all.memory,
        predicted: prepared.predicted,
        plan_memory: prepared.plan_memory,
        correspondence: prepared.correspondence.clone(),
        traffic: all.traffic,
        applied_steps: all.first.driven.applied_steps,
        seconds,
        tokens: prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step),
        nvme: None,
        first_step: prepared.first_step,
        checkpoints: all.first.driven.checkpoints,
        device: None,
    };
    Ok(HostRun { report, rollbacks })
}

/// Rank `rank`'s run of its program on the host.
fn run_rank(
    prepared: &Prepared<'_>,
    model: &RankModel,
    rank: usize,
    comm: LocalComm,
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<RankResult, RankError> {
    let RankModel { layout, program } = model;
    let owned = DeviceOwned::of_layout(layout);
    let dtype = kernel_dtype(prepared.spec.settings.precision().model_dtype());
    let mut bufs = HostBuffers::new(layout, dtype, layout.param_table(), prepared.initial_params)
        .map_err(RankError::Setup)?;
    // The constant tables the device uploads once (the Llama family's rotation table).
    for constant in layout.recipe().constants(&layout.step) {
        bufs.write(&constant.at, &constant.values)
            .map_err(RankError::Setup)?;
    }
    let target = HostTarget {
        bufs,
        comm,
        eps: layout.recipe().eps(),
    };
    let parts = StepParts::of_rank((program, &owned), prepared, rank, layout, target);
    let mut backend = HostStep::new(parts);
    let driven = drive(&mut backend, prepared, checkpoints, observer)
        .map_err(|f| RankError::Loop(Box::new(f)))?;
    let master = backend
        .export_master()
        .map_err(|e| RankError::Setup(HostError(e.to_string())))?;
    let allocated = layout.bytes_by_category();
    let traffic = backend.target_mut().comm.traffic().clone();
    let rollbacks = backend.rollbacks();
    Ok(RankResult {
        master,
        memory: MemoryReport {
            peak_total: allocated.total(),
            peak: allocated,
            at_peak: allocated,
        },
        traffic,
        driven,
        rollbacks,
    })
}
