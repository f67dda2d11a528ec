//! [`prepare`]: what every rank of a run shares, checked and built once before any rank
//! starts ([`Prepared`]: the spec checked against the plan and the resume point, the data
//! opened, the engine's plan, the step control and the checkpoint template), for every
//! backend's driver (`super::run` and `super::rank` on the CPU, the CUDA runs).

use std::sync::{Arc, Mutex};

use dsplan_planner::plan::{Plan, PlanBackend};

use super::checkpoints::{CheckpointOptions, fresh_scaler};
use super::plan::plan_training;
use super::{DataChoice, StepControl, TrainError, TrainSpec};
use crate::checkpoint::{CheckpointError, EngineState, ResumePoint};
use crate::data::{BatchLayout, DataError, LabelledBatch, LabelledSource, MicroBatchIndex};
use crate::metrics::{ByCategory, Category, PlanMemory};
use crate::model::{BatchShape, ModelError, RowPositions};
use crate::zero::predict::correspondence;
use crate::zero::{Correspondence, EnginePlan, ListedBuffers, RankOptions};

/// Checked once before anything else, so that a bad shape is an error, not a failure on every
/// rank (nor a plan of a model that cannot run). Recorded batches may hold packed rows longer
/// than the model's positions: their position ids are checked batch by batch.
pub(crate) fn check_model(spec: &TrainSpec) -> Result<(), TrainError> {
    spec.model.validate().map_err(ModelError::Config)?;
    let recorded = matches!(
        spec.data,
        DataChoice::Recorded { .. } | DataChoice::Labelled(_)
    );
    if !recorded && spec.seq_len > spec.model.max_positions() {
        return Err(TrainError::Model(ModelError::SequenceTooLong {
            seq_len: spec.seq_len,
            n_positions: spec.model.max_positions(),
        }));
    }
    Ok(())
}

/// What every rank of a run shares, checked and built once before any rank starts.
pub(crate) struct Prepared<'a> {
    pub(crate) spec: &'a TrainSpec,
    pub(crate) world: usize,
    /// The micro-batch shape the model is sized for (the data's).
    pub(crate) shape: BatchShape,
    /// Where the rows' positions come from.
    pub(crate) positions: RowPositions,
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
    pub(crate) source: Mutex<Box<dyn LabelledSource + Send>>,
}

impl Prepared<'_> {
    /// Rank `at.rank`'s micro-batch `at`.
    pub(crate) fn batch(&self, at: MicroBatchIndex) -> Result<LabelledBatch, DataError> {
        let mut source = self
            .source
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        source.micro_batch(at)
    }
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
    let source = spec.data.open_labelled(layout)?;
    let shape = source.shape();
    if shape.seq_len != spec.seq_len {
        return Err(TrainError::Data(DataError::Recorded {
            origin: crate::checkpoint::DataDescription::of(&spec.data).name,
            tensor: "train".into(),
            message: format!(
                "the longest recorded micro-batch has {} positions, the run is set for seq_len {};                  set seq_len to {}",
                shape.seq_len, spec.seq_len, shape.seq_len
            ),
        }));
    }
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
    let mut control =
        StepControl::of_run(training, batch.grad_accum, engine_plan.clip_rule(), scaler);
    control.loss = settings.loss;
    if settings.trainer_schedule.is_some() && control.schedule.is_some() {
        return Err(TrainError::PlanMismatch(crate::zero::PlanMismatch {
            message: "the config has a `scheduler` block and the Trainer's lr_scheduler_type is \
                      set too; DeepSpeed's scheduler would win under the Trainer: remove one"
                .into(),
        }));
    }
    control.trainer_schedule = settings.trainer_schedule;
    let tokens_per_step = (batch.train_batch * spec.seq_len) as u64;
    Ok(Prepared {
        spec,
        world,
        shape,
        positions: source.positions(),
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
