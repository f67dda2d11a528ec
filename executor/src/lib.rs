//! dsplan's executor: runs a compiled plan.
//!
//! The CPU GPT-2 exists as a library: [`model`] (the hand-written model, forward and backward
//! over flat buffers), [`tensor`] (named spans of those buffers), [`io`] (Hugging Face
//! `config.json` and `model.safetensors`), [`optim`] (Adam/AdamW and gradient clipping),
//! [`comm`] (collectives; in-process ranks) and [`data`] (token batches split across ranks and
//! micro-steps).
//!
//! A plan does not run yet. The CPU backend (ZeRO stages 0-3 over in-process ranks, around the
//! model above) and the CUDA backend are tracked as separate issues; until they land, asking
//! the executor to run returns [`ExecutorError::NotImplemented`] instead of pretending.

pub mod comm;
pub mod cuda;
pub mod data;
pub mod io;
pub mod model;
pub mod optim;
pub mod tensor;

use std::fmt;

/// Why the executor could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorError {
    /// The requested capability does not exist yet.
    NotImplemented(&'static str),
}

impl fmt::Display for ExecutorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutorError::NotImplemented(what) => {
                write!(f, "{what} is not implemented yet in this build of dsplan")
            }
        }
    }
}

impl std::error::Error for ExecutorError {}
