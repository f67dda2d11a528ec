//! Training runs: a config, a model, data and a world size in; per-step metrics, the trained
//! fp32 parameters and each rank's measured memory out.
//!
//! * [`settings`]: what the `ds_config.json` asks for ([`TrainSettings`]);
//! * [`model`]: the model `--model` names ([`choose_model`]);
//! * [`TrainSpec`]: the whole run (settings, model and initial parameters, data, steps,
//!   ranks);
//! * [`plan`]: the run's execution plan ([`compile_plan`]), compiled by `planner::plan`;
//! * [`train`]: compiles the plan and runs it ([`train_planned`]): one thread per rank
//!   ([`crate::comm::run_ranks`]), each with its own [`crate::zero::CpuStep`] built from the
//!   plan, reports every step of rank 0 to an observer, and consolidates the fp32 master
//!   weights at the end;
//! * `step.rs`: the one training loop of every backend (the step's order, loss scaler,
//!   schedule, clipping, metrics, divergence, checkpoints, resume) over a [`StepBackend`]
//!   (the CPU's [`crate::zero::CpuStep`], the GPU's `crate::cuda::train::rank::CudaStep`),
//!   with the host decisions in [`StepControl`]; [`TrainReport`] is every backend's report;
//! * [`train_planned_with`]: the same, saving checkpoints ([`SavePolicy`]) and resuming from
//!   one ([`resume_point`]), see [`crate::checkpoint`].

mod backend;
mod checkpoints;
mod control;
mod divergence;
mod error;
pub mod eval;
mod gather;
pub mod model;
pub mod plan;
pub(crate) mod prepare;
mod rank;
mod report;
pub(crate) mod run;
pub mod settings;
mod spec;
pub(crate) mod step;

pub use backend::StepBackend;
pub use checkpoints::{CheckpointOptions, SavePolicy, resume_point};
pub(crate) use checkpoints::{RankFailure, RankReaction, every_rank};
pub use control::StepControl;
pub use divergence::{Diverged, check_loss};
pub use error::TrainError;
pub use eval::{EvalLoss, EvalWeighting, eval_loss, trainer_eval_loss};
pub(crate) use gather::gather_everyone;
pub use model::{
    DEFAULT_PRESET, ModelChoiceError, ModelSource, check_finite_weights, choose_model, model_config,
};
pub use plan::{compile_cuda_plan, compile_plan, plan_training};
pub(crate) use prepare::check_model;
pub use rank::train_planned_as_rank;
pub use report::TrainReport;
pub use run::{train, train_planned, train_planned_with};
pub use settings::{
    AttentionKernel, BatchSizes, LossNormalisation, SettingsError, TrainSettings, TrainerSchedule,
};
pub use spec::{DataChoice, StoredShape, TrainSpec, stored_shape};
