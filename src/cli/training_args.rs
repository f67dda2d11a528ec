//! Flags shared by `dsplan resolve` and `dsplan schedule`: the Hugging Face training arguments
//! the Trainer's `"auto"` rules read (named after `TrainingArguments`), and the model whose
//! hidden size sizes the ZeRO buckets.

use dsplan_planner::user_file::{FileKind, read_text};
use std::path::PathBuf;

use clap::Args;
use dsplan_planner::resolve::hidden_size;
use dsplan_planner::resolve::{
    Arg, ArgOrigin, Environment, HiddenSize, HiddenSizeLookup, TrainingArgs, WarmupSteps,
};

const HEADING: &str =
    "Training arguments (Hugging Face TrainingArguments; defaults where not given)";

/// The training arguments, as flags or from a JSON file (flags win).
#[derive(Debug, Args)]
pub struct TrainingArgsFlags {
    /// All training arguments from a JSON file (e.g. `TrainingArguments.to_json_string()`);
    /// the flags below override it.
    #[arg(long, value_name = "FILE", help_heading = HEADING)]
    training_args: Option<PathBuf>,
    /// per_device_train_batch_size (default 8).
    #[arg(long, value_name = "N", help_heading = HEADING, value_parser = clap::value_parser!(u64).range(1..))]
    per_device_train_batch_size: Option<u64>,
    /// gradient_accumulation_steps (default 1).
    #[arg(long, value_name = "N", help_heading = HEADING, value_parser = clap::value_parser!(u64).range(1..))]
    gradient_accumulation_steps: Option<u64>,
    /// learning_rate (default 5e-5).
    #[arg(long, value_name = "LR", help_heading = HEADING, value_parser = finite)]
    learning_rate: Option<f64>,
    /// weight_decay (default 0.0).
    #[arg(long, value_name = "X", help_heading = HEADING, value_parser = finite)]
    weight_decay: Option<f64>,
    /// adam_beta1 (default 0.9).
    #[arg(long, value_name = "X", help_heading = HEADING, value_parser = finite)]
    adam_beta1: Option<f64>,
    /// adam_beta2 (default 0.999).
    #[arg(long, value_name = "X", help_heading = HEADING, value_parser = finite)]
    adam_beta2: Option<f64>,
    /// adam_epsilon (default 1e-8).
    #[arg(long, value_name = "X", help_heading = HEADING, value_parser = finite)]
    adam_epsilon: Option<f64>,
    /// max_grad_norm (default 1.0).
    #[arg(long, value_name = "X", help_heading = HEADING, value_parser = finite)]
    max_grad_norm: Option<f64>,
    /// warmup_steps: a number of steps, or below 1 a ratio of the training steps (as in
    /// transformers 5; default 0).
    #[arg(long, value_name = "N|RATIO", help_heading = HEADING, value_parser = warmup)]
    warmup_steps: Option<WarmupSteps>,
    /// The number of optimizer steps of the run (the Trainer's max_steps, or epochs × steps per
    /// epoch): fills scheduler.params.total_num_steps and ratio warm-ups.
    #[arg(long, value_name = "N", help_heading = HEADING)]
    num_training_steps: Option<u64>,
    /// fp16 (default off).
    #[arg(long, help_heading = HEADING)]
    fp16: bool,
    /// bf16 (default off).
    #[arg(long, help_heading = HEADING)]
    bf16: bool,
    /// gradient_checkpointing (default off): `dsplan run` recomputes each layer's forward in
    /// backward, as with an activation_checkpointing section.
    #[arg(long, help_heading = HEADING)]
    gradient_checkpointing: bool,
}

