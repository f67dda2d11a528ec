//! [`Job`]: what `dsplan run` trains, read once from its inputs before anything is planned or
//! allocated: the config (parsed, refused when it asks for tensor or pipeline parallelism,
//! resolved as the Hugging Face Trainer resolves it), the model's shape (bounded before
//! anything is sized by it), the data (its file checked, a stored file's rows fixing the
//! sequence length and the steps), the run's settings and its step count.
//!
//! The model's weights are read later ([`Job::weights`]), after the memory pre-flight, so a
//! model too large for the machine is refused before they are allocated: the shape and the
//! weights are the two reads of `--model`, and the second is checked against the first.

use dsplan_executor::data::{WindowOrder, check_data_file, resident_bytes};
use dsplan_executor::model::ModelConfig;
use dsplan_executor::train::plan::architecture;
use dsplan_executor::train::settings::override_nvme_path;
use dsplan_executor::train::{
    DEFAULT_PRESET, DataChoice, ModelChoiceError, TrainSettings, TrainSpec, check_finite_weights,
    choose_model, model_config, stored_shape,
};
use dsplan_planner::diagnostics::{Code, Diagnostic, Severity};
use dsplan_planner::resolve::{Arg, ArgOrigin, Resolved, hidden_size, resolve};
use dsplan_planner::source::SourceFile;
use serde_json::Value;

use super::sft::{self, SftJob};
use super::{Failure, RunArgs};
use crate::cli::training_args::environment;
use crate::render;

/// Steps when neither `--steps`, the scheduler's `total_num_steps` nor stored data say.
const DEFAULT_STEPS: u64 = 200;
/// Longest default sequence (the model's `n_positions` if shorter).
const DEFAULT_SEQ_LEN: usize = 64;

/// What the run trains; see the [module documentation](self).
pub(super) struct Job {
    /// The config's path as printed (control characters escaped).
    pub display: String,
    /// The config file, for diagnostics with its lines.
    pub file: SourceFile,
    /// `--model` as given, or the default preset.
    pub model_name: String,
    /// The model's family and shape.
    pub model: ModelConfig,
    /// Its parameter count.
    pub num_params: usize,
    /// The run's settings from the resolved config (the attention kernel is the backend's
    /// choice, [`super::setup`]).
    pub settings: TrainSettings,
    /// Tokens per row.
    pub seq_len: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// The data and its order.
    pub data: DataChoice,
    /// The data as printed.
    pub data_name: String,
    /// Bytes the data holds in memory while training.
    pub data_bytes: u64,
    /// Fine-tuning data (`--data train.jsonl`), prepared.
    pub sft: Option<SftJob>,
}

