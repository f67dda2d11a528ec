//! [`TrainSettings`]: a resolved `ds_config.json` ([`dsplan_planner::resolve::resolve`]) as
//! a run compiles its plan from it.
//!
//! Resolution has already filled every `"auto"` as the Hugging Face Trainer would, solved the
//! batch triangle, materialised DeepSpeed's defaults and built the learning-rate schedule. The
//! planner reads the training sections once ([`dsplan_planner::plan::training::read`]:
//! optimizer, precision and loss scaling, clipping threshold, schedule, NVMe swap directories)
//! and the plan carries the result (`Plan::training`); the executor converts it into its own
//! types in one place ([`convert`]) and decides none of it. What the executor cannot do is
//! the planner's error, at the config's JSON pointer; this module adds the checks that need
//! the machine (the swap directories exist and are writable) and the sections the planner
//! does not model: `activation_checkpointing` (and the Trainer's `gradient_checkpointing`) turn
//! on per-layer recomputation ([`checkpointing`]), and sections dsplan ignores are notices.
//!
//! `TrainSettings` is a thin view: the resolved config, what the planner read from it, the
//! batch sizes resolution solved and the recomputation, kept together because a run is
//! described (and its settings errors are reported) before the model is chosen and the plan
//! compiled.

use std::fmt;

mod attention;
mod checkpointing;
pub mod convert;
mod ignored;
mod loss;
mod swap_directories;
mod trainer_schedule;

pub use attention::AttentionKernel;
pub use dsplan_planner::plan::training::override_nvme_path;
pub use loss::LossNormalisation;
pub use trainer_schedule::TrainerSchedule;

use dsplan_planner::config::{DsConfig, ZeroStage};
use dsplan_planner::diagnostics::Diagnostic;
use dsplan_planner::plan::Training;
use dsplan_planner::plan::training::{self, Sources};
use dsplan_planner::resolve::{Environment, Resolved, resolve};
use serde_json::Value;

use crate::model::Recompute;
use crate::zero::MixedPrecision;

/// Where a config cannot be run, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsError {
    /// JSON pointer of the offending value (`""` for the document).
    pub pointer: String,
    /// What is wrong.
    pub message: String,
    /// What to do about it.
    pub help: Option<String>,
}

impl SettingsError {
    fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            message: message.into(),
            help: None,
        }
    }

    fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// The first error among the planner's `diagnostics` (`fallback` when there is none).
    fn first_of(diagnostics: &[Diagnostic], fallback: &str) -> Self {
        match diagnostics.iter().find(|d| d.is_error()) {
            Some(d) => {
                let error = SettingsError::new(d.pointer.clone(), d.message.clone());
                match &d.help {
                    Some(help) => error.with_help(help.clone()),
                    None => error,
                }
            }
            None => SettingsError::new("", fallback),
        }
    }
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.pointer.is_empty() {
            write!(f, "{}", self.message)?;
        } else {
            write!(f, "{}: {}", self.pointer, self.message)?;
        }
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

impl std::error::Error for SettingsError {}

/// The batch triangle, completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSizes {
    /// `train_micro_batch_size_per_gpu`.
    pub micro_batch: usize,
    /// `gradient_accumulation_steps`.
    pub grad_accum: usize,
    /// `train_batch_size` = micro × accumulation × world.
    pub train_batch: usize,
}

/// A resolved config as a run uses it. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct TrainSettings {
    /// The resolved config, which the plan is compiled from.
    pub config: DsConfig,
    /// `zero_optimization.stage` as the config gives it, for reports and checkpoint metadata;
    /// the engines run the plan's stage (`Plan::run`).
    pub stage: ZeroStage,
    /// What the planner read from the training sections; the plan compiled from these
    /// settings carries it (`Plan::training`), and the run follows the plan's.
    pub training: Training,
    /// Batch sizes for the world size given.
    pub batch: BatchSizes,
    /// Whether backward recomputes each block's forward (`activation_checkpointing`, or the
    /// Trainer's `gradient_checkpointing`).
    pub recompute: Recompute,
    /// Which CUDA attention kernels the device step launches (the CPU backend ignores it).
    pub attention: AttentionKernel,
    /// How micro-batch losses are normalised (DeepSpeed's micro-batch means unless the job's
    /// data is the Trainer's, see [`TrainSettings::with_loss_normalisation`]).
    pub loss: LossNormalisation,
    /// The Trainer's own learning-rate schedule, for a config without a `scheduler` block.
    pub trainer_schedule: Option<TrainerSchedule>,
    /// Things done differently from DeepSpeed that do not change the result.
    pub notices: Vec<String>,
}

