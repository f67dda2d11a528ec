//! [`Training`]: what a run's loop does around the ZeRO engine, read once from the config's
//! sections: the optimizer's hyperparameters, the precision with its loss scaling (DeepSpeed's
//! fp16 default trap included), the gradient-clipping threshold, the learning-rate schedule,
//! printing, and where NVMe offload writes its swap files.
//!
//! [`read`] is the only reader of these sections. dsplan's executors train what it returns and
//! refuse what it refuses (an optimizer other than Adam/AdamW, `torch_autocast`, a scheduler
//! that is not one of DeepSpeed's five, int8 gradient accumulation, partial NVMe offload): its
//! errors name the JSON pointer and the fix. The plan carries the result
//! ([`super::Plan::training`]), so `dsplan plan` prints what `dsplan run` will do.
//!
//! The fp16 trap (deepspeed-facts §5.2): when the `fp16` section writes none of the scaler's
//! keys, DeepSpeed passes no scaler arguments, and the ZeRO optimizers build their own
//! `DynamicLossScaler` with its defaults (2^32, hysteresis 1) rather than the config's
//! documented ones (2^16, hysteresis 2). Whether a key was written is read from the document
//! DeepSpeed receives ([`Sources::document`]), the way DeepSpeed reads it.

use serde::{Serialize, Serializer};
use serde_json::Value;

use super::precision::precision;
use super::settings::Precision;
use crate::config::{AutoOr, DsConfig, DtypeName, OffloadDevice, ZeroStage};
use crate::diagnostics::{Code, Diagnostic};
use crate::schedule::LrSchedule;
use crate::schedule::loss_scale::{Fp16ScaleSettings, LossScaleErrorKind, OverflowCheck};

/// What [`read`] reads: the resolved (or plain) config, the document DeepSpeed receives, and
/// the learning-rate schedule resolution built from it.
#[derive(Debug, Clone, Copy)]
pub struct Sources<'a> {
    /// The typed config (every default materialised).
    pub config: &'a DsConfig,
    /// The document as DeepSpeed receives it (after the Hugging Face Trainer's pass): where
    /// a key is present or absent.
    pub document: &'a Value,
    /// The schedule built from `scheduler` (`None`: no scheduler, or one that is not
    /// DeepSpeed's).
    pub schedule: Option<&'a LrSchedule>,
}

/// How weight decay is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecayRule {
    /// AdamW: `p -= lr·wd·p`, apart from the gradient.
    Decoupled,
    /// Adam with `adam_w_mode: false`: `wd·p` added to the gradient.
    L2,
}

/// Whether Adam divides the moments by `1 - beta^t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BiasCorrectionRule {
    /// `bias_correction: true` (the default).
    Enabled,
    /// `bias_correction: false`.
    Disabled,
}

/// Adam or AdamW as DeepSpeed builds them from `optimizer`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptimizerPolicy {
    /// `optimizer.type` as written.
    pub name: String,
    /// `optimizer.params.lr` (1e-3 when absent), the rate without a scheduler.
    pub lr: f64,
    /// `betas`.
    pub betas: [f64; 2],
    /// `eps`.
    pub eps: f64,
    /// `weight_decay` (torch's AdamW default 0.01 with `torch_adam`, else 0).
    pub weight_decay: f64,
    /// Decoupled unless `adam_w_mode: false` on `Adam`.
    pub decay: DecayRule,
    /// `bias_correction`.
    pub bias_correction: BiasCorrectionRule,
}

/// Where the fp16 scaler's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScalerArgs {
    /// The `fp16` section writes at least one scaler key: its values (with the config's
    /// defaults for the rest).
    Config,
    /// None written, and a ZeRO optimizer: its own `DynamicLossScaler` defaults (2^32,
    /// hysteresis 1).
    ZeroDefaults,
    /// None written, without ZeRO: the config's defaults.
    ConfigDefaults,
}

