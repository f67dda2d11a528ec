//! [`Environment`]: everything resolution needs besides the config file, given explicitly so
//! that resolution stays a pure function (no devices, no `torch.distributed`, no network).

use serde::Serialize;

use super::training_args::TrainingArgs;

/// Where the model's hidden size was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum HiddenSizeSource {
    /// `--hidden-size`.
    Flag,
    /// A built-in model preset.
    Preset {
        /// The preset's name.
        name: String,
    },
    /// A Hugging Face `config.json`, at the key transformers reads.
    Config {
        /// The file.
        path: String,
        /// What was read: `hidden_size`, `n_embd` (GPT-2's spelling of `hidden_size`),
        /// `max(hidden_sizes)`, `text_config.hidden_size`, ...
        key: String,
    },
}

/// The model's hidden size `h`, which the Trainer's bucket-size rules use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HiddenSize {
    /// `h`.
    pub value: u64,
    /// Where it came from.
    pub source: HiddenSizeSource,
}

impl HiddenSize {
    /// A hidden size given on the command line.
    pub fn from_flag(value: u64) -> Self {
        HiddenSize {
            value,
            source: HiddenSizeSource::Flag,
        }
    }

    /// How the source reads in an explanation (`--hidden-size`, `gpt2 preset`, ...).
    pub fn describe(&self) -> String {
        match &self.source {
            HiddenSizeSource::Flag => "--hidden-size".to_string(),
            HiddenSizeSource::Preset { name } => format!("preset {name}"),
            HiddenSizeSource::Config { path, key } => format!("{key} in {path}"),
        }
    }
}

/// What is known about the model's hidden size.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum HiddenSizeLookup {
    /// Neither `--hidden-size` nor `--model` was given.
    #[default]
    NotGiven,
    /// Found.
    Known(HiddenSize),
    /// The model was given, but its config has neither `hidden_size` nor `hidden_sizes`
    /// (transformers raises in that case).
    NotInModel {
        /// The model as given.
        model: String,
    },
}

impl HiddenSizeLookup {
    /// The hidden size, when known.
    pub fn known(&self) -> Option<&HiddenSize> {
        match self {
            HiddenSizeLookup::Known(hidden) => Some(hidden),
            _ => None,
        }
    }
}

/// The explicit environment of a resolution.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Environment {
    /// The data-parallel world size (`--world-size`). `None` leaves the batch triangle
    /// unsolvable: a missing batch key or `train_batch_size: "auto"` is then an error.
    pub world_size: Option<u64>,
    /// The Hugging Face training arguments (defaults where not given).
    pub training_args: TrainingArgs,
    /// The model's hidden size.
    pub hidden_size: HiddenSizeLookup,
}
