//! Model specifications: parameter counts and shapes from presets, Hugging Face `config.json`
//! files and safetensors headers.
//!
//! A [`ModelSpec`] carries what the estimators need (total parameters and DeepSpeed's largest
//! layer), the architecture when known, where it all came from, and any assumption made on the
//! way ([`Note`]). Sources:
//! - `--params` (and optionally `--largest-layer`): [`load::from_params`];
//! - a built-in preset ([`presets`]), defined as an architecture so counts are computed;
//! - a Hugging Face `config.json` ([`hf_config`]);
//! - a directory of `*.safetensors` files, counted exactly from their headers ([`safetensors`]).
//!
//! [`load::load`] picks the source from what `--model` names.

pub mod architecture;
pub mod error;
pub mod gpt_shape;
pub mod hf_config;
pub mod layouts;
pub mod load;
pub mod notes;
pub mod presets;
pub mod safetensors;
pub mod tensors;
#[cfg(test)]
mod test_files;

pub use architecture::{Architecture, Bias, Embeddings, Family, FeedForward};
pub use error::{ErrorKind, ModelError};
pub use load::{from_params, load};
pub use notes::Note;
pub use tensors::{LargestLayer, TensorEntry};

use serde::Serialize;
use std::fmt;
use std::path::PathBuf;

/// The most parameters dsplan accepts (2^53): every count stays an exact integer in JSON
/// consumers that read numbers as doubles, and is a million times the largest model trained.
pub const MAX_PARAMS: u64 = 1 << 53;

/// Whether the language-modelling head is counted.
///
/// The default is [`LmHead::Exclude`]: the base model, as `AutoModel.from_pretrained` builds
/// it. That is what DeepSpeed's and Hugging Face's documented estimator examples measure (the
/// T0_3B and t5-3b tables), so dsplan's default reproduces them. A training run of a
/// `*ForCausalLM` / `*ForConditionalGeneration` class also holds the head; [`LmHead::Include`]
/// counts it. With tied embeddings the head adds no parameters either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LmHead {
    /// Count the head (and, for BERT, build `BertForMaskedLM` instead of `BertModel`).
    Include,
    /// Count the base model only.
    #[default]
    Exclude,
}

/// How the LM head was treated, and what it weighs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LmHeadReport {
    /// Counted or not.
    pub choice: LmHead,
    /// Parameters the head adds to the base model (0 when tied to the embeddings).
    pub extra_params: u64,
}

/// Where a model specification came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ModelSource {
    /// `--params` on the command line.
    Params,
    /// A built-in preset.
    Preset {
        /// dsplan's name.
        name: &'static str,
        /// The Hugging Face repository it describes, if any.
        hub_id: Option<&'static str>,
    },
    /// A Hugging Face `config.json`.
    HfConfig {
        /// The file.
        path: PathBuf,
    },
    /// Safetensors headers.
    Safetensors {
        /// The file or directory given.
        path: PathBuf,
        /// The files read.
        files: Vec<PathBuf>,
        /// Tensors counted.
        tensors: usize,
    },
}

impl fmt::Display for ModelSource {
    /// `params`, `preset:NAME`, `config:PATH` or `safetensors:PATH`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelSource::Params => write!(f, "params"),
            ModelSource::Preset { name, .. } => write!(f, "preset:{name}"),
            ModelSource::HfConfig { path } => write!(f, "config:{}", path.display()),
            ModelSource::Safetensors { path, .. } => write!(f, "safetensors:{}", path.display()),
        }
    }
}

/// Everything the estimators need to know about a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSpec {
    /// A name for display: the preset name, the path, or the given count.
    pub name: String,
    /// Parameters, each shared storage counted once.
    pub total_params: u64,
    /// DeepSpeed's largest layer: the most parameters owned directly by one module.
    pub largest_layer: LargestLayer,
    /// How the LM head was treated (`None` when only counts were given).
    pub lm_head: Option<LmHeadReport>,
    /// The shape, when known.
    pub architecture: Option<Architecture>,
    /// Where the numbers came from.
    pub source: ModelSource,
    /// Assumptions and observations.
    pub notes: Vec<Note>,
}