/// The precision and its loss scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "precision", rename_all = "kebab-case")]
pub enum LossScaling {
    /// fp32: no scaling, no overflow check.
    Fp32,
    /// bf16: loss scale 1.
    Bf16 {
        /// `bf16.check_grad_overflow`.
        #[serde(serialize_with = "overflow_json")]
        overflow: OverflowCheck,
    },
    /// fp16: static or dynamic loss scaling.
    Fp16 {
        /// The scaler's values after DeepSpeed's default rules.
        #[serde(serialize_with = "scale_json")]
        scale: Fp16ScaleSettings,
        /// Where they came from.
        args: ScalerArgs,
    },
}

/// A directory NVMe offload writes swap files to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwapDirectory {
    /// JSON pointer of its `nvme_path`.
    pub pointer: String,
    /// The directory.
    pub path: String,
}

/// Everything a run's loop takes from the config; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Training {
    /// The optimizer.
    pub optimizer: OptimizerPolicy,
    /// Precision and loss scaling.
    pub loss_scaling: LossScaling,
    /// `gradient_clipping` (0: off).
    pub clip_threshold: f64,
    /// The learning-rate schedule (`None`: the optimizer's `lr` throughout).
    #[serde(serialize_with = "schedule_json")]
    pub schedule: Option<LrSchedule>,
    /// `steps_per_print` (DeepSpeed's default 10).
    pub steps_per_print: u64,
    /// `wall_clock_breakdown`.
    pub wall_clock_breakdown: bool,
    /// Directories NVMe offload (stage 3) writes its swap files to; a run checks they are
    /// writable before it starts.
    pub swap_directories: Vec<SwapDirectory>,
    /// What the executor does differently from DeepSpeed without changing the result.
    pub notes: Vec<String>,
}

/// Reads the training sections of `sources`. `Err`: every refusal, each at its JSON pointer.
pub fn read(sources: Sources<'_>) -> Result<Training, Vec<Diagnostic>> {
    let config = sources.config;
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    let loss_scaling = loss_scaling(sources).map_err(|e| errors.push(e)).ok();
    let optimizer = optimizer(config, &mut notes)
        .map_err(|e| errors.push(e))
        .ok();
    let schedule = schedule(sources).map_err(|e| errors.push(e)).ok();
    let swap_directories = offload(config, &mut notes).map_err(|e| errors.push(e)).ok();
    if let Err(e) = grad_accum_dtype(config) {
        errors.push(e);
    }
    match (loss_scaling, optimizer, schedule, swap_directories) {
        (Some(loss_scaling), Some(optimizer), Some(schedule), Some(swap_directories))
            if errors.is_empty() =>
        {
            Ok(Training {
                optimizer,
                loss_scaling,
                clip_threshold: config.gradient_clipping.value().copied().unwrap_or(0.0),
                schedule,
                steps_per_print: config.steps_per_print.map_or(10, |v| v.get()),
                wall_clock_breakdown: config.wall_clock_breakdown,
                swap_directories,
                notes,
            })
        }
        _ => Err(errors),
    }
}

fn refused(pointer: impl Into<String>, message: impl Into<String>) -> Diagnostic {
    Diagnostic::error(Code::IncompatibleSettings, pointer, message)
}

/// Whether `document` holds a key at `pointer`.
fn present(document: &Value, pointer: &str) -> bool {
    document.pointer(pointer).is_some()
}

