//! Checkpoints of a run, at the engine level: when to save ([`SavePolicy`]), how the ranks
//! write their parts together ([`save_from_rank`]: rank 0 opens the staging directory, every
//! rank writes its own files, rank 0 completes the tag and `latest`, all of them agreeing on
//! success after each phase), and where a resumed run starts ([`resume_point`]).

use std::path::PathBuf;
use std::time::Instant;

use dsplan_planner::plan::Plan;

use super::{StepBackend, StepControl, TrainError, TrainSpec};
use crate::checkpoint::{
    CheckpointError, CheckpointLocation, EngineState, LoadedCheckpoint, ResumePoint, SaveFault,
    SavedCheckpoint, abandon_on_error, begin_save, finish_save, layout, prepare_resume,
    write_rank_files,
};
use crate::comm::{Comm, ReduceOp};
use crate::zero::{EnginePlan, ZeroError};

/// Where and how often a run saves checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavePolicy {
    /// The checkpoint directory (`latest` and the `global_step{N}` tags).
    pub dir: PathBuf,
    /// Save after every this many steps (and always after the last); `None`: at the end only.
    pub every: Option<u64>,
    /// Stop saves on purpose (tests); [`SaveFault::Never`] otherwise.
    pub fault: SaveFault,
}

impl SavePolicy {
    /// Saves into `dir` every `every` steps and at the end.
    pub fn new(dir: impl Into<PathBuf>, every: Option<u64>) -> Self {
        Self {
            dir: dir.into(),
            every: every.filter(|&n| n > 0),
            fault: SaveFault::Never,
        }
    }

    /// Whether to save after `done` steps of a run of `total`.
    pub fn saves_after(&self, done: u64, total: u64) -> bool {
        done == total || self.every.is_some_and(|n| done.is_multiple_of(n))
    }
}

/// Checkpointing of one run: where to save, and where to start from.
#[derive(Debug, Clone, Default)]
pub struct CheckpointOptions {
    /// Save checkpoints.
    pub save: Option<SavePolicy>,
    /// Continue from a checkpoint ([`resume_point`] prepares it).
    pub resume: Option<ResumePoint>,
}

/// Checks `loaded` against the run of `spec` by `plan` and prepares where it resumes (the
/// same layout bit for bit; another world size or stage resharded).
pub fn resume_point(
    spec: &TrainSpec,
    plan: &Plan,
    loaded: &LoadedCheckpoint,
) -> Result<ResumePoint, TrainError> {
    let params = spec.model.layout();
    let engine_plan = EnginePlan::from_plan(plan, &params)?;
    let scaler = fresh_scaler(plan)?;
    let run = EngineState::for_run(spec, &engine_plan, &params, &scaler);
    prepare_resume(loaded, &run, scaler, spec.steps).map_err(TrainError::from)
}

/// The loss scaler the plan's training policy builds, for the wrapper of the plan's stage
/// (fp16 without ZeRO: `FP16_Optimizer`'s).
pub(super) fn fresh_scaler(
    plan: &Plan,
) -> Result<dsplan_planner::schedule::loss_scale::LossScaler, TrainError> {
    let training = super::plan::plan_training(plan)?;
    super::settings::convert::mixed_precision(&training.loss_scaling)
        .loss_scaler(plan.settings.stage)
        .map_err(|e| TrainError::Rank {
            rank: 0,
            error: ZeroError::LossScale(e),
        })
}

/// Why a rank stopped.
#[derive(Debug)]
pub(crate) enum RankFailure {
    /// Training failed.
    Zero(ZeroError),
    /// A checkpoint could not be written or taken back.
    Checkpoint(CheckpointError),
    /// The loss stopped being finite.
    Diverged(super::Diverged),
}

/// A rank's error, which may only be its reaction to another rank's failure (a peer that left,
/// a checkpoint a peer failed to write).
pub(crate) trait RankReaction {
    /// Whether this is a reaction to another rank's failure rather than its own.
    fn is_secondary(&self) -> bool;
}

/// Every rank's result in rank order, or the failure the run reports with its rank: a rank's
/// own failure rather than the others noticing that it left (the first when all are
/// reactions).
pub(crate) fn every_rank<R, E: RankReaction>(
    outcomes: Vec<Result<R, E>>,
) -> Result<Vec<R>, (usize, E)> {
    let mut ranks = Vec::with_capacity(outcomes.len());
    let mut failures = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(result) => ranks.push(result),
            Err(error) => failures.push((rank, error)),
        }
    }
    if failures.is_empty() {
        return Ok(ranks);
    }
    let own = failures
        .iter()
        .position(|(_, e)| !e.is_secondary())
        .unwrap_or(0);
    Err(failures.swap_remove(own))
}

