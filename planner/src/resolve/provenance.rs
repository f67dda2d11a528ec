//! Where each resolved value came from, for `dsplan resolve --explain`.

use serde::Serialize;

use super::training_args::ArgOrigin;

/// One input of an `"auto"` rule: a training argument, the world size or the hidden size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleInput {
    /// The input's name (`world_size`, `per_device_train_batch_size`, `hidden_size`).
    pub name: String,
    /// Its value, as Python would print it.
    pub value: String,
    /// Where it came from (`--world-size`, `TrainingArguments default`, `preset gpt2`).
    pub from: String,
}

/// The origin of one resolved value.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Provenance {
    /// Written in the config file (at `pointer`, which may be an older or alternative spelling
    /// of the resolved key).
    File {
        /// Where in the file.
        pointer: String,
    },
    /// `"auto"` replaced by a training argument given on the command line or in the
    /// `--training-args` file.
    Flag {
        /// The training argument.
        name: String,
        /// The flag (`--learning-rate`), or `--training-args` for the file.
        given_by: String,
    },
    /// `"auto"` replaced by a training argument nobody gave: `TrainingArguments`' default.
    TrainingArgDefault {
        /// The training argument.
        name: String,
        /// Its default, as Python prints it.
        value: String,
    },
    /// Not in the file: DeepSpeed 0.19.8's default (its code's, where the docs differ).
    DeepSpeedDefault {
        /// Why this default, when it is not a constant (`true because stage 3`, "auto" that
        /// DeepSpeed ignores, ...).
        #[serde(skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
    /// `"auto"` computed by a Hugging Face Trainer rule.
    AutoRule {
        /// The rule (the key it fills).
        rule: String,
        /// The formula with its numbers (`hidden_size² = 4096² = 16777216`).
        formula: String,
        /// The inputs and where each came from.
        inputs: Vec<RuleInput>,
    },
    /// A batch size DeepSpeed derives from the other two and the world size.
    BatchDerivation {
        /// The arithmetic.
        formula: String,
    },
}

impl Provenance {
    /// A training argument copied as is into an `"auto"`.
    pub fn from_training_arg(name: &str, value: String, origin: ArgOrigin, flag: &str) -> Self {
        match origin {
            ArgOrigin::Default => Provenance::TrainingArgDefault {
                name: name.to_string(),
                value,
            },
            ArgOrigin::Flag => Provenance::Flag {
                name: name.to_string(),
                given_by: flag.to_string(),
            },
            ArgOrigin::File => Provenance::Flag {
                name: name.to_string(),
                given_by: "--training-args".to_string(),
            },
        }
    }

    /// A DeepSpeed default without a note.
    pub fn deepspeed_default() -> Self {
        Provenance::DeepSpeedDefault { note: None }
    }

    /// One line for people: `file /zero_optimization/stage`, `--learning-rate`, ...
    pub fn describe(&self) -> String {
        match self {
            Provenance::File { pointer } => format!("file {pointer}"),
            Provenance::Flag { name, given_by } => {
                if given_by == "--training-args" {
                    format!("\"auto\" ← {name} from --training-args")
                } else {
                    format!("\"auto\" ← {given_by}")
                }
            }
            Provenance::TrainingArgDefault { name, value } => {
                format!("\"auto\" ← {name} = {value} (TrainingArguments default)")
            }
            Provenance::DeepSpeedDefault { note: None } => "DeepSpeed default".to_string(),
            Provenance::DeepSpeedDefault { note: Some(note) } => {
                format!("DeepSpeed default ({note})")
            }
            Provenance::AutoRule {
                formula, inputs, ..
            } => {
                let sources: Vec<String> = inputs
                    .iter()
                    .map(|input| format!("{} from {}", input.name, input.from))
                    .collect();
                if sources.is_empty() {
                    format!("\"auto\" ← {formula}")
                } else {
                    format!("\"auto\" ← {formula} ({})", sources.join(", "))
                }
            }
            Provenance::BatchDerivation { formula } => format!("derived: {formula}"),
        }
    }
}

/// Where a training argument came from, for [`RuleInput::from`].
pub fn arg_origin_text(origin: ArgOrigin, flag: &str) -> String {
    match origin {
        ArgOrigin::Flag => flag.to_string(),
        ArgOrigin::File => "--training-args".to_string(),
        ArgOrigin::Default => "TrainingArguments default".to_string(),
    }
}
