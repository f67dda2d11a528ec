//! [`CheckpointError`]: why a checkpoint could not be written, read or resumed from.

use std::fmt;
use std::path::PathBuf;

/// What went wrong with a checkpoint, naming the file and, where there is one, the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointError {
    /// A file or directory could not be read or written.
    Io {
        /// The path.
        path: PathBuf,
        /// The system's message.
        message: String,
    },
    /// A file or directory that should be there is not.
    Missing {
        /// The path.
        path: PathBuf,
        /// What it should be.
        what: &'static str,
    },
    /// A file is there but cannot be understood.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The field or tensor at fault.
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// The checkpoint does not fit the run resuming from it.
    Mismatch {
        /// The checkpoint's `engine_state.json`.
        path: PathBuf,
        /// The field that differs.
        field: String,
        /// The checkpoint's value.
        saved: String,
        /// The run's value.
        run: String,
        /// How to fix it.
        help: String,
    },
    /// Another rank failed while writing its part (its own error is reported by it).
    PeerFailed,
    /// A save stopped on purpose by [`super::SaveFault`] (tests of atomicity).
    Injected {
        /// Where it stopped.
        at: &'static str,
    },
}

impl CheckpointError {
    /// Whether this error is about the files (I/O, missing, corrupt: the CLI's exit 2) rather
    /// than a checkpoint that does not fit the run (exit 1).
    pub fn is_io(&self) -> bool {
        !matches!(self, CheckpointError::Mismatch { .. })
    }

    pub(super) fn io(path: impl Into<PathBuf>, error: &std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            message: error.to_string(),
        }
    }

    pub(super) fn corrupt(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        CheckpointError::Corrupt {
            path: path.into(),
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::Io { path, message } => {
                write!(f, "checkpoint {}: {message}", path.display())
            }
            CheckpointError::Missing { path, what } => {
                write!(f, "checkpoint: no {what} at {}", path.display())
            }
            CheckpointError::Corrupt {
                path,
                field,
                message,
            } => write!(f, "checkpoint {}: `{field}`: {message}", path.display()),
            CheckpointError::Mismatch {
                path,
                field,
                saved,
                run,
                help,
            } => write!(
                f,
                "checkpoint {}: `{field}` is {saved}, this run has {run} ({help})",
                path.display()
            ),
            CheckpointError::PeerFailed => write!(f, "another rank failed to write its part"),
            CheckpointError::Injected { at } => {
                write!(f, "checkpoint save stopped {at} (fault injected)")
            }
        }
    }
}

impl std::error::Error for CheckpointError {}
