//! [`TrainSettings`]: what a `ds_config.json` asks of a training run, read from the typed
//! config ([`dsplan_planner::config::from_value`]).
//!
//! Until `planner::resolve` is wired in, this reads the values directly: `"auto"` anywhere is
//! an error ("run `dsplan resolve` first"), defaults are DeepSpeed's, and the batch triangle
//! (`train_batch_size = micro_batch × gradient_accumulation_steps × world`) is completed and
//! checked here. What the executor cannot do is an error that says so; what it does
//! differently from DeepSpeed without changing the result is a notice.

use std::fmt;

mod sections;

use dsplan_planner::config::{CommDataType, ZeroStage, from_value};
use dsplan_planner::schedule::LrSchedule;
use serde_json::Value;

use crate::optim::AdamConfig;
use crate::zero::{Dtype, GradScaling, MixedPrecision};
use sections::{
    batch_sizes, check_offload, first_auto, grad_accum_dtype, optimizer, precision, schedule,
    to_usize,
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
    /// `zero_optimization.stage`.
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
    /// `zero_optimization.reduce_bucket_size`.
    pub reduce_bucket_size: usize,
    /// `zero_optimization.allgather_bucket_size`.
    pub allgather_bucket_size: usize,
    /// Where the gradient average divides by the world size.
    pub scaling: GradScaling,
    /// `communication_data_type`, when set.
    pub communication_dtype: Option<Dtype>,
    /// `data_types.grad_accum_dtype`, when set.
    pub grad_accum_dtype: Option<Dtype>,
    /// `stage3_param_persistence_threshold`.
    pub param_persistence_threshold: u64,
    /// `stage3_model_persistence_threshold` (unlimited when absent).
    pub model_persistence_threshold: u64,
    /// `steps_per_print` (DeepSpeed's default 10).
    pub steps_per_print: u64,
    /// `wall_clock_breakdown`.
    pub wall_clock_breakdown: bool,
    /// Things done differently from DeepSpeed that do not change the result.
    pub notices: Vec<String>,
}

impl TrainSettings {
    /// Reads a parsed `ds_config.json` for a run on `world` ranks.
    pub fn from_config(raw: &Value, world: usize) -> Result<Self, SettingsError> {
        if let Some(pointer) = first_auto(raw, String::new()) {
            return Err(SettingsError::new(
                pointer,
                "is \"auto\", which the Hugging Face Trainer fills in",
            )
            .with_help("run `dsplan resolve` first and train with the resolved config"));
        }
        let config = from_value(raw).map_err(|message| SettingsError::new("", message))?;
        let mut notices = Vec::new();
        let stage = config.zero_optimization.stage;
        let precision = precision(raw, &config, stage)?;
        let batch = batch_sizes(&config, world)?;
        let optimizer = optimizer(&config, &mut notices)?;
        let schedule = schedule(raw, &config, optimizer.lr, &mut notices)?;
        check_offload(&config, &mut notices)?;
        let zero = &config.zero_optimization;
        let factor = config.gradient_predivide_factor as f32;
        let post = if config.prescale_gradients {
            GradScaling::PreDivide
        } else {
            GradScaling::PostMultiply { factor }
        };
        let scaling = match stage {
            ZeroStage::Disabled => post,
            ZeroStage::OptimizerStates | ZeroStage::Gradients if !zero.reduce_scatter => post,
            _ => GradScaling::PreDivide,
        };
        Ok(Self {
            stage,
            precision,
            batch,
            gradient_clipping: config.gradient_clipping.value().copied().unwrap_or(0.0),
            optimizer,
            schedule,
            reduce_bucket_size: zero
                .reduce_bucket_size
                .value()
                .map_or(500_000_000, |v| to_usize(v.get())),
            allgather_bucket_size: to_usize(zero.allgather_bucket_size.get()).max(1),
            scaling,
            communication_dtype: config.communication_data_type.map(|c| match c {
                CommDataType::Fp32 => Dtype::F32,
                CommDataType::Fp16 => Dtype::F16,
                CommDataType::Bf16 => Dtype::Bf16,
            }),
            grad_accum_dtype: grad_accum_dtype(&config)?,
            param_persistence_threshold: zero
                .param_persistence_threshold
                .value()
                .map_or(100_000, |v| v.get()),
            model_persistence_threshold: zero
                .model_persistence_threshold
                .map_or(u64::MAX, |v| v.get()),
            steps_per_print: config.steps_per_print.map_or(10, |v| v.get()),
            wall_clock_breakdown: config.wall_clock_breakdown,
            notices,
        })
    }

    /// The dtype gradients accumulate in: `data_types.grad_accum_dtype`, else the model dtype
    /// under ZeRO and fp32 for bf16 without ZeRO (DeepSpeed's defaults).
    pub fn accum_dtype(&self) -> Dtype {
        let model = self.precision.model_dtype();
        self.grad_accum_dtype.unwrap_or(
            if self.stage == ZeroStage::Disabled && model == Dtype::Bf16 {
                Dtype::F32
            } else {
                model
            },
        )
    }

    /// The dtype reductions run in: `communication_data_type`, else the dtype of what is
    /// reduced (the accumulated gradients at stages 0/1, the model's gradients at 2/3).
    pub fn comm_dtype(&self) -> Dtype {
        self.communication_dtype.unwrap_or(match self.stage {
            ZeroStage::Disabled | ZeroStage::OptimizerStates => self.accum_dtype(),
            ZeroStage::Gradients | ZeroStage::Weights => self.precision.model_dtype(),
        })
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
    fn auto_anywhere_asks_for_resolve() {
        let mut config = base();
        config["gradient_clipping"] = json!("auto");
        let error = TrainSettings::from_config(&config, 2).expect_err("auto");
        assert_eq!(error.pointer, "/gradient_clipping");
        assert!(error.to_string().contains("dsplan resolve"));
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
        config["zero_optimization"] =
            json!({"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}});
        assert!(TrainSettings::from_config(&config, 1).is_err());
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