impl RankReaction for RankFailure {
    fn is_secondary(&self) -> bool {
        matches!(
            self,
            RankFailure::Zero(ZeroError::Comm(crate::comm::CommError::PeerLeft { .. }))
                | RankFailure::Checkpoint(CheckpointError::PeerFailed)
        )
    }
}

impl RankFailure {
    /// The run's error for this failure of rank `rank`.
    pub(crate) fn into_train_error(self, rank: usize) -> TrainError {
        match self {
            RankFailure::Zero(error) => TrainError::Rank { rank, error },
            RankFailure::Checkpoint(error) => TrainError::from(error),
            RankFailure::Diverged(error) => TrainError::Diverged(error),
        }
    }
}

impl From<ZeroError> for RankFailure {
    fn from(e: ZeroError) -> Self {
        RankFailure::Zero(e)
    }
}

impl From<crate::comm::CommError> for RankFailure {
    fn from(e: crate::comm::CommError) -> Self {
        RankFailure::Zero(ZeroError::Comm(e))
    }
}

impl From<super::Diverged> for RankFailure {
    fn from(e: super::Diverged) -> Self {
        RankFailure::Diverged(e)
    }
}

impl From<CheckpointError> for RankFailure {
    fn from(e: CheckpointError) -> Self {
        RankFailure::Checkpoint(e)
    }
}

/// Every rank learns whether all of them succeeded: a rank's own error, or
/// [`CheckpointError::PeerFailed`] when only another failed.
fn agree<T>(
    comm: &mut dyn Comm,
    own: Result<T, CheckpointError>,
) -> Result<Result<T, CheckpointError>, RankFailure> {
    let failed = comm.all_reduce_scalar(if own.is_err() { 1.0 } else { 0.0 }, ReduceOp::Max)?;
    Ok(match own {
        Ok(_) if failed != 0.0 => Err(CheckpointError::PeerFailed),
        other => other,
    })
}

/// Saves the checkpoint after `global_step` steps, together with the other ranks; rank 0
/// returns what was written. `template` is the run's state before its first step.
pub(super) fn save_from_rank(
    engine: &mut dyn StepBackend,
    control: &StepControl,
    template: &EngineState,
    policy: &SavePolicy,
    global_step: u64,
) -> Result<Option<SavedCheckpoint>, RankFailure> {
    let started = Instant::now();
    let rank = engine.rank();
    let state = template.at_step(global_step, control.applied_steps, &control.scaler);
    // Rank 0 opens the staging directory under its own process id; ranks that are other
    // processes learn it (exact in an f64), so every rank writes into the same directory.
    let own_pid = if rank == 0 { std::process::id() } else { 0 };
    let root_pid = engine
        .comm()
        .all_reduce_scalar(f64::from(own_pid), ReduceOp::Max)? as u32;
    let staging = policy
        .dir
        .join(layout::staging_name_of(&state.tag, root_pid));
    let begun = if rank == 0 {
        begin_save(&policy.dir, &state.tag).map(|_| ())
    } else {
        Ok(())
    };
    agree(engine.comm(), begun)??;

    let written = {
        let owned = engine.export_owned()?;
        let shard = state
            .layout
            .is_sharded()
            .then(|| engine.held_params())
            .transpose()?
            .map(|(_, values)| values);
        write_rank_files(&staging, &state, rank, &owned, shard.as_deref())
    };
    let written = agree(engine.comm(), written)?;
    let finished = match written {
        Ok(bytes) if rank == 0 => {
            let flat = (!state.layout.is_sharded())
                .then(|| engine.held_params())
                .transpose()?
                .map(|(_, values)| values);
            finish_save(&policy.dir, &staging, &state, flat.as_deref(), policy.fault)
                .map(|more| bytes + more)
        }
        other => other,
    };
    let finished = if rank == 0 {
        abandon_on_error(&staging, finished)
    } else {
        finished
    };
    let bytes = agree(engine.comm(), finished)??;
    let total = engine
        .comm()
        .all_reduce_scalar(bytes as f64, ReduceOp::Sum)?;
    Ok((rank == 0).then(|| SavedCheckpoint {
        location: CheckpointLocation {
            dir: policy.dir.clone(),
            tag: state.tag.clone(),
        },
        bytes: total as u64,
        seconds: started.elapsed().as_secs_f64(),
    }))
}
