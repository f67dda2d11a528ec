//! [`train`]: one run, one thread per rank, following the run's execution plan; with
//! [`train_planned_with`], saving checkpoints as it goes and starting from one
//! ([`super::checkpoints`]).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use dsplan_planner::plan::{Plan, PlanBackend, Training};

use super::checkpoints::{CheckpointOptions, every_rank, fresh_scaler};
use super::plan::compile_plan;
use super::rank::{Gather, run_rank};
use super::{StepControl, TrainError, TrainReport, TrainSpec};
use crate::checkpoint::{CheckpointError, EngineState, ResumePoint, consolidate};
use crate::comm::run_ranks;
use crate::data::{BatchLayout, DataError, MicroBatchIndex, TokenBatch, TokenSource};
use crate::metrics::{ByCategory, Category, PlanMemory, StepMetrics};
use crate::model::{BatchShape, ModelError};
use crate::zero::predict::correspondence;
use crate::zero::swap::{NvmeReport, NvmeUsage};
use crate::zero::{Correspondence, EnginePlan, ListedBuffers, RankOptions};

/// Compiles the plan of `spec` ([`compile_plan`]) and runs it, calling `observer` with every
/// step of rank 0 as it finishes.
pub fn train(
    spec: &TrainSpec,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    check_model(spec)?;
    let plan = compile_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .map_err(TrainError::Plan)?;
    train_planned(spec, &plan, observer)
}

/// Checked once before anything else, so that a bad shape is an error, not a failure on every
/// rank (nor a plan of a model that cannot run).
pub(crate) fn check_model(spec: &TrainSpec) -> Result<(), TrainError> {
    spec.model.validate().map_err(ModelError::Config)?;
    if spec.seq_len > spec.model.max_positions() {
        return Err(TrainError::Model(ModelError::SequenceTooLong {
            seq_len: spec.seq_len,
            n_positions: spec.model.max_positions(),
        }));
    }
    Ok(())
}

/// Runs `spec` by `plan` (from [`compile_plan`]), calling `observer` with
/// every step of rank 0 as it finishes.
pub fn train_planned(
    spec: &TrainSpec,
    plan: &Plan,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    train_planned_with(spec, plan, &CheckpointOptions::default(), observer)
}

/// [`train_planned`] with checkpoints: resumed from `checkpoints.resume` (steps
/// `global_step..spec.steps` are run, numbered as in the uninterrupted run) and saved as
/// `checkpoints.save` says. Every rank is a thread of this process ([`run_ranks`]); each runs
/// [`run_rank`].
pub fn train_planned_with(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    let prepared = prepare(spec, plan, checkpoints, PlanBackend::DsplanCpu)?;
    let world = prepared.world;
    let started = Instant::now();
    let outcomes = run_ranks(world, |comm| {
        run_rank(
            &prepared,
            Box::new(comm),
            checkpoints,
            observer,
            Gather::Nothing,
        )
    })
    .map_err(TrainError::Comm)?;
    let seconds = started.elapsed().as_secs_f64();

    let mut ranks = every_rank(outcomes).map_err(|(rank, error)| error.into_train_error(rank))?;
    let masters: Vec<Vec<f32>> = ranks
        .iter_mut()
        .map(|r| std::mem::take(&mut r.master))
        .collect();
    let final_params = consolidate(
        &prepared.engine_plan,
        prepared.engine_plan.stage(),
        &masters,
    );
    let nvme_ranks: Vec<NvmeUsage> = ranks.iter_mut().filter_map(|r| r.nvme.take()).collect();
    let nvme = (!nvme_ranks.is_empty()).then(|| NvmeReport {
        ranks: nvme_ranks,
        ..NvmeReport::of_plan(plan)
    });
    Ok(TrainReport {
        steps: ranks
            .first_mut()
            .map(|r| std::mem::take(&mut r.steps))
            .unwrap_or_default(),
        final_params,
        memory: ranks.iter().map(|r| r.memory).collect(),
        predicted: prepared.predicted,
        plan_memory: prepared.plan_memory,
        correspondence: prepared.correspondence,
        traffic: ranks.iter().map(|r| r.traffic.clone()).collect(),
        applied_steps: ranks.first().map_or(0, |r| r.applied_steps),
        seconds,
        tokens: prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step),
        first_step: prepared.first_step,
        checkpoints: ranks
            .first_mut()
            .map(|r| std::mem::take(&mut r.checkpoints))
            .unwrap_or_default(),
        nvme,
        device: None,
    })
}