/// fp16 / bf16 / fp32 by the planner's one precision rule, with DeepSpeed's scaler default trap.
fn loss_scaling(sources: Sources<'_>) -> Result<LossScaling, Diagnostic> {
    let config = sources.config;
    if config.torch_autocast.enabled {
        return Err(refused(
            "/torch_autocast/enabled",
            "torch_autocast is not implemented by dsplan's executor",
        )
        .with_help("use the `bf16` or `fp16` section"));
    }
    let chosen = precision(config).map_err(|_| {
        Diagnostic::error(
            Code::ConflictingPrecision,
            "/fp16/enabled",
            "fp16 and bf16 are both enabled; DeepSpeed refuses this",
        )
    })?;
    match chosen {
        Precision::Fp32 => Ok(LossScaling::Fp32),
        // Without ZeRO, bf16 runs `FP16_Optimizer` (`DDP_BFLOAT16`), which skips a step with
        // a non-finite gradient whatever `check_grad_overflow` says (only ZeRO reads it).
        Precision::Bf16 => Ok(LossScaling::Bf16 {
            overflow: if config.bf16.check_grad_overflow
                || config.zero_optimization.stage == ZeroStage::Disabled
            {
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
                .any(|k| present(sources.document, &format!("/fp16/{k}")));
            let mut scale = Fp16ScaleSettings {
                loss_scale: fp16.loss_scale,
                initial_scale_power: fp16.initial_scale_power.get(),
                loss_scale_window: u64::try_from(fp16.loss_scale_window.get()).unwrap_or(0),
                hysteresis: fp16.hysteresis.get(),
                consecutive_hysteresis: fp16.consecutive_hysteresis,
                min_loss_scale: fp16.min_loss_scale.get() as f64,
            };
            let args = match (any_written, config.zero_optimization.stage) {
                (true, _) => ScalerArgs::Config,
                (false, ZeroStage::Disabled) => ScalerArgs::ConfigDefaults,
                (false, _) => {
                    // The ZeRO optimizers' own DynamicLossScaler defaults (facts §5.2).
                    scale.initial_scale_power = 32;
                    scale.hysteresis = 1;
                    ScalerArgs::ZeroDefaults
                }
            };
            scale.validate().map_err(|e| {
                let field = match e.kind {
                    LossScaleErrorKind::InvalidSetting { field } => field,
                    _ => "",
                };
                Diagnostic::error(Code::OutOfRange, format!("/fp16/{field}"), e.message)
            })?;
            Ok(LossScaling::Fp16 { scale, args })
        }
    }
}

/// Adam / AdamW as DeepSpeed builds them; anything else is refused.
fn optimizer(config: &DsConfig, notes: &mut Vec<String>) -> Result<OptimizerPolicy, Diagnostic> {
    let Some(section) = &config.optimizer else {
        return Err(Diagnostic::error(
            Code::MissingKey,
            "/optimizer",
            "the config names no optimizer; dsplan run builds its optimizer from it",
        )
        .with_help("add \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}"));
    };
    let name = section.kind.clone().unwrap_or_default();
    let lower = name.to_ascii_lowercase();
    if lower != "adam" && lower != "adamw" {
        return Err(refused(
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
    let betas = params
        .betas
        .as_ref()
        .and_then(|b| b.value())
        .copied()
        .unwrap_or([0.9, 0.999]);
    let decoupled = lower == "adamw" || params.adam_w_mode.unwrap_or(true);
    if params.other.get("amsgrad").and_then(Value::as_bool) == Some(true) {
        return Err(refused(
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
        notes.push(format!(
            "optimizer.params {ignored:?} are not used by dsplan's Adam"
        ));
    }
    Ok(OptimizerPolicy {
        name,
        lr: number(&params.lr, 1e-3),
        betas,
        eps: number(&params.eps, 1e-8),
        weight_decay: number(&params.weight_decay, if torch_adamw { 0.01 } else { 0.0 }),
        decay: if decoupled {
            DecayRule::Decoupled
        } else {
            DecayRule::L2
        },
        bias_correction: if params.bias_correction.unwrap_or(true) {
            BiasCorrectionRule::Enabled
        } else {
            BiasCorrectionRule::Disabled
        },
    })
}

/// The schedule resolution built (one of DeepSpeed's five); another scheduler is refused.
fn schedule(sources: Sources<'_>) -> Result<Option<LrSchedule>, Diagnostic> {
    if let Some(built) = sources.schedule {
        return Ok(Some(built.clone()));
    }
    match sources.config.scheduler.as_ref().and_then(|s| s.kind.clone()) {
        None => Ok(None),
        Some(kind) => Err(refused(
            "/scheduler/type",
            format!("scheduler `{kind}` is not implemented by dsplan's executor"),
        )
        .with_help("the executor steps DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle and LRRangeTest")),
    }
}

/// Offload to CPU changes nothing on the CPU backend. Offload to NVMe (stage 3; the planner
/// treats it as `cpu` below) puts the optimizer state and parameter slices in files under
/// `nvme_path`, which the run checks before it starts; partial offload (`ratio` < 1) to NVMe
/// is refused.
fn offload(config: &DsConfig, notes: &mut Vec<String>) -> Result<Vec<SwapDirectory>, Diagnostic> {
    let zero = &config.zero_optimization;
    let stage3 = zero.stage == ZeroStage::Weights;
    let optimizer = zero.offload_optimizer.as_ref();
    let param = zero.offload_param.as_ref();
    let mut directories = Vec::new();
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
                    Some(path) => directories.push(SwapDirectory {
                        pointer,
                        path: path.to_string(),
                    }),
                    None => {
                        return Err(Diagnostic::error(
                            Code::NvmeWithoutPath,
                            pointer,
                            format!("{what} offload to nvme needs nvme_path"),
                        ));
                    }
                }
            }
            Some(OffloadDevice::Nvme) if what == "optimizer" => notes.push(
                "optimizer offload to nvme below stage 3 is offload to cpu (as in DeepSpeed); the CPU backend keeps everything in host memory already".to_string(),
            ),
            Some(OffloadDevice::Cpu) => notes.push(format!(
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
        return Err(refused(
            "/zero_optimization/offload_optimizer/ratio",
            "partial optimizer offload (ratio < 1) to NVMe is not implemented by dsplan's executor",
        )
        .with_help("use ratio 1.0, or \"device\": \"cpu\""));
    }
    Ok(directories)
}

/// int8 gradient accumulation is refused (the plan cannot size it either).
fn grad_accum_dtype(config: &DsConfig) -> Result<(), Diagnostic> {
    match config.data_types.grad_accum_dtype {
        Some(DtypeName::Int8) => Err(refused(
            "/data_types/grad_accum_dtype",
            "int8 gradient accumulation is not implemented",
        )),
        _ => Ok(()),
    }
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

fn overflow_json<S: Serializer>(overflow: &OverflowCheck, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match overflow {
        OverflowCheck::SkipStep => "skip-step",
        OverflowCheck::Ignore => "ignore",
    })
}

fn scale_json<S: Serializer>(scale: &Fp16ScaleSettings, s: S) -> Result<S::Ok, S::Error> {
    serde_json::json!({
        "loss_scale": scale.loss_scale,
        "initial_scale_power": scale.initial_scale_power,
        "loss_scale_window": scale.loss_scale_window,
        "hysteresis": scale.hysteresis,
        "consecutive_hysteresis": scale.consecutive_hysteresis,
        "min_loss_scale": scale.min_loss_scale,
    })
    .serialize(s)
}

fn schedule_json<S: Serializer>(schedule: &Option<LrSchedule>, s: S) -> Result<S::Ok, S::Error> {
    match schedule {
        None => s.serialize_none(),
        Some(schedule) => serde_json::json!({
            "type": schedule.type_name(),
            "lr_at_first_step": schedule.lr_at(0),
        })
        .serialize(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_json(document: &Value) -> Result<Training, Vec<Diagnostic>> {
        let config = crate::config::from_value(document).expect("typed");
        read(Sources {
            config: &config,
            document,
            schedule: None,
        })
    }

    fn fp16(stage: u64, fp16: Value) -> LossScaling {
        let document = json!({"fp16": fp16, "zero_optimization": {"stage": stage},
            "optimizer": {"type": "AdamW"}});
        read_json(&document).expect("read").loss_scaling
    }

    #[test]
    fn the_scaler_takes_zeros_defaults_only_when_no_key_is_written() {
        let LossScaling::Fp16 { scale, args } = fp16(2, json!({"enabled": true})) else {
            panic!("fp16 expected");
        };
        assert_eq!(args, ScalerArgs::ZeroDefaults);
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (32, 1));
        // Without ZeRO, FP16_Optimizer gets the config's defaults.
        let LossScaling::Fp16 { scale, args } = fp16(0, json!({"enabled": true})) else {
            panic!("fp16 expected");
        };
        assert_eq!(args, ScalerArgs::ConfigDefaults);
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (16, 2));
        // A written key, even at its default value, passes the section's values.
        let written = json!({"enabled": true, "initial_scale_power": 16});
        let LossScaling::Fp16 { scale, args } = fp16(3, written) else {
            panic!("fp16 expected");
        };
        assert_eq!(args, ScalerArgs::Config);
        assert_eq!((scale.initial_scale_power, scale.hysteresis), (16, 2));
    }

    #[test]
    fn bf16_without_zero_skips_a_non_finite_step_whatever_check_grad_overflow_says() {
        let bf16 = |stage: u64| {
            let document = json!({"bf16": {"enabled": true, "check_grad_overflow": false},
                "zero_optimization": {"stage": stage}, "optimizer": {"type": "AdamW"}});
            read_json(&document).expect("read").loss_scaling
        };
        // FP16_Optimizer checks every step; ZeRO reads the flag.
        assert_eq!(
            bf16(0),
            LossScaling::Bf16 {
                overflow: OverflowCheck::SkipStep
            }
        );
        assert_eq!(
            bf16(2),
            LossScaling::Bf16 {
                overflow: OverflowCheck::Ignore
            }
        );
    }

    #[test]
    fn what_the_executor_cannot_run_is_refused_at_its_pointer() {
        let cases = [
            (json!({"optimizer": {"type": "Lamb"}}), "/optimizer/type"),
            (json!({}), "/optimizer"),
            (
                json!({"optimizer": {"type": "Adam", "params": {"amsgrad": true}}}),
                "/optimizer/params/amsgrad",
            ),
            (
                json!({"optimizer": {"type": "Adam"}, "scheduler": {"type": "StepLR"}}),
                "/scheduler/type",
            ),
            (
                json!({"optimizer": {"type": "Adam"}, "torch_autocast": {"enabled": true}}),
                "/torch_autocast/enabled",
            ),
            (
                json!({"optimizer": {"type": "Adam"}, "zero_optimization": {"stage": 3,
                    "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "ratio": 0.5}}}),
                "/zero_optimization/offload_optimizer/ratio",
            ),
        ];
        for (document, pointer) in cases {
            let found = read_json(&document).expect_err("refused");
            assert!(
                found.iter().any(|d| d.is_error() && d.pointer == pointer),
                "{pointer}: {found:?}"
            );
        }
    }

    #[test]
    fn nvme_offload_at_stage_three_lists_its_swap_directories() {
        let document = json!({"optimizer": {"type": "AdamW", "params": {"lr": 2e-4}},
            "zero_optimization": {"stage": 3,
                "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
                "offload_param": {"device": "nvme", "nvme_path": "/b"}}});
        let training = read_json(&document).expect("read");
        assert_eq!(
            training.swap_directories,
            vec![
                SwapDirectory {
                    pointer: "/zero_optimization/offload_optimizer/nvme_path".into(),
                    path: "/a".into()
                },
                SwapDirectory {
                    pointer: "/zero_optimization/offload_param/nvme_path".into(),
                    path: "/b".into()
                },
            ]
        );
        assert_eq!(training.optimizer.lr, 2e-4);
        assert_eq!(training.optimizer.decay, DecayRule::Decoupled);
    }
}
