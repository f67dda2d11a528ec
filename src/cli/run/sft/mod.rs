//! `dsplan run --data train.jsonl`: fine-tuning on the user's own data as TRL 1.16's
//! `SFTTrainer` does. A `.jsonl` / `.json` / `.parquet` file or a directory of shards selects
//! this path; text, `.bin` and `.safetensors` data keep theirs.
//!
//! The tokenizer comes from `--tokenizer DIR` or the `--model` directory; the `SFTConfig`
//! fields of `--training-args` ([`SftConfig`]) decide the preparation, packing, eval and
//! order; [`SftData::open`] prepares the data (or reads it back from its token cache); the
//! trainer reads it through [`source::SftSource`] with the Trainer's loss normalisation
//! (the token count of the whole step) and, without a `scheduler` block in the DeepSpeed
//! config, the Trainer's own `lr_scheduler_type`.

mod eval;
mod files;
mod recorded;
mod source;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::ValueEnum;
use dsplan_executor::data::SharedLabelled;
use dsplan_executor::train::{DataChoice, LossNormalisation, TrainSettings, TrainerSchedule};
use dsplan_planner::resolve::TrainingArgs;
use dsplan_sft::dataset::FileKind;
use dsplan_sft::{
    BatchLayout, CacheDir, CacheUse, DatasetOptions, EvalData, HeldOut, OnBadRow, SftData,
    SftSettings, Shape, ShapeChoice,
};
use serde_json::Value;

pub(super) use files::copy_tokenizer;
use source::SftSource;

use super::{Failure, RunArgs};
use crate::cli::sft_config::{LrScheduler, SftConfig};
use crate::render;

/// `--dataset-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum DatasetFormat {
    /// From the first record's fields.
    Auto,
    /// `{"text": ...}` (or `dataset_text_field`).
    Text,
    /// `{"prompt": ..., "completion": ...}`.
    PromptCompletion,
    /// `{"messages": [{"role": ..., "content": ...}, ...]}`.
    Messages,
}

/// `--on-bad-row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(super) enum BadRowChoice {
    /// Stop with the file and line of the first bad row.
    Stop,
    /// Leave bad rows out and count them.
    Skip,
}

/// Whether `--data` names fine-tuning data (a dataset file or a directory of shards, or
/// recorded micro-batches).
pub(super) fn is_sft_data(path: &Path) -> bool {
    FileKind::is_dataset(path) || recorded::is_recorded(path)
}

/// The `SFTConfig` side of `--training-args` (TRL's defaults without a file).
pub(super) fn read_config(args: &RunArgs) -> Result<SftConfig, Failure> {
    let Some(path) = args.training.training_args_file() else {
        return SftConfig::from_json(&serde_json::Map::new())
            .map_err(|p| Failure::input(p.join("; ")));
    };
    let shown = render::escape_controls(&path.display().to_string()).into_owned();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("--training-args {shown}: {e}")))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Failure::input(format!("{shown} is not JSON: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(Failure::input(format!(
            "{shown}: training arguments must be a JSON object"
        )));
    };
    SftConfig::from_json(object)
        .map_err(|problems| Failure::input(format!("{shown}: {}", problems.join("; "))))
}

/// A fine-tuning run's data and what it decided.
pub(super) struct SftJob {
    /// The prepared data (none for recorded micro-batches).
    pub data: Option<Arc<SftData>>,
    /// The `SFTConfig` fields.
    pub config: SftConfig,
    /// The run's data, as the trainer reads it.
    pub choice: DataChoice,
    /// Predicted positions of the longest micro-batch.
    pub seq_len: usize,
    /// Optimizer steps.
    pub steps: u64,
}

