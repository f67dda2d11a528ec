//! [`TrainError`]: why a run could not start or could not finish.

use std::fmt;

use dsplan_planner::diagnostics::Diagnostic;

use super::SettingsError;
use crate::checkpoint::CheckpointError;
use crate::comm::CommError;
use crate::data::DataError;
use crate::model::ModelError;
use crate::zero::{PlanMismatch, ZeroError};

/// What stopped a training run.
#[derive(Debug, Clone, PartialEq)]
pub enum TrainError {
    /// The config asks for something the executor cannot run.
    Settings(SettingsError),
    /// The planner refused the run (its diagnostics, at least one an error).
    Plan(Vec<Diagnostic>),
    /// The plan does not describe the model, world or layout the executor runs.
    PlanMismatch(PlanMismatch),
    /// The training data could not be opened or does not fit the model.
    Data(DataError),
    /// The model could not be built.
    Model(ModelError),
    /// The data's tokens do not fit the model's vocabulary.
    Vocabulary {
        /// One more than the largest token id in the data.
        token_bound: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// Stored batches run out before the requested number of steps.
    TooFewSteps {
        /// Steps the data holds.
        available: u64,
        /// Steps requested.
        requested: u64,
    },
    /// A rank failed during training (the first rank's own error, not its peers' reaction).
    Rank {
        /// The rank.
        rank: usize,
        /// Its error.
        error: ZeroError,
    },
    /// The ranks could not be started or one panicked.
    Comm(CommError),
    /// A checkpoint could not be written, read or resumed from.
    Checkpoint(Box<CheckpointError>),
    /// The loss stopped being finite where nothing could recover it.
    Diverged(super::Diverged),
}

impl fmt::Display for TrainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrainError::Settings(e) => write!(f, "config: {e}"),
            TrainError::Plan(diagnostics) => {
                let errors: Vec<String> = diagnostics
                    .iter()
                    .filter(|d| d.is_error())
                    .map(|d| {
                        if d.pointer.is_empty() {
                            d.message.clone()
                        } else {
                            format!("{}: {}", d.pointer, d.message)
                        }
                    })
                    .collect();
                write!(f, "the plan cannot be compiled: {}", errors.join("; "))
            }
            TrainError::PlanMismatch(e) => write!(f, "{e}"),
            TrainError::Data(e) => write!(f, "data: {e}"),
            TrainError::Model(e) => write!(f, "model: {e}"),
            TrainError::Vocabulary {
                token_bound,
                vocab_size,
            } => write!(
                f,
                "the data has token ids up to {} but the model's vocabulary is {vocab_size}",
                token_bound.saturating_sub(1)
            ),
            TrainError::TooFewSteps {
                available,
                requested,
            } => write!(
                f,
                "the data holds {available} steps of batches, {requested} were requested"
            ),
            TrainError::Rank { rank, error } => write!(f, "rank {rank}: {error}"),
            TrainError::Comm(e) => write!(f, "{e}"),
            TrainError::Checkpoint(e) => write!(f, "{e}"),
            TrainError::Diverged(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for TrainError {}

impl From<SettingsError> for TrainError {
    fn from(e: SettingsError) -> Self {
        TrainError::Settings(e)
    }
}

impl From<PlanMismatch> for TrainError {
    fn from(e: PlanMismatch) -> Self {
        TrainError::PlanMismatch(e)
    }
}

impl From<DataError> for TrainError {
    fn from(e: DataError) -> Self {
        TrainError::Data(e)
    }
}

impl From<CheckpointError> for TrainError {
    fn from(e: CheckpointError) -> Self {
        TrainError::Checkpoint(Box::new(e))
    }
}

impl From<ModelError> for TrainError {
    fn from(e: ModelError) -> Self {
        TrainError::Model(e)
    }
}
