//! [`ZeroError`]: why a rank could not take a step.

use std::fmt;

use dsplan_planner::schedule::loss_scale::LossScaleError;

use crate::comm::CommError;
use crate::data::DataError;
use crate::model::ModelError;
use crate::optim::AdamError;
use crate::zero::PlanMismatch;
use crate::zero::swap::SwapError;

/// What stopped a rank.
#[derive(Debug, Clone, PartialEq)]
pub enum ZeroError {
    /// A collective failed (another rank left, or a call did not match).
    Comm(CommError),
    /// The model refused a batch.
    Model(ModelError),
    /// The training data could not be read.
    Data(DataError),
    /// The optimizer step failed.
    Adam(AdamError),
    /// The fp16 loss scale hit its minimum (DeepSpeed ends the run).
    LossScale(LossScaleError),
    /// NVMe offload: a swap file or directory could not be made, read or written.
    Swap(SwapError),
    /// The device backend failed (its CUDA error, in words).
    Device(String),
    /// The plan's buffer list does not size what the rank's stage holds.
    PlanMismatch(PlanMismatch),
    /// Owned state handed to the rank has the wrong length.
    StateLength {
        /// Which state (`master`, `exp_avg`, `exp_avg_sq`).
        what: &'static str,
        /// Elements given.
        found: usize,
        /// Elements of the owned region.
        expected: usize,
    },
}

impl fmt::Display for ZeroError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZeroError::Comm(e) => write!(f, "collective failed: {e}"),
            ZeroError::Model(e) => write!(f, "{e}"),
            ZeroError::Data(e) => write!(f, "{e}"),
            ZeroError::Adam(e) => write!(f, "optimizer step failed: {e}"),
            ZeroError::LossScale(e) => write!(f, "fp16 loss scaling: {e}"),
            ZeroError::Swap(e) => write!(f, "NVMe offload: {e}"),
            ZeroError::Device(e) => write!(f, "GPU: {e}"),
            ZeroError::PlanMismatch(e) => write!(f, "{e}"),
            ZeroError::StateLength {
                what,
                found,
                expected,
            } => write!(f, "{what} has {found} elements, the rank owns {expected}"),
        }
    }
}

impl std::error::Error for ZeroError {}

impl From<CommError> for ZeroError {
    fn from(e: CommError) -> Self {
        ZeroError::Comm(e)
    }
}

impl From<ModelError> for ZeroError {
    fn from(e: ModelError) -> Self {
        ZeroError::Model(e)
    }
}

impl From<DataError> for ZeroError {
    fn from(e: DataError) -> Self {
        ZeroError::Data(e)
    }
}

impl From<AdamError> for ZeroError {
    fn from(e: AdamError) -> Self {
        ZeroError::Adam(e)
    }
}

impl From<LossScaleError> for ZeroError {
    fn from(e: LossScaleError) -> Self {
        ZeroError::LossScale(e)
    }
}

impl From<SwapError> for ZeroError {
    fn from(e: SwapError) -> Self {
        ZeroError::Swap(e)
    }
}