impl TrainSettings {
    /// The settings of a resolved config.
    pub fn from_resolved(resolved: &Resolved) -> Result<Self, SettingsError> {
        let config = &resolved.typed;
        let training = training::read(Sources {
            config,
            document: &resolved.filled,
            schedule: resolved.schedule.as_ref().map(|s| &s.schedule),
        })
        .map_err(|found| SettingsError::first_of(&found, "the config cannot be trained"))?;
        swap_directories::check(&training.swap_directories)?;
        let mut notices = training.notes.clone();
        let recompute = checkpointing::recompute(
            &resolved.filled,
            &config.activation_checkpointing,
            &mut notices,
        )?;
        notices.extend(ignored::ignored_section_notices(&resolved.filled));
        let batch = resolved.batch;
        Ok(Self {
            config: config.clone(),
            stage: config.zero_optimization.stage,
            training,
            batch: BatchSizes {
                micro_batch: to_usize(batch.train_micro_batch_size_per_gpu),
                grad_accum: to_usize(batch.gradient_accumulation_steps),
                train_batch: to_usize(batch.train_batch_size),
            },
            recompute,
            attention: AttentionKernel::Scalar,
            loss: LossNormalisation::MicroBatchMean,
            trainer_schedule: None,
            notices,
        })
    }

    /// The settings with the Hugging Face Trainer's `gradient_checkpointing` (`--gradient-checkpointing`
    /// or the `--training-args` file): when `on`, backward recomputes each block's forward, as
    /// with an `activation_checkpointing` section.
    pub fn with_gradient_checkpointing(mut self, on: bool) -> Self {
        if on && self.recompute == Recompute::Nothing {
            self.recompute = Recompute::EachLayer;
            self.notices.push(
                "activation checkpointing (gradient_checkpointing): forward keeps each block's input; backward recomputes each block's forward before its backward".into(),
            );
        }
        self
    }

    /// The settings with the CUDA attention kernels `attention` (`--attention-kernel`).
    pub fn with_attention_kernel(mut self, attention: AttentionKernel) -> Self {
        self.attention = attention;
        self
    }

    /// The settings with micro-batch losses normalised as `loss` says (the job picks
    /// [`LossNormalisation::TokensInStep`] for SFT batches, as the Trainer normalises them).
    pub fn with_loss_normalisation(mut self, loss: LossNormalisation) -> Self {
        self.loss = loss;
        self
    }

    /// The settings with the Trainer's schedule `schedule` (`lr_scheduler_type`), which a run
    /// follows when its config has no `scheduler` block (a run with both is refused).
    pub fn with_trainer_schedule(mut self, schedule: TrainerSchedule) -> Self {
        self.trainer_schedule = Some(schedule);
        self
    }

    /// The precision the planner read, in the executor's type.
    pub fn precision(&self) -> MixedPrecision {
        convert::mixed_precision(&self.training.loss_scaling)
    }

