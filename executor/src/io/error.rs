//! [`LoadError`]: why a model could not be read or written.

use std::fmt;
use std::path::PathBuf;

use crate::model::ConfigError;

/// Why a model could not be loaded or saved. Every variant names what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// A file could not be read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// `config.json` is not valid JSON or not an object.
    Json(String),
    /// A `config.json` key is missing, mistyped, or asks for something not implemented.
    ConfigKey {
        /// The key.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// The sizes in `config.json` do not describe a model.
    Config(ConfigError),
    /// The safetensors container itself is malformed.
    Safetensors(String),
    /// A parameter the model needs is not in the file.
    MissingTensor {
        /// Hugging Face name.
        name: String,
    },
    /// A tensor has the wrong shape.
    ShapeMismatch {
        /// Name as stored in the file.
        name: String,
        /// Shape the model needs.
        expected: Vec<usize>,
        /// Shape in the file.
        found: Vec<usize>,
    },
    /// A tensor's dtype cannot be converted to f32.
    UnsupportedDtype {
        /// Name as stored in the file.
        name: String,
        /// The dtype, as safetensors names it.
        dtype: String,
    },
    /// The file holds a tensor this model does not have.
    UnexpectedTensor {
        /// Name as stored in the file.
        name: String,
    },
    /// The file holds the same parameter twice (with and without the `transformer.` prefix).
    DuplicateTensor {
        /// Hugging Face name.
        name: String,
    },
    /// The weights hold NaN or infinite values, which no run can train from.
    NonFinite {
        /// The model directory.
        path: PathBuf,
        /// The first such value's position in the flat parameters.
        first: usize,
        /// How many there are.
        count: usize,
    },
    /// `lm_head.weight` is stored and differs from `transformer.wte.weight`; only tied heads
    /// are implemented.
    UntiedLmHead,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Io { path, message } => write!(f, "{}: {message}", path.display()),
            LoadError::Json(message) => write!(f, "config.json: {message}"),
            LoadError::ConfigKey { key, problem } => write!(f, "config.json: `{key}` {problem}"),
            LoadError::Config(error) => error.fmt(f),
            LoadError::Safetensors(message) => write!(f, "safetensors: {message}"),
            LoadError::MissingTensor { name } => write!(f, "tensor `{name}` is missing"),
            LoadError::ShapeMismatch {
                name,
                expected,
                found,
            } => write!(
                f,
                "tensor `{name}` has shape {found:?}, the model needs {expected:?}"
            ),
            LoadError::UnsupportedDtype { name, dtype } => {
                write!(
                    f,
                    "tensor `{name}` has dtype {dtype}, which cannot be read as f32"
                )
            }
            LoadError::UnexpectedTensor { name } => {
                write!(f, "tensor `{name}` is not a parameter of a GPT-2")
            }
            LoadError::DuplicateTensor { name } => write!(f, "tensor `{name}` is stored twice"),
            LoadError::NonFinite { path, first, count } => write!(
                f,
                "{}: the weights hold {count} NaN or infinite value(s) (the first at flat \
                 position {first}); a run cannot train from them: restore the weights from a \
                 good copy",
                path.display()
            ),
            LoadError::UntiedLmHead => write!(
                f,
                "`lm_head.weight` differs from `transformer.wte.weight`; only tied embeddings are supported"
            ),
        }
    }
}

impl std::error::Error for LoadError {}

impl From<ConfigError> for LoadError {
    fn from(error: ConfigError) -> Self {
        LoadError::Config(error)
    }
}
