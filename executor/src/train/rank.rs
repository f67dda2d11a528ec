//! One rank of a run, given its [`Comm`]: [`run_rank`] is the whole life of a rank (build its
//! engine, resume, step, save checkpoints), the same whether the rank is a thread of this
//! process ([`super::train_planned_with`]) or the process itself ([`train_planned_as_rank`],
//! one rank of a job started by `mpirun` or `dsplan launch`).

use std::sync::Arc;
use std::time::Instant;

use dsplan_planner::plan::{Plan, PlanBackend};

use super::checkpoints::{CheckpointOptions, RankFailure};
use super::gather::gather_everyone;
use super::prepare::{Prepared, prepare};
use super::step::drive;
use super::{TrainError, TrainReport, TrainSpec};
use crate::checkpoint::{SavedCheckpoint, consolidate};
use crate::comm::{Comm, CommTraffic};
use crate::metrics::{ByCategory, MemoryLedger, MemoryReport, StepMetrics};
use crate::model::ModelCore;
use crate::zero::swap::{NvmeReport, NvmeUsage};
use crate::zero::{CpuStep, ZeroError, ZeroRank};

/// What one rank hands back.
pub(super) struct RankOutcome {
    pub(super) master: Vec<f32>,
    pub(super) memory: MemoryReport,
    pub(super) traffic: CommTraffic,
    pub(super) applied_steps: u64,
    pub(super) steps: Vec<StepMetrics>,
    pub(super) nvme: Option<NvmeUsage>,
    pub(super) checkpoints: Vec<SavedCheckpoint>,
    /// Every rank's fp32 master shard and measured memory, in rank order, when the ranks are
    /// processes and this rank gathered them ([`Gather::Everyone`]); empty otherwise.
    pub(super) gathered: Vec<(Vec<f32>, MemoryReport)>,
}

/// Whether a rank collects the others' results at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gather {
    /// Threads: the caller joins every rank's outcome.
    Nothing,
    /// Processes: every rank gathers every rank's master shard and memory over its [`Comm`].
    Everyone,
}

/// Runs one rank of `prepared` over `comm`; rank 0 calls `observer` with every step.
pub(super) fn run_rank(
    prepared: &Prepared<'_>,
    comm: Box<dyn Comm>,
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
    gather: Gather,
) -> Result<RankOutcome, RankFailure> {
    let spec = prepared.spec;
    let ledger = MemoryLedger::new();
    let core = ModelCore::with_positions(
        spec.model,
        prepared.shape,
        spec.settings.recompute,
        prepared.positions,
    )
    .map_err(ZeroError::from)?;
    let rank = ZeroRank::new(
        comm,
        Arc::clone(&prepared.engine_plan),
        prepared.rank_options,
        prepared.initial_params,
        &prepared.listed,
        &ledger,
    )?;
    let mut engine = CpuStep::new(core, rank, &ledger);
    let driven = drive(&mut engine, prepared, checkpoints, observer)?;
    // Measured before the master is read back: that read goes through the swap files.
    let nvme = engine.zero_rank().nvme_usage()?;
    let master = engine.zero_rank().owned_master()?;
    let memory = ledger.report();
    let gathered = match gather {
        Gather::Nothing => Vec::new(),
        Gather::Everyone => gather_everyone(engine.zero_rank_mut().comm(), &master, &memory)?,
    };
    Ok(RankOutcome {
        nvme,
        master,
        memory,
        traffic: engine.zero_rank().traffic(),
        applied_steps: driven.applied_steps,
        steps: driven.steps,
        checkpoints: driven.checkpoints,
        gathered,
    })
}

/// Runs this process as rank `comm.rank()` of a job of `comm.world_size()` processes, by `plan`,
/// calling `observer` on rank 0 with every step. `spec.world` must be the job's world size. Every rank returns the whole run's report: the final parameters are
/// consolidated from every rank's shard, `memory` holds every rank's measured memory; `traffic`
/// holds this rank's only, and `steps` and `checkpoints` are rank 0's (empty elsewhere).
pub fn train_planned_as_rank(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    comm: Box<dyn Comm>,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    let rank = comm.rank();
    if comm.world_size() != spec.world.max(1) {
        return Err(TrainError::PlanMismatch(crate::zero::PlanMismatch {
            message: format!(
                "the job has {} process(es), the run was planned for {}",
                comm.world_size(),
                spec.world
            ),
        }));
    }
    let prepared = prepare(spec, plan, checkpoints, PlanBackend::DsplanCpu)?;
    let started = Instant::now();
    let mut outcome = run_rank(&prepared, comm, checkpoints, observer, Gather::Everyone)
        .map_err(|failure| failure.into_train_error(rank))?;
    let seconds = started.elapsed().as_secs_f64();
    let (masters, memory): (Vec<Vec<f32>>, Vec<MemoryReport>) =
        std::mem::take(&mut outcome.gathered).into_iter().unzip();
    let final_params = consolidate(
        &prepared.engine_plan,
        prepared.engine_plan.stage(),
        &masters,
    );
    let nvme = outcome.nvme.take().map(|usage| NvmeReport {
        ranks: vec![usage],
        ..NvmeReport::of_plan(plan)
    });
    let predicted: ByCategory = prepared.predicted;
    Ok(TrainReport {
        steps: outcome.steps,
        final_params,
        memory,
        predicted,
        plan_memory: prepared.plan_memory,
        correspondence: prepared.correspondence,
        traffic: vec![outcome.traffic],
        applied_steps: outcome.applied_steps,
        seconds,
        tokens: prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step),
        first_step: prepared.first_step,
        checkpoints: outcome.checkpoints,
        nvme,
        device: None,
    })
}