/// What every rank of a run shares, checked and built once before any rank starts.
pub(crate) struct Prepared<'a> {
    pub(crate) spec: &'a TrainSpec,
    pub(crate) world: usize,
    pub(crate) shape: BatchShape,
    pub(crate) engine_plan: Arc<EnginePlan>,
    /// The run-long host buffers the CPU ranks allocate (the `dsplan-cpu` plan's list).
    pub(crate) listed: ListedBuffers,
    pub(crate) rank_options: RankOptions,
    pub(crate) plan_memory: PlanMemory,
    pub(crate) predicted: ByCategory,
    pub(crate) correspondence: Vec<(Category, Correspondence)>,
    pub(crate) template: EngineState,
    pub(crate) control: StepControl,
    pub(crate) tokens_per_step: u64,
    pub(crate) first_step: u64,
    pub(crate) initial_params: &'a [f32],
    pub(crate) resume: Option<&'a ResumePoint>,
    /// The run's data; each rank asks only for its own micro-batches.
    pub(crate) source: Mutex<Box<dyn TokenSource + Send>>,
}

impl Prepared<'_> {
    /// Rank `at.rank`'s micro-batch `at`.
    pub(crate) fn batch(&self, at: MicroBatchIndex) -> Result<TokenBatch, DataError> {
        let mut source = self
            .source
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        source.micro_batch(at)
    }
}

/// The training policy `plan` carries ([`compile_plan`] puts it there); a plan without one
/// cannot be run.
pub fn plan_training(plan: &Plan) -> Result<&Training, TrainError> {
    plan.training.as_ref().ok_or_else(|| {
        TrainError::PlanMismatch(crate::zero::PlanMismatch {
            message: "it carries no training policy (optimizer, loss scaling, schedule); compile it with compile_plan".into(),
        })
    })
}

/// Checks `spec` against `plan` and the resume point, opens the data and builds what every
/// rank shares.
pub(crate) fn prepare<'a>(
    spec: &'a TrainSpec,
    plan: &Plan,
    checkpoints: &'a CheckpointOptions,
    runs_on: PlanBackend,
) -> Result<Prepared<'a>, TrainError> {
    check_model(spec)?;
    let settings = &spec.settings;
    let world = spec.world.max(1);
    let batch = settings.batch;
    let layout = BatchLayout::new(batch.micro_batch, spec.seq_len, batch.grad_accum, world)?;
    let source = spec.data.open(layout)?;
    if source.token_bound() as usize > spec.model.vocab_size() {
        return Err(TrainError::Vocabulary {
            token_bound: source.token_bound(),
            vocab_size: spec.model.vocab_size(),
        });
    }
    if let Some(available) = source.steps()
        && available < spec.steps
    {
        return Err(TrainError::TooFewSteps {
            available,
            requested: spec.steps,
        });
    }
    let shape = BatchShape {
        batch: batch.micro_batch,
        seq_len: spec.seq_len,
    };
    let param_layout = spec.model.layout();
    if spec.initial_params.len() != param_layout.num_params() {
        return Err(TrainError::Model(ModelError::ParamCount {
            expected: param_layout.num_params(),
            found: spec.initial_params.len(),
        }));
    }
    let engine_plan = Arc::new(EnginePlan::from_plan(plan, &param_layout)?);
    if engine_plan.world() != world {
        return Err(TrainError::PlanMismatch(crate::zero::PlanMismatch {
            message: format!(
                "it is for {} rank(s), the run has {world}",
                engine_plan.world()
            ),
        }));
    }
    let rank_options = RankOptions::from_plan(&engine_plan, engine_plan.grad_scaling());
    let plan_memory = PlanMemory::of(plan);
    let predicted = plan_memory.peak;
    let correspondence = Category::ALL
        .iter()
        .map(|&c| (c, correspondence(plan, runs_on)))
        .collect();
    let training = plan_training(plan)?;
    let scaler = fresh_scaler(plan)?;
    let resume = checkpoints.resume.as_ref();
    if let Some(resume) = resume
        && (resume.ranks.len() != world || resume.params.len() != param_layout.num_params())
    {
        return Err(TrainError::from(CheckpointError::Corrupt {
            path: resume.location.path(),
            field: "ranks".into(),
            message: format!(
                "the resume point holds {} rank(s) and {} parameters, the run has {world} and {}",
                resume.ranks.len(),
                resume.params.len(),
                param_layout.num_params()
            ),
        }));
    }
    let first_step = resume.map_or(0, |r| r.global_step);
    let initial_params = resume.map_or(&spec.initial_params, |r| &r.params);
    let template = EngineState::for_run(spec, &engine_plan, &param_layout, &scaler);
    let control = StepControl::of_run(training, batch.grad_accum, engine_plan.clip_rule(), scaler);
    let tokens_per_step = (batch.train_batch * spec.seq_len) as u64;
    Ok(Prepared {
        spec,
        world,
        shape,
        engine_plan,
        listed: ListedBuffers::of_plan(plan),
        rank_options,
        plan_memory,
        predicted,
        correspondence,
        template,
        control,
        tokens_per_step,
        first_step,
        initial_params,
        resume,
        source: Mutex::new(source),
    })
}
