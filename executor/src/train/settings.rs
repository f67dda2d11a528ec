//! [`TrainSettings`]: what a `ds_config.json` asks of a training run, read from the typed
//! config ([`dsplan_planner::config::from_value`]).
//!
//! Until `planner::resolve` is wired in, this reads the values directly: `"auto"` anywhere is
//! an error ("run `dsplan resolve` first"), defaults are DeepSpeed's, and the batch triangle
//! (`train_batch_size = micro_batch × gradient_accumulation_steps × world`) is completed and
//! checked here. What the executor cannot do is an error that says so; what it does
//! differently from DeepSpeed without changing the result is a notice.

use std::fmt;

use dsplan_planner::config::{
    CommDataType, DsConfig, DtypeName, OffloadDevice, ZeroStage, from_value,
};
use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::loss_scale::{Fp16ScaleSettings, OverflowCheck};
use serde_json::{Map, Value};

use crate::optim::{AdamConfig, BiasCorrection, WeightDecay};
use crate::zero::{Dtype, GradScaling, MixedPrecision};

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

/// The pointer of the first `"auto"` string in `value`.
fn first_auto(value: &Value, at: String) -> Option<String> {
    match value {
        Value::String(s) if s == "auto" => Some(at),
        Value::Object(map) => map.iter().find_map(|(key, v)| {
            let escaped = key.replace('~', "~0").replace('/', "~1");
            first_auto(v, format!("{at}/{escaped}"))
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(i, v)| first_auto(v, format!("{at}/{i}"))),
        _ => None,
    }
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

fn enabled(flag: &dsplan_planner::config::AutoOr<bool>) -> bool {
    flag.value().copied().unwrap_or(false)
}

/// fp16 / bf16 / fp32, with DeepSpeed's loss-scaler default trap.
fn precision(
    raw: &Value,
    config: &DsConfig,
    stage: ZeroStage,
) -> Result<MixedPrecision, SettingsError> {
    let bf16 = if raw.get("bf16").is_some() {
        enabled(&config.bf16.enabled)
    } else {
        config
            .bfloat16
            .as_ref()
            .is_some_and(|legacy| enabled(&legacy.0.enabled))
    };
    let fp16 = enabled(&config.fp16.enabled);
    if config.torch_autocast.enabled {
        return Err(SettingsError::new(
            "/torch_autocast/enabled",
            "torch_autocast is not implemented by dsplan's executor",
        )
        .with_help("use the `bf16` or `fp16` section"));
    }
    match (fp16, bf16) {
        (true, true) => Err(SettingsError::new(
            "/fp16/enabled",
            "fp16 and bf16 are both enabled; DeepSpeed refuses this",
        )),
        (false, false) => Ok(MixedPrecision::Fp32),
        (false, true) => {
            let section = if raw.get("bf16").is_some() {
                &config.bf16
            } else {
                config.bfloat16.as_ref().map_or(&config.bf16, |l| &l.0)
            };
            Ok(MixedPrecision::Bf16 {
                overflow: if section.check_grad_overflow {
                    OverflowCheck::SkipStep
                } else {
                    OverflowCheck::Ignore
                },
            })
        }
        (true, false) => {
            let fp16 = &config.fp16;
            let written = raw.get("fp16").and_then(Value::as_object);
            let scaler_keys = [
                "initial_scale_power",
                "loss_scale_window",
                "min_loss_scale",
                "hysteresis",
                "consecutive_hysteresis",
            ];
            let any_written =
                written.is_some_and(|w| scaler_keys.iter().any(|k| w.contains_key(*k)));
            let mut scale = Fp16ScaleSettings {
                loss_scale: fp16.loss_scale,
                initial_scale_power: fp16.initial_scale_power.get(),
                loss_scale_window: u64::try_from(fp16.loss_scale_window.get()).unwrap_or(0),
                hysteresis: fp16.hysteresis.get(),
                consecutive_hysteresis: fp16.consecutive_hysteresis,
                min_loss_scale: fp16.min_loss_scale.get() as f64,
            };
            if !any_written && stage != ZeroStage::Disabled {
                // The ZeRO optimizers' own DynamicLossScaler defaults (facts §5.2).
                scale.initial_scale_power = 32;
                scale.hysteresis = 1;
            }
            scale.validate().map_err(|e| {
                let field = match e.kind {
                    dsplan_planner::schedule::loss_scale::LossScaleErrorKind::InvalidSetting {
                        field,
                    } => field,
                    _ => "",
                };
                SettingsError::new(format!("/fp16/{field}"), e.message)
            })?;
            Ok(MixedPrecision::Fp16 { scale })
        }
    }
}

/// The batch triangle for `world` ranks.
fn batch_sizes(config: &DsConfig, world: usize) -> Result<BatchSizes, SettingsError> {
    let get = |v: &Option<
        dsplan_planner::config::AutoOr<dsplan_planner::config::primitives::PositiveInt>,
    >| {
        v.as_ref()
            .and_then(|a| a.value())
            .map(|p| to_usize(p.get()))
    };
    let (train, micro, accum) = (
        get(&config.train_batch_size),
        get(&config.train_micro_batch_size_per_gpu),
        get(&config.gradient_accumulation_steps),
    );
    let world = world.max(1);
    let divide = |total: usize, by: usize, what: &str| -> Result<usize, SettingsError> {
        if by > 0 && total.is_multiple_of(by) && total / by > 0 {
            Ok(total / by)
        } else {
            Err(SettingsError::new(
                "/train_batch_size",
                format!("train_batch_size {total} is not a multiple of {what} ({by})"),
            ))
        }
    };
    let (micro, accum) = match (train, micro, accum) {
        (Some(t), Some(m), Some(g)) => {
            if t != m * g * world {
                return Err(SettingsError::new(
                    "/train_batch_size",
                    format!(
                        "train_batch_size {t} != micro batch {m} * gradient accumulation {g} * world size {world}"
                    ),
                )
                .with_help("DeepSpeed asserts train_batch_size == micro * accumulation * world"));
            }
            (m, g)
        }
        (Some(t), Some(m), None) => (m, divide(t, m * world, "micro batch × world size")?),
        (Some(t), None, Some(g)) => (divide(t, g * world, "accumulation × world size")?, g),
        (Some(t), None, None) => (divide(t, world, "the world size")?, 1),
        (None, Some(m), g) => (m, g.unwrap_or(1)),
        (None, None, _) => {
            return Err(SettingsError::new(
                "/train_micro_batch_size_per_gpu",
                "the config sets neither train_batch_size nor train_micro_batch_size_per_gpu",
            )
            .with_help("DeepSpeed needs at least one of them"));
        }
    };
    Ok(BatchSizes {
        micro_batch: micro,
        grad_accum: accum,
        train_batch: micro * accum * world,
    })
}

/// Adam / AdamW as DeepSpeed builds them; anything else is refused.
fn optimizer(
    config: &DsConfig,
    notices: &mut Vec<String>,
) -> Result<OptimizerSettings, SettingsError> {
    let Some(section) = &config.optimizer else {
        return Err(SettingsError::new(
            "/optimizer",
            "the config names no optimizer; dsplan run builds its optimizer from it",
        )
        .with_help("add \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}"));
    };
    let name = section.kind.clone().unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    if lower != "adam" && lower != "adamw" {
        return Err(SettingsError::new(
            "/optimizer/type",
            format!("optimizer `{name}` is not implemented by dsplan's executor"),
        )
        .with_help("the executor implements Adam and AdamW (DeepSpeed's and torch's)"));
    }
    let params = &section.params;
    let number = |v: &Option<dsplan_planner::config::AutoOr<f64>>, default: f64| {
        v.as_ref()
            .and_then(|a| a.value())
            .copied()
            .unwrap_or(default)
    };
    let torch_adamw = lower == "adamw" && params.torch_adam == Some(true);
    let [beta1, beta2] = params
        .betas
        .as_ref()
        .and_then(|b| b.value())
        .copied()
        .unwrap_or([0.9, 0.999]);
    let decoupled = lower == "adamw" || params.adam_w_mode.unwrap_or(true);
    if params.other.get("amsgrad").and_then(Value::as_bool) == Some(true) {
        return Err(SettingsError::new(
            "/optimizer/params/amsgrad",
            "amsgrad is not implemented by dsplan's executor (nor by DeepSpeed's CPU Adam)",
        ));
    }
    let ignored: Vec<&String> = params
        .other
        .keys()
        .filter(|k| k.as_str() != "amsgrad")
        .collect();
    if !ignored.is_empty() {
        notices.push(format!(
            "optimizer.params {ignored:?} are not used by dsplan's Adam"
        ));
    }
    Ok(OptimizerSettings {
        name,
        lr: number(&params.lr, 1e-3),
        adam: AdamConfig {
            beta1,
            beta2,
            eps: number(&params.eps, 1e-8),
            weight_decay: number(&params.weight_decay, if torch_adamw { 0.01 } else { 0.0 }),
            decay: if decoupled {
                WeightDecay::Decoupled
            } else {
                WeightDecay::L2
            },
            bias_correction: if params.bias_correction.unwrap_or(true) {
                BiasCorrection::Enabled
            } else {
                BiasCorrection::Disabled
            },
        },
    })
}

/// The scheduler, built by `planner::schedule` from the raw parameters.
fn schedule(
    raw: &Value,
    config: &DsConfig,
    lr: f64,
    notices: &mut Vec<String>,
) -> Result<Option<LrSchedule>, SettingsError> {
    let Some(kind) = config.scheduler.as_ref().and_then(|s| s.kind.clone()) else {
        return Ok(None);
    };
    let empty = Map::new();
    let params = raw
        .pointer("/scheduler/params")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let (schedule, warnings) = LrSchedule::from_params(&kind, params, lr).map_err(|error| {
        let pointer = match &error.param {
            Some(param) => format!("/scheduler/params/{param}"),
            None => "/scheduler/type".to_string(),
        };
        let e = SettingsError::new(pointer, error.message.clone());
        match &error.suggestion {
            Some(best) => e.with_help(format!("did you mean `{best}`?")),
            None => e,
        }
    })?;
    notices.extend(warnings.iter().map(|w| format!("scheduler: {}", w.message)));
    Ok(Some(schedule))
}

/// Offload to CPU changes nothing on the CPU backend; to NVMe is not implemented.
fn check_offload(config: &DsConfig, notices: &mut Vec<String>) -> Result<(), SettingsError> {
    let zero = &config.zero_optimization;
    let optimizer = zero.offload_optimizer.as_ref().map(|o| o.device);
    let param = zero.offload_param.as_ref().map(|o| o.device);
    for (device, pointer, what) in [
        (
            optimizer,
            "/zero_optimization/offload_optimizer/device",
            "optimizer",
        ),
        (
            param,
            "/zero_optimization/offload_param/device",
            "parameter",
        ),
    ] {
        match device {
            Some(OffloadDevice::Nvme) => {
                return Err(SettingsError::new(
                    pointer,
                    format!("{what} offload to NVMe is not implemented by dsplan's executor yet"),
                )
                .with_help("use \"device\": \"cpu\" or \"none\""));
            }
            Some(OffloadDevice::Cpu) => notices.push(format!(
                "{what} offload to cpu: the CPU backend keeps everything in host memory already; the step is the same"
            )),
            _ => {}
        }
    }
    Ok(())
}

/// `data_types.grad_accum_dtype`.
fn grad_accum_dtype(config: &DsConfig) -> Result<Option<Dtype>, SettingsError> {
    Ok(match config.data_types.grad_accum_dtype {
        None => None,
        Some(DtypeName::Fp32) => Some(Dtype::F32),
        Some(DtypeName::Fp16) => Some(Dtype::F16),
        Some(DtypeName::Bf16) => Some(Dtype::Bf16),
        Some(DtypeName::Int8) => {
            return Err(SettingsError::new(
                "/data_types/grad_accum_dtype",
                "int8 gradient accumulation is not implemented",
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
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
