//! [`TrainSettings`]: what a resolved `ds_config.json` ([`dsplan_planner::resolve::resolve`])
//! asks of a training run.
//!
//! Resolution has already filled every `"auto"` as the Hugging Face Trainer would, solved the
//! batch triangle, materialised DeepSpeed's defaults and built the learning-rate schedule; this
//! reads the values the engines need beyond the plan (precision and loss scaling, optimizer,
//! schedule, clipping threshold, printing). What the executor cannot do is an error
//! that says so; what it does differently from DeepSpeed without changing the result is a
//! notice. The `activation_checkpointing` section (and the Trainer's `gradient_checkpointing`)
//! turn on per-layer recomputation ([`checkpointing`]). Sizes, partitions and buckets, the
//! engine that runs, the gradient norm rule and the gradient average come from the plan
//! (`planner::plan::compile` of [`TrainSettings::config`], its `run` policy), not from here.

use std::fmt;

mod checkpointing;
mod ignored;
mod sections;

pub use sections::override_nvme_path;

use dsplan_planner::config::{DsConfig, ZeroStage};
use dsplan_planner::resolve::{Environment, Resolved, resolve};
use dsplan_planner::schedule::LrSchedule;
use serde_json::Value;

use crate::model::Recompute;
use crate::optim::AdamConfig;
use crate::zero::MixedPrecision;
use sections::{
    batch_sizes, check_grad_accum_dtype, check_offload, optimizer, precision, schedule,
};

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

/// The optimizer a config names.
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerSettings {
    /// `optimizer.type` as written.
    pub name: String,
    /// `optimizer.params.lr`.
    pub lr: f64,
    /// Betas, eps, weight decay, decay mode, bias correction.
    pub adam: AdamConfig,
}

/// Everything a run takes from the config. See the [module documentation](self).
#[derive(Debug, Clone)]
pub struct TrainSettings {
    /// The resolved config, which the plan is compiled from.
    pub config: DsConfig,
    /// `zero_optimization.stage` as the config gives it, for reports and checkpoint metadata;
    /// the engines run the plan's stage (`Plan::run`).
    pub stage: ZeroStage,
    /// `fp16` / `bf16`.
    pub precision: MixedPrecision,
    /// Batch sizes for the world size given.
    pub batch: BatchSizes,
    /// `gradient_clipping` (0: off).
    pub gradient_clipping: f64,
    /// `optimizer`.
    pub optimizer: OptimizerSettings,
    /// `scheduler`, if any.
    pub schedule: Option<LrSchedule>,
    /// `steps_per_print` (DeepSpeed's default 10).
    pub steps_per_print: u64,
    /// `wall_clock_breakdown`.
    pub wall_clock_breakdown: bool,
    /// Whether backward recomputes each block's forward (`activation_checkpointing`, or the
    /// Trainer's `gradient_checkpointing`).
    pub recompute: Recompute,
    /// Things done differently from DeepSpeed that do not change the result.
    pub notices: Vec<String>,
}

impl TrainSettings {
    /// The settings of a resolved config.
    pub fn from_resolved(resolved: &Resolved) -> Result<Self, SettingsError> {
        let config = &resolved.typed;
        let mut notices = Vec::new();
        let stage = config.zero_optimization.stage;
        let precision = precision(resolved, stage)?;
        let batch = batch_sizes(resolved);
        let optimizer = optimizer(config, &mut notices)?;
        let schedule = schedule(resolved)?;
        check_offload(config, &mut notices)?;
        check_grad_accum_dtype(config)?;
        let recompute = checkpointing::recompute(
            &resolved.filled,
            &config.activation_checkpointing,
            &mut notices,
        )?;
        notices.extend(ignored::ignored_section_notices(&resolved.filled));
        Ok(Self {
            config: config.clone(),
            stage,
            precision,
            batch,
            gradient_clipping: config.gradient_clipping.value().copied().unwrap_or(0.0),
            optimizer,
            schedule,
            steps_per_print: config.steps_per_print.map_or(10, |v| v.get()),
            wall_clock_breakdown: config.wall_clock_breakdown,
            recompute,
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
            let first = diagnostics.iter().find(|d| d.is_error());
            match first {
                Some(d) => {
                    let error = SettingsError::new(d.pointer.clone(), d.message.clone());
                    match &d.help {
                        Some(help) => error.with_help(help.clone()),
                        None => error,
                    }
                }
                None => SettingsError::new("", "the config could not be resolved"),
            }
        })?;
        Self::from_resolved(&resolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::WeightDecay;
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
        assert_eq!(settings.gradient_clipping, 1.0);
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
        assert_eq!(settings.optimizer.adam.decay, WeightDecay::L2);
        config["optimizer"] = json!({"type": "adam"});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        assert_eq!(settings.optimizer.adam.decay, WeightDecay::Decoupled);
    }

    #[test]
    fn fp16_defaults_follow_deepspeeds_trap() {
        let mut config = base();
        config["fp16"] = json!({"enabled": true});
        config["zero_optimization"] = json!({"stage": 2});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        let MixedPrecision::Fp16 { scale } = settings.precision else {
            panic!("fp16 expected");
        };
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (32, 1));
        config["fp16"] = json!({"enabled": true, "loss_scale_window": 100});
        let settings = TrainSettings::from_config(&config, 1).expect("valid");
        let MixedPrecision::Fp16 { scale } = settings.precision else {
            panic!("fp16 expected");
        };
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (16, 2));
    }
}