impl Job {
    /// Reads the run's inputs for a world of `world` ranks.
    pub fn read(args: &RunArgs, world: usize) -> Result<Job, Failure> {
        // Printed: the user's path, control characters escaped (`render::escape_controls`).
        let display = render::escape_controls(&args.config.display().to_string()).into_owned();
        let bytes = crate::cli::read_input(&args.config).map_err(|d| Failure::usage(d.message))?;
        let (file, parsed) = match SourceFile::parse(&display, &bytes) {
            Ok(parsed) => parsed,
            Err(fatal) => {
                say_text!("{}", render::human_with_bytes(&display, &bytes, &fatal));
                return Err(Failure::input(format!(
                    "{display} is not a readable config"
                )));
            }
        };
        crate::cli::parallel::refuse_in_run(file.value()).map_err(Failure::input)?;
        let fine_tuning = args.data.as_deref().is_some_and(sft::is_sft_data);
        let sft_config = fine_tuning.then(|| sft::read_config(args)).transpose()?;
        if args.save_batches.is_some() && !fine_tuning {
            return Err(Failure::usage(
                "--save-batches writes fine-tuning micro-batches: it needs --data of a .jsonl, .json or .parquet dataset",
            ));
        }
        let data_bytes = match &args.data {
            Some(_) if fine_tuning => 0,
            Some(path) => {
                let size = check_data_file(path).map_err(|e| Failure::usage(e.to_string()))?;
                resident_bytes(path, size)
            }
            None => 0,
        };
        let model_name = args.model.as_deref().unwrap_or(DEFAULT_PRESET).to_string();
        let model = model_config(args.model.as_deref())
            .map_err(|e: ModelChoiceError| Failure::usage(e.to_string()))?;
        // Every dimension bounded (naming the one out of bounds) before anything is sized by it.
        architecture(&model)
            .validate()
            .map_err(|e| Failure::input(format!("{model_name}: {e}")))?;
        let (seq_len, known_steps) = if fine_tuning {
            fine_tuning_rows(args)?
        } else {
            rows(args, &model)?
        };
        let mut resolved = resolve_config(args, world, &file, parsed, &model_name, known_steps)?;
        if let Some(path) = &args.nvme_path
            && override_nvme_path(&mut resolved.typed, &path.to_string_lossy())
        {
            say!(
                "note: --nvme-path {} replaces the config's nvme_path",
                render::escape_controls(&path.display().to_string())
            );
        }
        // The Trainer's gradient_checkpointing (the flag or --training-args) asks for the
        // same recomputation as an activation_checkpointing section.
        let training_args = args.training.training_args().map_err(Failure::usage)?;
        let settings = TrainSettings::from_resolved(&resolved)
            .map_err(|e| Failure::input(format!("{display}: {e}")))?
            .with_gradient_checkpointing(training_args.gradient_checkpointing.value);
        if let Some(config) = sft_config {
            let steps = known_steps.or(training_args.num_training_steps.map(|a| a.value));
            let job = SftJob::open(args, config, &settings, world, steps)?;
            let has_scheduler = resolved.config.get("scheduler").is_some();
            let settings = job.settings(settings, has_scheduler, &training_args)?;
            if let Some(note) = job.inert_note() {
                say!("note: {note}");
            }
            let num_params = model.layout().num_params();
            return Ok(Job {
                display,
                file,
                model_name,
                model,
                num_params,
                settings,
                seq_len: job.seq_len,
                steps: job.steps,
                data: job.choice.clone(),
                data_name: job.choice_name(),
                data_bytes,
                sft: Some(job),
            });
        }
        let steps = known_steps.unwrap_or_else(|| {
            resolved
                .config
                .pointer("/scheduler/params/total_num_steps")
                .and_then(Value::as_u64)
                .filter(|&n| n > 0)
                .unwrap_or(DEFAULT_STEPS)
        });
        let order = WindowOrder::Shuffled { seed: args.seed };
        let (data, data_name) = match &args.data {
            Some(path) => (
                DataChoice::File {
                    path: path.clone(),
                    order,
                },
                render::escape_controls(&path.display().to_string()).into_owned(),
            ),
            None => (
                DataChoice::Bundled { order },
                "the bundled corpus (byte tokens)".to_string(),
            ),
        };
        let num_params = model.layout().num_params();
        Ok(Job {
            display,
            file,
            model_name,
            model,
            num_params,
            settings,
            seq_len,
            steps,
            data,
            data_name,
            data_bytes,
            sft: None,
        })
    }

    /// The run of `settings` (the job's, with the backend's attention kernel), its weights not
    /// yet read.
    pub fn spec(&self, settings: TrainSettings, world: usize) -> TrainSpec {
        TrainSpec {
            settings,
            model: self.model,
            initial_params: Vec::new(),
            data: self.data.clone(),
            seq_len: self.seq_len,
            steps: self.steps,
            world,
        }
    }

    /// The model's initial weights (fresh ones from `--seed`, or a directory's, checked for
    /// NaN and infinities unless `--allow-non-finite-model`), and where they came from.
    pub fn weights(&self, args: &RunArgs) -> Result<(Vec<f32>, String), Failure> {
        let model = choose_model(args.model.as_deref(), args.seed)
            .map_err(|e: ModelChoiceError| Failure::usage(e.to_string()))?;
        if model.config != self.model {
            return Err(Failure::usage(format!(
                "{}: the model's shape changed while dsplan read it",
                self.model_name
            )));
        }
        if let Some(path) = args
            .model
            .as_deref()
            .map(std::path::Path::new)
            .filter(|p| p.is_dir())
            && !args.allow_non_finite_model
        {
            check_finite_weights(path, &model.params).map_err(|e| {
                Failure::input(format!(
                    "{e} (--allow-non-finite-model trains from them anyway)"
                ))
            })?;
        }
        Ok((model.params, model.description))
    }
}