    /// Resolves `raw` for `world` ranks without training arguments or a hidden size (what a
    /// DeepSpeed script without the Hugging Face Trainer gets: explicit values as written,
    /// DeepSpeed's defaults, the Trainer's `"auto"` rules from `TrainingArguments`' defaults)
    /// and reads the settings. The first error of resolution is the error.
    pub fn from_config(raw: &Value, world: usize) -> Result<Self, SettingsError> {
        let env = Environment {
            world_size: Some(world.max(1) as u64),
            ..Environment::default()
        };
        let resolved = resolve(raw, &env).map_err(|diagnostics| {
            SettingsError::first_of(&diagnostics, "the config could not be resolved")
        })?;
        Self::from_resolved(&resolved)
    }
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsplan_planner::plan::training::DecayRule;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        })
    }

    #[test]
    fn autos_are_filled_as_the_trainer_fills_them() {
        let mut config = base();
        config["gradient_clipping"] = json!("auto");
        config["train_micro_batch_size_per_gpu"] = json!("auto");
        let settings = TrainSettings::from_config(&config, 2).expect("resolved");
        // TrainingArguments' defaults: max_grad_norm 1.0, per_device_train_batch_size 8.
        assert_eq!(settings.training.clip_threshold, 1.0);
        assert_eq!(settings.batch.micro_batch, 8);
        assert_eq!(settings.batch.train_batch, 16);
        // A bucket size "auto" needs the model's hidden size, which is not given here.
        config["zero_optimization"] = json!({"stage": 2, "reduce_bucket_size": "auto"});
        let error = TrainSettings::from_config(&config, 2).expect_err("no hidden size");
        assert_eq!(error.pointer, "/zero_optimization/reduce_bucket_size");
    }

    #[test]
    fn the_batch_triangle_is_completed_and_checked() {
        let config = json!({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "Adam"}});
        let settings = TrainSettings::from_config(&config, 2).expect("valid");
        assert_eq!(settings.batch.grad_accum, 2);
        let bad = json!({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 1, "optimizer": {"type": "Adam"}});
        assert!(TrainSettings::from_config(&bad, 2).is_err());
    }

    #[test]
    fn unimplemented_optimizers_and_nvme_are_errors() {
        let mut config = base();
        config["optimizer"]["type"] = json!("Lamb");
        let error = TrainSettings::from_config(&config, 1).expect_err("lamb");
        assert!(error.message.contains("not implemented"), "{error}");
        let mut config = base();
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("absent");
        config["zero_optimization"] = json!({"stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": missing}});
        let error = TrainSettings::from_config(&config, 1).expect_err("missing nvme_path");
        assert_eq!(error.pointer, "/zero_optimization/offload_param/nvme_path");
        config["zero_optimization"]["offload_param"]["nvme_path"] = json!(dir.path());
        TrainSettings::from_config(&config, 1).expect("an existing directory");
        config["zero_optimization"]["offload_optimizer"] =
            json!({"device": "nvme", "nvme_path": dir.path(), "ratio": 0.5});
        let error = TrainSettings::from_config(&config, 1).expect_err("partial");
        assert_eq!(error.pointer, "/zero_optimization/offload_optimizer/ratio");
        // Below stage 3 NVMe optimizer offload is CPU offload, path or not.
        config["zero_optimization"] = json!({"stage": 2,
            "offload_optimizer": {"device": "nvme", "nvme_path": missing}});
        TrainSettings::from_config(&config, 1).expect("stage 2 treats nvme as cpu");
        assert!(
            std::fs::read_dir(dir.path())
                .expect("listed")
                .next()
                .is_none()
        );
    }

    #[test]
    fn adam_is_decoupled_unless_adam_w_mode_is_false() {
        let mut config = base();
        config["optimizer"] = json!({"type": "Adam", "params": {"adam_w_mode": false}});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        assert_eq!(settings.training.optimizer.decay, DecayRule::L2);
        config["optimizer"] = json!({"type": "adam"});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        assert_eq!(settings.training.optimizer.decay, DecayRule::Decoupled);
    }

    #[test]
    fn fp16_defaults_follow_deepspeeds_trap() {
        let mut config = base();
        config["fp16"] = json!({"enabled": true});
        config["zero_optimization"] = json!({"stage": 2});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        let MixedPrecision::Fp16 { scale } = settings.precision() else {
            panic!("fp16 expected");
        };
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (32, 1));
        config["fp16"] = json!({"enabled": true, "loss_scale_window": 100});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        let MixedPrecision::Fp16 { scale } = settings.precision() else {
            panic!("fp16 expected");
        };
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (16, 2));
    }
}