/// The model whose hidden size fills the bucket-size `"auto"`s.
#[derive(Debug, Args)]
pub struct ModelFlags {
    /// The model's hidden size.
    #[arg(long, value_name = "H", conflicts_with = "model", value_parser = clap::value_parser!(u64).range(1..))]
    hidden_size: Option<u64>,
    /// A preset name, a Hugging Face config.json, or a directory (or *.safetensors file) with a
    /// config.json beside it: the hidden size is read as transformers reads it.
    #[arg(long, value_name = "M")]
    model: Option<String>,
}

impl ModelFlags {
    /// What the flags say about the hidden size (`Err`: the model cannot be read).
    pub fn hidden_size(&self) -> Result<HiddenSizeLookup, String> {
        match (&self.hidden_size, &self.model) {
            (Some(h), _) => Ok(HiddenSizeLookup::Known(HiddenSize::from_flag(*h))),
            (None, Some(model)) => hidden_size::from_model(model),
            (None, None) => Ok(HiddenSizeLookup::NotGiven),
        }
    }
}

impl TrainingArgsFlags {
    /// The `--training-args` file, if given.
    pub fn training_args_file(&self) -> Option<&std::path::Path> {
        self.training_args.as_deref()
    }

    /// The training arguments: the file's (if any) over transformers' defaults, the flags over
    /// both. `Err`: the file cannot be read or holds invalid values.
    pub fn training_args(&self) -> Result<TrainingArgs, String> {
        let mut args = match &self.training_args {
            None => TrainingArgs::default(),
            Some(path) => {
                let shown = path.display();
                let text = read_text(path, FileKind::TrainingArgs)
                    .map_err(|error| format!("--training-args {shown}: {error}"))?;
                let value = serde_json::from_str(&text)
                    .map_err(|error| format!("{shown} is not JSON: {error}"))?;
                TrainingArgs::from_json(&value)
                    .map_err(|problems| format!("{shown}: {}", problems.join("; ")))?
            }
        };
        let flag = |value| Arg::given(value, ArgOrigin::Flag);
        if let Some(v) = self.per_device_train_batch_size {
            args.per_device_train_batch_size = flag(v);
        }
        if let Some(v) = self.gradient_accumulation_steps {
            args.gradient_accumulation_steps = flag(v);
        }
        for (value, slot) in [
            (self.learning_rate, &mut args.learning_rate),
            (self.weight_decay, &mut args.weight_decay),
            (self.adam_beta1, &mut args.adam_beta1),
            (self.adam_beta2, &mut args.adam_beta2),
            (self.adam_epsilon, &mut args.adam_epsilon),
            (self.max_grad_norm, &mut args.max_grad_norm),
        ] {
            if let Some(v) = value {
                *slot = Arg::given(v, ArgOrigin::Flag);
            }
        }
        if let Some(v) = self.warmup_steps {
            args.warmup_steps = Arg::given(v, ArgOrigin::Flag);
        }
        if let Some(v) = self.num_training_steps {
            args.num_training_steps = Some(Arg::given(v, ArgOrigin::Flag));
        }
        if self.fp16 {
            args.fp16 = flag_true();
        }
        if self.bf16 {
            args.bf16 = flag_true();
        }
        if self.gradient_checkpointing {
            args.gradient_checkpointing = flag_true();
        }
        Ok(args)
    }
}

/// Resolution's environment from the flags.
pub fn environment(
    world_size: Option<u64>,
    training: &TrainingArgsFlags,
    model: Option<&ModelFlags>,
) -> Result<Environment, String> {
    Ok(Environment {
        world_size,
        training_args: training.training_args()?,
        hidden_size: match model {
            Some(model) => model.hidden_size()?,
            None => HiddenSizeLookup::NotGiven,
        },
    })
}

fn flag_true() -> Arg<bool> {
    Arg::given(true, ArgOrigin::Flag)
}

fn finite(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(value) if value.is_finite() => Ok(value),
        _ => Err(format!("`{text}` is not a finite number")),
    }
}

fn warmup(text: &str) -> Result<WarmupSteps, String> {
    WarmupSteps::from_number(finite(text)?)
}