/// Tokens per row and, for a stored file, the steps its rows hold: a stored file fixes both
/// (a `--seq-len` that disagrees is an error); else `--seq-len`, or the model's context
/// length up to [`DEFAULT_SEQ_LEN`].
fn rows(args: &RunArgs, model: &ModelConfig) -> Result<(usize, Option<u64>), Failure> {
    let stored = match &args.data {
        Some(path) => stored_shape(path).map_err(|e| Failure::usage(e.to_string()))?,
        None => None,
    };
    let seq_len = match (stored, args.seq_len) {
        (Some(shape), Some(asked)) if asked as usize != shape.seq_len => {
            return Err(Failure::usage(format!(
                "--seq-len {asked}, but the stored rows hold {} tokens (seq_len {})",
                shape.seq_len + 1,
                shape.seq_len
            )));
        }
        (Some(shape), _) => shape.seq_len,
        (None, Some(asked)) => asked as usize,
        (None, None) => model.max_positions().min(DEFAULT_SEQ_LEN),
    };
    Ok((seq_len, args.steps.or(stored.map(|s| s.steps))))
}

/// A fine-tuning run's rows are the data's (`max_length` bounds them): `--seq-len` is refused;
/// the steps are `--steps` when given (else `max_steps`, else the epochs, see [`SftJob::open`]).
fn fine_tuning_rows(args: &RunArgs) -> Result<(usize, Option<u64>), Failure> {
    if args.seq_len.is_some() {
        return Err(Failure::usage(
            "--seq-len does not apply to fine-tuning data: each micro-batch is as long as its longest row, at most max_length (set it in --training-args)",
        ));
    }
    Ok((0, args.steps))
}

/// Resolves the config as the Hugging Face Trainer and DeepSpeed would for this run: its world
/// size, the training-argument flags (`--steps` or the stored steps standing for
/// `num_training_steps` when that is not given), and the hidden size of the model trained.
/// Errors are rendered with the file's lines; so are warnings, except the mismatches against
/// `TrainingArguments`' defaults, which matter only under the Trainer and are counted in one
/// note.
fn resolve_config(
    args: &RunArgs,
    world: usize,
    file: &SourceFile,
    mut diagnostics: Vec<Diagnostic>,
    model_name: &str,
    known_steps: Option<u64>,
) -> Result<Resolved, Failure> {
    let display = file.path().to_string();
    let mut env = environment(Some(world as u64), &args.training, None).map_err(Failure::usage)?;
    if env.training_args.num_training_steps.is_none()
        && schedule_length_is_auto(file.value())
        && let Some(steps) = known_steps
    {
        env.training_args.num_training_steps = Some(Arg::given(steps, ArgOrigin::Flag));
    }
    env.hidden_size = hidden_size::from_model(model_name).map_err(Failure::usage)?;
    let outcome = resolve(file.value(), &env);
    let resolved = match outcome {
        Ok(resolved) => {
            diagnostics.extend(resolved.diagnostics.iter().cloned());
            Some(resolved)
        }
        Err(found) => {
            diagnostics.extend(found);
            None
        }
    };
    file.locate_all(&mut diagnostics);
    diagnostics.sort_by_key(|d| (d.line, d.column));
    let against_defaults = diagnostics
        .iter()
        .filter(|d| d.code == Code::AutoMismatch && d.severity == Severity::Warning)
        .count();
    let shown: Vec<Diagnostic> = diagnostics
        .iter()
        .filter(|d| {
            d.is_error() || (d.severity == Severity::Warning && d.code != Code::AutoMismatch)
        })
        .cloned()
        .collect();
    say_text!("{}", render::human(file, &shown));
    let Some(resolved) = resolved else {
        say_text!("{}", render::file_summary(&display, &shown));
        return Err(Failure::input(format!(
            "{display} cannot be resolved for this run; `dsplan resolve {display} --world-size {world}` explains it"
        )));
    };
    if against_defaults > 0 {
        say!(
            "note: {against_defaults} value(s) of {display} differ from Hugging Face TrainingArguments' defaults; that matters only when training with the Trainer (`dsplan resolve` lists them)"
        );
    }
    Ok(resolved)
}

/// Whether the scheduler's length is left to the Trainer (`"auto"` total or warmup steps).
/// Only then does the number of steps run stand for `num_training_steps`: a config that names
/// its schedule's length keeps it, and `--steps` runs that many steps of it.
fn schedule_length_is_auto(config: &Value) -> bool {
    [
        "/scheduler/params/total_num_steps",
        "/scheduler/params/warmup_num_steps",
    ]
    .iter()
    .any(|pointer| config.pointer(pointer).and_then(Value::as_str) == Some("auto"))
}
