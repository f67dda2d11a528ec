//! Why a model could not be specified: each error names the input and how to fix it.

use std::fmt;
use std::path::PathBuf;

/// Whether an error is the user's invocation (a flag, a path, an unreadable file) or the
/// content of a model description that was read fine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad flag value, an unknown preset, a missing or unreadable file (CLI exit 2).
    UsageOrIo,
    /// A readable model description that is wrong or unsupported (CLI exit 1).
    Input,
}

/// Everything that can go wrong while building a [`super::ModelSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// `--model NAME` is neither a path nor a built-in preset.
    UnknownPreset {
        /// What the user typed.
        name: String,
        /// The closest preset name, if any is close.
        suggestion: Option<String>,
    },
    /// A file or directory could not be read.
    Unreadable {
        /// The path.
        path: PathBuf,
        /// The operating system's reason.
        reason: String,
    },
    /// A directory with neither safetensors weights nor a `config.json`.
    NothingToRead {
        /// The directory.
        dir: PathBuf,
    },
    /// A `config.json` (or safetensors index) that is not valid JSON.
    NotJson {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// A `config.json` field is missing or has the wrong type.
    ConfigField {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A `config.json` whose `model_type` dsplan cannot count.
    UnsupportedModelType {
        /// The file.
        path: PathBuf,
        /// Its `model_type`.
        model_type: String,
    },
    /// Dimensions that do not describe a model.
    BadArchitecture {
        /// What is wrong.
        reason: String,
    },
    /// A safetensors file whose header cannot be read.
    BadSafetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The same tensor name appears in two safetensors files of one checkpoint.
    DuplicateTensor {
        /// The tensor.
        name: String,
        /// The second file holding it.
        path: PathBuf,
    },
    /// The largest layer cannot hold more parameters than the whole model.
    LargestLayerExceedsTotal {
        /// `--largest-layer`.
        largest_layer: u64,
        /// `--params`.
        total: u64,
    },
    /// More parameters than [`super::MAX_PARAMS`].
    TooManyParams {
        /// The count (saturated at `u64::MAX` when it overflowed).
        params: u64,
    },
    /// A model with no parameters at all.
    NoParameters {
        /// Where the count came from.
        source: String,
    },
}

impl ModelError {
    /// Which exit code the CLI should use.
    pub fn kind(&self) -> ErrorKind {
        match self {
            ModelError::UnknownPreset { .. }
            | ModelError::Unreadable { .. }
            | ModelError::NothingToRead { .. }
            | ModelError::NotJson { .. }
            | ModelError::LargestLayerExceedsTotal { .. } => ErrorKind::UsageOrIo,
            ModelError::ConfigField { .. }
            | ModelError::UnsupportedModelType { .. }
            | ModelError::BadArchitecture { .. }
            | ModelError::BadSafetensors { .. }
            | ModelError::DuplicateTensor { .. }
            | ModelError::TooManyParams { .. }
            | ModelError::NoParameters { .. } => ErrorKind::Input,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::UnknownPreset { name, suggestion } => {
                write!(f, "`{name}` is neither a file nor a built-in model preset")?;
                match suggestion {
                    Some(preset) => write!(f, "; did you mean `{preset}`?"),
                    None => write!(
                        f,
                        "; pass a preset name (`dsplan estimate --help` lists them), a config.json or a directory of *.safetensors (dsplan does not download models)"
                    ),
                }
            }
            ModelError::Unreadable { path, reason } => {
                write!(
                    f,
                    "cannot read `{}`: {reason}; check the path and its permissions",
                    path.display()
                )
            }
            ModelError::NothingToRead { dir } => write!(
                f,
                "`{}` holds no *.safetensors files and no config.json; point --model at a model directory, a config.json or a preset",
                dir.display()
            ),
            ModelError::NotJson { path, reason } => {
                write!(
                    f,
                    "`{}` is not valid JSON ({reason}); pass a Hugging Face config.json",
                    path.display()
                )
            }
            ModelError::ConfigField { path, key, problem } => {
                write!(f, "`{}`: `{key}` {problem}", path.display())
            }
            ModelError::UnsupportedModelType { path, model_type } => write!(
                f,
                "`{}`: model_type `{model_type}` is not supported (supported: {}); pass --params and --largest-layer instead, or a directory of *.safetensors",
                path.display(),
                super::hf_config::SUPPORTED_MODEL_TYPES.join(", ")
            ),
            ModelError::BadArchitecture { reason } => {
                write!(f, "not a valid architecture: {reason}")
            }
            ModelError::BadSafetensors { path, reason } => {
                write!(
                    f,
                    "`{}` is not a readable safetensors file: {reason}",
                    path.display()
                )
            }
            ModelError::DuplicateTensor { name, path } => write!(
                f,
                "tensor `{name}` appears twice (again in `{}`); the directory mixes several checkpoints: keep one, or add its model.safetensors.index.json",
                path.display()
            ),
            ModelError::LargestLayerExceedsTotal {
                largest_layer,
                total,
            } => write!(
                f,
                "--largest-layer {largest_layer} is larger than --params {total}; the largest layer is one module's parameters, part of the total"
            ),
            ModelError::TooManyParams { params } => write!(
                f,
                "{params} parameters is more than the 2^53 dsplan counts; check the sizes given"
            ),
            ModelError::NoParameters { source } => write!(f, "{source} has no parameters"),
        }
    }
}

impl std::error::Error for ModelError {}