impl SftJob {
    /// Prepares `--data` (and `--eval-data`) for a run batched as `settings` says on `world`
    /// ranks, for `steps` steps or, when not known, `num_train_epochs` epochs.
    pub fn open(
        args: &RunArgs,
        config: SftConfig,
        settings: &TrainSettings,
        world: usize,
        steps: Option<u64>,
    ) -> Result<Self, Failure> {
        let Some(train) = &args.data else {
            return Err(Failure::usage("fine-tuning needs --data"));
        };
        if recorded::is_recorded(train) {
            return Self::recorded(args, train, config, world, steps);
        }
        let tokenizer_dir = tokenizer_dir(args)?;
        let layout = BatchLayout {
            batch_size: settings.batch.micro_batch,
            grad_accum: settings.batch.grad_accum,
            world_size: world,
        };
        let sft = SftSettings {
            tokenizer_dir,
            train: train.clone(),
            eval: eval_data(args)?,
            dataset: DatasetOptions {
                shape: match args.dataset_format {
                    DatasetFormat::Auto => ShapeChoice::Detect,
                    DatasetFormat::Text => ShapeChoice::Forced(Shape::Text),
                    DatasetFormat::PromptCompletion => ShapeChoice::Forced(Shape::PromptCompletion),
                    DatasetFormat::Messages => ShapeChoice::Forced(Shape::Messages),
                },
                text_field: config.text_field.clone(),
                on_bad_row: match args.on_bad_row {
                    BadRowChoice::Stop => OnBadRow::Stop,
                    BadRowChoice::Skip => OnBadRow::Skip,
                },
            },
            prepare: config.prepare,
            layout,
            eval_batch_size: config.eval_batch_size,
            sampling: config.sampling.with_default_seed(args.seed),
            cache: CacheDir::NextToData,
        };
        let started = std::time::Instant::now();
        let data = SftData::open(&sft).map_err(|e| Failure::input(e.to_string()))?;
        report_prepared(&data, started.elapsed().as_secs_f64());
        let steps_per_epoch = data.order.steps_per_epoch() as u64;
        let steps = steps
            .unwrap_or_else(|| (config.epochs * steps_per_epoch as f64).ceil().max(1.0) as u64);
        if let Some(path) = &args.save_batches {
            let files = recorded::save(path, &data, steps, layout.grad_accum, world)?;
            let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            say!(
                "data: wrote the micro-batches of {steps} step(s) to {}",
                render::escape_controls(&files.join(", "))
            );
        }
        let data = Arc::new(data);
        let name = render::escape_controls(&train.display().to_string()).into_owned();
        let evaluation = eval::evaluation(&data, config.eval_batch_size, world, config.eval);
        let source = SftSource::new(Arc::clone(&data), steps, layout, name, evaluation);
        let seq_len = source.shape.seq_len;
        Ok(Self {
            data: Some(data),
            config,
            choice: DataChoice::Labelled(SharedLabelled(Arc::new(source))),
            seq_len,
            steps,
        })
    }

    /// `--data` of recorded micro-batches (`train`), trained as they are.
    fn recorded(
        args: &RunArgs,
        train: &Path,
        config: SftConfig,
        world: usize,
        steps: Option<u64>,
    ) -> Result<Self, Failure> {
        let refused = [
            (args.eval_data.is_some(), "--eval-data"),
            (args.eval_split.is_some(), "--eval-split"),
            (args.save_batches.is_some(), "--save-batches"),
            (args.tokenizer.is_some(), "--tokenizer"),
        ];
        if let Some((_, flag)) = refused.iter().find(|(given, _)| *given) {
            return Err(Failure::usage(format!(
                "{flag} does not apply to --data of recorded micro-batches: they are already \
                 tokenized and collated (eval batches, when recorded, are in the same file)"
            )));
        }
        let (choice, seq_len, steps) = recorded::open(train, world, steps)?;
        Ok(Self {
            data: None,
            config,
            choice,
            seq_len,
            steps,
        })
    }

