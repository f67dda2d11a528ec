//! dsplan's executor: runs a compiled plan.
//!
//! Nothing runs yet. The CPU backend (a hand-written GPT-2, ZeRO stages 0-3 over in-process
//! ranks) and the CUDA backend are tracked as separate issues; until they land, asking the
//! executor to run returns [`ExecutorError::NotImplemented`] instead of pretending.

pub mod comm;
pub mod data;
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
