//! The sections of a `ds_config.json` a run reads, one function each: `"auto"` detection,
//! precision (with DeepSpeed's loss-scaler default trap), the batch triangle, the optimizer,
//! the scheduler, offload and the gradient accumulation dtype.

use dsplan_planner::config::{AutoOr, DsConfig, DtypeName, OffloadDevice, ZeroStage};
use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::loss_scale::{Fp16ScaleSettings, LossScaleErrorKind, OverflowCheck};
use serde_json::{Map, Value};

use super::{BatchSizes, OptimizerSettings, SettingsError};
use crate::optim::{AdamConfig, BiasCorrection, WeightDecay};
use crate::zero::{Dtype, MixedPrecision};

/// The pointer of the first `"auto"` string in `value`.
pub(super) fn first_auto(value: &Value, at: String) -> Option<String> {
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

pub(super) fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

pub(super) fn enabled(flag: &AutoOr<bool>) -> bool {
    flag.value().copied().unwrap_or(false)
}

/// fp16 / bf16 / fp32, with DeepSpeed's loss-scaler default trap.
pub(super) fn precision(
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
                    LossScaleErrorKind::InvalidSetting { field } => field,
                    _ => "",
                };
                SettingsError::new(format!("/fp16/{field}"), e.message)
            })?;
            Ok(MixedPrecision::Fp16 { scale })
        }
    }
}

/// The batch triangle for `world` ranks.
pub(super) fn batch_sizes(config: &DsConfig, world: usize) -> Result<BatchSizes, SettingsError> {
    let get = |v: &Option<AutoOr<dsplan_planner::config::primitives::PositiveInt>>| {
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
pub(super) fn optimizer(
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
    let number = |v: &Option<AutoOr<f64>>, default: f64| {
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
pub(super) fn schedule(
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
pub(super) fn check_offload(
    config: &DsConfig,
    notices: &mut Vec<String>,
) -> Result<(), SettingsError> {
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
pub(super) fn grad_accum_dtype(config: &DsConfig) -> Result<Option<Dtype>, SettingsError> {
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
