//! The sections of a resolved `ds_config.json` a run reads, one function each: precision (with
//! DeepSpeed's loss-scaler default trap), the batch sizes, the optimizer, the scheduler and
//! offload (NVMe paths checked; `--nvme-path` overrides them).

use dsplan_planner::config::{AutoOr, DsConfig, OffloadDevice, ZeroStage};
use dsplan_planner::plan::{Precision, precision};
use dsplan_planner::resolve::{Provenance, Resolved};
use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::loss_scale::{Fp16ScaleSettings, LossScaleErrorKind, OverflowCheck};
use std::path::Path;

use serde_json::Value;

use super::{BatchSizes, OptimizerSettings, SettingsError};
use crate::optim::{AdamConfig, BiasCorrection, WeightDecay};
use crate::zero::MixedPrecision;

pub(super) fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// Whether the config file itself wrote the value at `pointer` (rather than a default or the
/// Trainer).
fn written(resolved: &Resolved, pointer: &str) -> bool {
    matches!(
        resolved.provenance.get(pointer),
        Some(Provenance::File { .. })
    )
}

/// fp16 / bf16 / fp32, with DeepSpeed's loss-scaler default trap.
pub(super) fn precision(
    resolved: &Resolved,
    stage: ZeroStage,
) -> Result<MixedPrecision, SettingsError> {
    let config = &resolved.typed;
    if config.torch_autocast.enabled {
        return Err(SettingsError::new(
            "/torch_autocast/enabled",
            "torch_autocast is not implemented by dsplan's executor",
        )
        .with_help("use the `bf16` or `fp16` section"));
    }
    // The planner's one precision rule.
    let chosen = precision::precision(config).map_err(|_| {
        SettingsError::new(
            "/fp16/enabled",
            "fp16 and bf16 are both enabled; DeepSpeed refuses this",
        )
    })?;
    match chosen {
        Precision::Fp32 => Ok(MixedPrecision::Fp32),
        Precision::Bf16 => Ok(MixedPrecision::Bf16 {
            overflow: if config.bf16.check_grad_overflow {
                OverflowCheck::SkipStep
            } else {
                OverflowCheck::Ignore
            },
        }),
        Precision::Fp16 => {
            let fp16 = &config.fp16;
            let scaler_keys = [
                "initial_scale_power",
                "loss_scale_window",
                "min_loss_scale",
                "hysteresis",
                "consecutive_hysteresis",
            ];
            let any_written = scaler_keys
                .iter()
                .any(|k| written(resolved, &format!("/fp16/{k}")));
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

/// The batch sizes resolution solved.
pub(super) fn batch_sizes(resolved: &Resolved) -> BatchSizes {
    let batch = resolved.batch;
    BatchSizes {
        micro_batch: to_usize(batch.train_micro_batch_size_per_gpu),
        grad_accum: to_usize(batch.gradient_accumulation_steps),
        train_batch: to_usize(batch.train_batch_size),
    }
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

/// The scheduler resolution built (one of DeepSpeed's five); another is refused.
pub(super) fn schedule(resolved: &Resolved) -> Result<Option<LrSchedule>, SettingsError> {
    if let Some(built) = &resolved.schedule {
        return Ok(Some(built.schedule.clone()));
    }
    match resolved.typed.scheduler.as_ref().and_then(|s| s.kind.clone()) {
        None => Ok(None),
        Some(kind) => Err(SettingsError::new(
            "/scheduler/type",
            format!("scheduler `{kind}` is not implemented by dsplan's executor"),
        )
        .with_help("the executor steps DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle and LRRangeTest")),
    }
}

/// Offload to CPU changes nothing on the CPU backend. Offload to NVMe (stage 3; the planner
/// treats it as `cpu` below) puts the optimizer state and parameter slices in files under
/// `nvme_path`, which must be an existing, writable directory (checked here, so that a wrong
/// path is an error before anything runs); partial offload (`ratio` < 1) to NVMe is refused.
pub(super) fn check_offload(
    config: &DsConfig,
    notices: &mut Vec<String>,
) -> Result<(), SettingsError> {
    let zero = &config.zero_optimization;
    let stage3 = config.zero_optimization.stage == ZeroStage::Weights;
    let optimizer = zero.offload_optimizer.as_ref();
    let param = zero.offload_param.as_ref();
    for (device, path, what, section) in [
        (
            optimizer.map(|o| o.device),
            optimizer.and_then(|o| o.nvme_path.as_deref()),
            "optimizer",
            "offload_optimizer",
        ),
        (
            param.map(|o| o.device),
            param.and_then(|o| o.nvme_path.as_deref()),
            "parameter",
            "offload_param",
        ),
    ] {
        match device {
            Some(OffloadDevice::Nvme) if stage3 => {
                let pointer = format!("/zero_optimization/{section}/nvme_path");
                match path {
                    Some(path) => check_nvme_path(Path::new(path), &pointer)?,
                    None => {
                        return Err(SettingsError::new(
                            pointer,
                            format!("{what} offload to nvme needs nvme_path"),
                        ));
                    }
                }
            }
            Some(OffloadDevice::Nvme) if what == "optimizer" => notices.push(
                "optimizer offload to nvme below stage 3 is offload to cpu (as in DeepSpeed); the CPU backend keeps everything in host memory already".to_string(),
            ),
            Some(OffloadDevice::Cpu) => notices.push(format!(
                "{what} offload to cpu: the CPU backend keeps everything in host memory already; the step is the same"
            )),
            _ => {}
        }
    }
    if let Some(offload) = optimizer
        && stage3
        && offload.device == OffloadDevice::Nvme
        && offload.ratio < 1.0
    {
        return Err(SettingsError::new(
            "/zero_optimization/offload_optimizer/ratio",
            "partial optimizer offload (ratio < 1) to NVMe is not implemented by dsplan's executor",
        )
        .with_help("use ratio 1.0, or \"device\": \"cpu\""));
    }
    Ok(())
}

/// `path` must be a directory this process can create files in ([`crate::io::probe_writable`]).
fn check_nvme_path(path: &Path, pointer: &str) -> Result<(), SettingsError> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(SettingsError::new(
                pointer,
                format!("nvme_path `{shown}` is not a directory"),
            ));
        }
        Err(e) => {
            return Err(SettingsError::new(
                pointer,
                format!("nvme_path `{shown}` cannot be used: {e}"),
            )
            .with_help("point nvme_path at an existing directory on a fast local drive (dsplan run --nvme-path DIR overrides it)"));
        }
    }
    crate::io::probe_writable(path).map_err(|e| {
        SettingsError::new(pointer, format!("nvme_path `{shown}` is not writable: {e}"))
            .with_help("the swap files of NVMe offload are written there")
    })
}

/// Points every `nvme_path` of the offload sections that offload to NVMe at `path` (a run's
/// `--nvme-path`); returns whether any did.
pub fn override_nvme_path(config: &mut DsConfig, path: &str) -> bool {
    let zero = &mut config.zero_optimization;
    let mut changed = false;
    if let Some(offload) = zero.offload_optimizer.as_mut()
        && offload.device == OffloadDevice::Nvme
    {
        offload.nvme_path = Some(path.to_string());
        changed = true;
    }
    if let Some(offload) = zero.offload_param.as_mut()
        && offload.device == OffloadDevice::Nvme
    {
        offload.nvme_path = Some(path.to_string());
        changed = true;
    }
    changed
}

/// int8 gradient accumulation is refused (the plan cannot size it either).
pub(super) fn check_grad_accum_dtype(config: &DsConfig) -> Result<(), SettingsError> {
    match config.data_types.grad_accum_dtype {
        Some(dsplan_planner::config::DtypeName::Int8) => Err(SettingsError::new(
            "/data_types/grad_accum_dtype",
            "int8 gradient accumulation is not implemented",
        )),
        _ => Ok(()),
    }
}