    /// `settings` as the Trainer runs fine-tuning: the loss divided by the label tokens of the
    /// whole step, gradient checkpointing on unless the file says otherwise (TRL's default; it
    /// does not change the numbers), and, when the config has no `scheduler` block, the
    /// Trainer's `lr_scheduler_type`.
    pub fn settings(
        &self,
        settings: TrainSettings,
        config_has_scheduler: bool,
        training: &TrainingArgs,
    ) -> Result<TrainSettings, Failure> {
        let checkpointing = if training.gradient_checkpointing.is_given() {
            training.gradient_checkpointing.value
        } else {
            true
        };
        let mut settings = settings
            .with_loss_normalisation(LossNormalisation::TokensInStep)
            .with_gradient_checkpointing(checkpointing);
        if config_has_scheduler {
            if self.config.lr_scheduler_given {
                say!(
                    "note: lr_scheduler_type is not used: the DeepSpeed config's scheduler block is (as under the Trainer)"
                );
            }
            return Ok(settings);
        }
        let warmup_steps = training
            .warmup_steps
            .value
            .steps_for(Some(self.steps))
            .unwrap_or(0);
        settings = match self.config.lr_scheduler {
            LrScheduler::Constant => settings
                .with_trainer_schedule(TrainerSchedule::ConstantWithWarmup { warmup_steps: 0 }),
            LrScheduler::ConstantWithWarmup => {
                settings.with_trainer_schedule(TrainerSchedule::ConstantWithWarmup { warmup_steps })
            }
            LrScheduler::Linear | LrScheduler::Other => {
                return Err(Failure::input(
                    "lr_scheduler_type (\"linear\" when not set, the Trainer's default) is not a schedule dsplan runs: set lr_scheduler_type to \"constant_with_warmup\" or \"constant\" in --training-args, or give the DeepSpeed config a scheduler block (WarmupDecayLR is the Trainer's linear schedule)",
                ));
            }
        };
        Ok(settings)
    }

    /// The data as printed.
    pub fn choice_name(&self) -> String {
        match (&self.choice, &self.data) {
            (DataChoice::Labelled(data), Some(prepared)) => format!(
                "{} ({} rows, {:?})",
                data.0.name(),
                prepared.train.rows.len(),
                prepared.train.shape
            ),
            (DataChoice::Recorded { files }, _) => format!(
                "{} (recorded micro-batches, {} step(s))",
                files
                    .iter()
                    .map(|f| render::escape_controls(&f.display().to_string()).into_owned())
                    .collect::<Vec<_>>()
                    .join(", "),
                self.steps
            ),
            _ => String::new(),
        }
    }

    /// The note of the inert `--training-args` fields, if any.
    pub fn inert_note(&self) -> Option<String> {
        (!self.config.inert.is_empty()).then(|| {
            format!(
                "--training-args fields that change nothing here: {}",
                self.config.inert.join(", ")
            )
        })
    }
}

/// `--tokenizer`, or the `--model` directory.
/// The eval set `--eval-data` or `--eval-split` names (clap lets one at most through).
fn eval_data(args: &RunArgs) -> Result<EvalData, Failure> {
    match (&args.eval_data, args.eval_split) {
        (Some(path), _) => Ok(EvalData::File(path.clone())),
        (None, Some(fraction)) => HeldOut::new(fraction)
            .map(EvalData::HeldOut)
            .map_err(|why| Failure::usage(format!("--eval-split {why}; for example 0.05"))),
        (None, None) => Ok(EvalData::None),
    }
}

fn tokenizer_dir(args: &RunArgs) -> Result<PathBuf, Failure> {
    if let Some(dir) = &args.tokenizer {
        return Ok(dir.clone());
    }
    match args.model.as_deref().map(Path::new) {
        Some(dir) if dir.is_dir() => Ok(dir.to_path_buf()),
        _ => Err(Failure::usage(
            "fine-tuning data needs a tokenizer: give --model DIR (a save_pretrained directory with tokenizer.json) or --tokenizer DIR",
        )),
    }
}

/// One line on what was prepared.
fn report_prepared(data: &SftData, seconds: f64) {
    let cache = match &data.train_cache {
        CacheUse::Hit => "read from its token cache".to_string(),
        CacheUse::Written => "prepared and cached".to_string(),
        CacheUse::Replaced(why) => format!("prepared and cached again (the old cache {why})"),
        CacheUse::Off => "prepared".to_string(),
    };
    let skipped = data.train.bad.count;
    let eval = data
        .eval
        .as_ref()
        .map_or(String::new(), |e| format!("; eval {} rows", e.rows.len()));
    say!(
        "data: {} train rows ({:?}) {cache} in {seconds:.2} s{}{eval}",
        data.train.rows.len(),
        data.train.shape,
        if skipped > 0 {
            format!(", {skipped} bad row(s) skipped")
        } else {
            String::new()
        }
    );
}
