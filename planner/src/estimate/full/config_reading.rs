//! Reading a `ds_config.json` into a [`TrainingSetup`] and the micro-batch.
//!
//! Only the keys that change memory are read. A key still `"auto"` (a Hugging Face
//! placeholder) is an error that says what fills it: a flag of this command (`--precision`,
//! `--micro-batch`) or the model's hidden size, which `dsplan resolve` will fill. The batch keys
//! are covered by `--micro-batch`.
//!
//! Activation checkpointing is a model setting, not a DeepSpeed one; a config that has an
//! `activation_checkpointing` section is read as full checkpointing (with `cpu_checkpointing`
//! keeping the checkpoints on the host), unless the caller says otherwise.

use serde_json::Value;
use std::fmt;

use crate::config::{self, AutoOr, DsConfig, OffloadDevice, ZeroStage};
use crate::estimate::{Hardware, ZeroInit};
use crate::memory::states_per_param;
use crate::validate::batch::{self, BatchError, GivenBatch};

use super::rows::Pinning;
use super::setup::{
    CheckpointPlacement, Checkpointing, OffloadOptimizer, OffloadParam, OptimizerModel, Precision,
    TrainingSetup, ZeroSetup,
};

/// Values given on the command line that take precedence over the config.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--precision`.
    pub precision: Option<Precision>,
    /// `--micro-batch`.
    pub micro_batch: Option<u64>,
    /// `--activation-checkpointing`.
    pub checkpointing: Option<Checkpointing>,
    /// `--zero-init`.
    pub zero_init: Option<ZeroInit>,
}

/// What a config says about memory.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigReading {
    /// Precision, optimizer, ZeRO, accumulation.
    pub setup: TrainingSetup,
    /// Sequences per GPU per micro-step.
    pub micro_batch: u64,
    /// Checkpointing.
    pub checkpointing: Checkpointing,
    /// Where checkpoints live.
    pub checkpoint_placement: CheckpointPlacement,
    /// How values were chosen where the config was silent.
    pub notes: Vec<String>,
    /// The document read: the plan is compiled from it (with the batch keys and precision
    /// this reading settled).
    pub document: Value,
}

/// What fills an `"auto"` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoFill {
    /// A flag of this command.
    Flag(&'static str),
    /// The Hugging Face Trainer fills it from the model's hidden size.
    HiddenSize {
        /// The rule, e.g. `hidden_size²`.
        rule: &'static str,
        /// The value for this model, when its hidden size is known.
        value: Option<u64>,
    },
}

/// Why a config cannot be read for an estimate.
#[derive(Debug, Clone, PartialEq)]
pub enum SetupError {
    /// The document is not a DeepSpeed config dsplan can type.
    Invalid(String),
    /// A key the estimate reads is still `"auto"`.
    Auto {
        /// The key.
        pointer: &'static str,
        /// What fills it.
        fill: AutoFill,
    },
    /// fp16 and bf16 are both enabled.
    ConflictingPrecision,
    /// No micro-batch in the config and none given.
    MissingMicroBatch,
    /// The batch keys contradict each other for this world size.
    Batch(String),
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::Invalid(message) => write!(f, "the config cannot be read: {message}"),
            SetupError::Auto {
                pointer,
                fill: AutoFill::Flag(flag),
            } => write!(f, "`{pointer}` is \"auto\": pass {flag} to fill it"),
            SetupError::Auto {
                pointer,
                fill: AutoFill::HiddenSize { rule, value },
            } => {
                write!(
                    f,
                    "`{pointer}` is \"auto\": the Hugging Face Trainer fills it with {rule}"
                )?;
                if let Some(value) = value {
                    write!(f, " = {value} for this model")?;
                }
                write!(f, "; write the number (`dsplan resolve` will fill it)")
            }
            SetupError::ConflictingPrecision => write!(
                f,
                "fp16 and bf16 are both enabled; DeepSpeed refuses that (pass --precision to choose)"
            ),
            SetupError::MissingMicroBatch => write!(
                f,
                "the config gives neither train_micro_batch_size_per_gpu nor train_batch_size: pass --micro-batch"
            ),
            SetupError::Batch(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for SetupError {}

/// Reads `document` for a cluster of `hardware`. `hidden` (the model's width) only improves the
/// messages about `"auto"` bucket sizes.
pub fn read_config(
    document: &Value,
    hardware: Hardware,
    hidden: Option<u64>,
    overrides: &Overrides,
) -> Result<ConfigReading, SetupError> {
    let config = config::from_value(document).map_err(SetupError::Invalid)?;
    let mut notes = Vec::new();
    let precision = precision(document, &config, overrides)?;
    let zero = zero_setup(&config, hidden)?;
    let (micro_batch, accumulation) = batch_sizes(&config, hardware, overrides, &mut notes)?;
    let mut optimizer = optimizer(&config, &mut notes);

    let element = precision.element_bytes();
    let zero_stage = zero.stage != ZeroStage::Disabled;
    let reduced_master = zero_stage
        && ((precision == Precision::Fp16 && config.fp16.fp16_master_weights_and_grads)
            || (precision == Precision::Bf16 && config.bf16.bf16_master_weights_and_grads));
    // 16-bit states need a 16-bit master: bf16 with bf16_optimizer_states, fp16 with CPU
    // Adam's fp32_optimizer_states false (the plan's rule, deepspeed-facts §5.5).
    let fp32_states = config
        .optimizer
        .as_ref()
        .and_then(|o| o.params.fp32_optimizer_states)
        .unwrap_or(true);
    let reduced_states = reduced_master
        && match precision {
            Precision::Bf16 => config.bf16.bf16_optimizer_states,
            _ => !fp32_states,
        };
    if reduced_states {
        optimizer.state_bytes = 2;
    }
    let setup = TrainingSetup {
        precision,
        master_bytes: if reduced_master { 2 } else { 4 },
        grad_bytes: config
            .data_types
            .grad_accum_dtype
            .map_or(element, |dtype| dtype.size_bytes()),
        optimizer_grad_bytes: if reduced_master { 2 } else { 4 },
        optimizer,
        zero,
        gradient_accumulation_steps: accumulation,
        zero_init: overrides.zero_init.unwrap_or(ZeroInit::Enabled),
    };

    let section = document.get("activation_checkpointing").is_some();
    let checkpointing = match overrides.checkpointing {
        Some(chosen) => chosen,
        None if section => {
            notes.push(
                "the config has an activation_checkpointing section: full checkpointing assumed (--activation-checkpointing overrides)"
                    .to_owned(),
            );
            Checkpointing::Full
        }
        None => Checkpointing::None,
    };
    let checkpoint_placement = if config.activation_checkpointing.cpu_checkpointing {
        CheckpointPlacement::Cpu
    } else {
        CheckpointPlacement::Gpu
    };
    Ok(ConfigReading {
        setup,
        micro_batch,
        checkpointing,
        checkpoint_placement,
        notes,
        document: document.clone(),
    })
}

fn precision(
    document: &Value,
    config: &DsConfig,
    overrides: &Overrides,
) -> Result<Precision, SetupError> {
    if let Some(chosen) = overrides.precision {
        return Ok(chosen);
    }
    let bf16 = if document.get("bf16").is_none() {
        config
            .bfloat16
            .as_ref()
            .map_or(AutoOr::Value(false), |legacy| legacy.0.enabled)
    } else {
        config.bf16.enabled
    };
    let auto = |pointer| SetupError::Auto {
        pointer,
        fill: AutoFill::Flag("--precision fp16|bf16|fp32"),
    };
    let fp16 = match config.fp16.enabled {
        AutoOr::Auto => return Err(auto("/fp16/enabled")),
        AutoOr::Value(on) => on,
    };
    let bf16 = match bf16 {
        AutoOr::Auto => return Err(auto("/bf16/enabled")),
        AutoOr::Value(on) => on,
    };
    match (fp16, bf16) {
        (true, true) => Err(SetupError::ConflictingPrecision),
        (true, false) => Ok(Precision::Fp16),
        (false, true) => Ok(Precision::Bf16),
        (false, false) => Ok(Precision::Fp32),
    }
}

fn zero_setup(config: &DsConfig, hidden: Option<u64>) -> Result<ZeroSetup, SetupError> {
    let zero = &config.zero_optimization;
    let square = hidden.map(|h| h.saturating_mul(h));
    let reduce_bucket_size = match &zero.reduce_bucket_size {
        AutoOr::Value(size) => size.get(),
        AutoOr::Auto => {
            return Err(SetupError::Auto {
                pointer: "/zero_optimization/reduce_bucket_size",
                fill: AutoFill::HiddenSize {
                    rule: "hidden_size²",
                    value: square,
                },
            });
        }
    };
    let prefetch_bucket_size = match &zero.prefetch_bucket_size {
        AutoOr::Value(size) => size.get(),
        AutoOr::Auto => {
            return Err(SetupError::Auto {
                pointer: "/zero_optimization/stage3_prefetch_bucket_size",
                fill: AutoFill::HiddenSize {
                    rule: "int(0.9 × hidden_size²)",
                    value: square.map(|sq| (sq as f64 * 0.9) as u64),
                },
            });
        }
    };
    let param_persistence_threshold = match &zero.param_persistence_threshold {
        AutoOr::Value(size) => size.get(),
        AutoOr::Auto => {
            return Err(SetupError::Auto {
                pointer: "/zero_optimization/stage3_param_persistence_threshold",
                fill: AutoFill::HiddenSize {
                    rule: "10 × hidden_size",
                    value: hidden.map(|h| h.saturating_mul(10)),
                },
            });
        }
    };
    let mut setup = ZeroSetup::defaults(zero.stage);
    let optimizer_section = zero.offload_optimizer.clone().unwrap_or_default();
    let optimizer_device = if zero.cpu_offload == Some(true) {
        OffloadDevice::Cpu
    } else {
        optimizer_section.device
    };
    let param_section = zero.offload_param.clone().unwrap_or_default();
    let param_device = if zero.cpu_offload_param == Some(true) {
        OffloadDevice::Cpu
    } else {
        param_section.device
    };
    setup.contiguous_gradients = zero.contiguous_gradients;
    setup.overlap_comm = zero.overlap_comm_resolved();
    setup.reduce_bucket_size = reduce_bucket_size;
    setup.allgather_bucket_size = zero.allgather_bucket_size.get();
    setup.prefetch_bucket_size = prefetch_bucket_size;
    setup.max_live_parameters = zero.max_live_parameters.get();
    setup.param_persistence_threshold = param_persistence_threshold;
    setup.model_persistence_threshold = zero.model_persistence_threshold.map(|t| t.get());
    setup.sub_group_size = zero.sub_group_size.get();
    setup.offload_optimizer = OffloadOptimizer {
        device: if zero.stage == ZeroStage::Disabled {
            OffloadDevice::None
        } else {
            optimizer_device
        },
        ratio: if zero.stage == ZeroStage::Weights {
            optimizer_section.ratio.clamp(0.0, 1.0)
        } else {
            1.0
        },
        pinning: Pinning::from_flag(optimizer_section.pin_memory),
        buffer_count: optimizer_section.buffer_count.get(),
    };
    setup.offload_param = OffloadParam {
        device: param_device,
        pinning: Pinning::from_flag(param_section.pin_memory),
        buffer_count: param_section.buffer_count.get(),
        buffer_size: param_section.buffer_size.get(),
        max_in_cpu: param_section.max_in_cpu.get(),
    };
    Ok(setup)
}

fn concrete(value: &Option<AutoOr<config::primitives::PositiveInt>>) -> Option<u64> {
    value.as_ref().and_then(AutoOr::value).map(|v| v.get())
}

fn batch_sizes(
    config: &DsConfig,
    hardware: Hardware,
    overrides: &Overrides,
    notes: &mut Vec<String>,
) -> Result<(u64, u64), SetupError> {
    let world = hardware.total_gpus();
    let train = concrete(&config.train_batch_size);
    let micro = concrete(&config.train_micro_batch_size_per_gpu);
    let accumulation = concrete(&config.gradient_accumulation_steps);
    let any_auto = [
        &config.train_batch_size,
        &config.train_micro_batch_size_per_gpu,
        &config.gradient_accumulation_steps,
    ]
    .iter()
    .any(|key| key.as_ref().is_some_and(AutoOr::is_auto));

    if let Some(micro_batch) = overrides.micro_batch {
        let steps = match (accumulation, train) {
            (Some(steps), _) => steps,
            (None, Some(train)) => (train / micro_batch.saturating_mul(world).max(1)).max(1),
            (None, None) => {
                notes.push("gradient_accumulation_steps taken as 1".to_owned());
                1
            }
        };
        return Ok((micro_batch, steps));
    }
    if any_auto && micro.is_none() {
        return Err(SetupError::Auto {
            pointer: "/train_micro_batch_size_per_gpu",
            fill: AutoFill::Flag("--micro-batch"),
        });
    }
    let given = GivenBatch {
        train: train.map(i128::from),
        micro: micro.map(i128::from),
        accumulation: accumulation.map(i128::from),
    };
    if let (Some(micro), true) = (micro, any_auto) {
        return Ok((micro, accumulation.unwrap_or(1)));
    }
    match batch::derive(given, i128::from(world)) {
        Ok(solved) => {
            let micro = u64::try_from(solved.micro).unwrap_or(1);
            let steps = u64::try_from(solved.accumulation).unwrap_or(1);
            Ok((micro, steps))
        }
        Err(BatchError::Missing) => Err(SetupError::MissingMicroBatch),
        Err(BatchError::NotPositive { message, .. }) => Err(SetupError::Batch(message)),
        Err(BatchError::Mismatch(solved)) => Err(SetupError::Batch(format!(
            "train_batch_size {} is not train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} GPUs",
            solved.train, solved.micro, solved.accumulation, solved.world_size
        ))),
    }
}

/// The optimizer's per-parameter states, by name ([`crate::memory::states_per_param`], the
/// plan's rule).
fn optimizer(config: &DsConfig, notes: &mut Vec<String>) -> OptimizerModel {
    let Some(section) = &config.optimizer else {
        notes.push(
            "no optimizer section (the script brings its own): AdamW with fp32 states assumed"
                .to_owned(),
        );
        return OptimizerModel::adamw();
    };
    let name = section.kind.clone().unwrap_or_else(|| "Adam".to_owned());
    let states = states_per_param(&name, &section.params.other).unwrap_or_else(|| {
        notes.push(format!(
            "optimizer `{name}` is not modelled: 2 fp32 states per parameter assumed"
        ));
        2
    });
    OptimizerModel {
        name,
        states_per_param: states,
        state_bytes: 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(document: Value, overrides: Overrides) -> Result<ConfigReading, SetupError> {
        read_config(
            &document,
            Hardware::new(8, 1).expect("valid"),
            Some(4096),
            &overrides,
        )
    }

    #[test]
    fn auto_keys_name_what_fills_them() {
        let error = read(
            json!({"bf16": {"enabled": "auto"}, "train_micro_batch_size_per_gpu": 1}),
            Overrides::default(),
        )
        .expect_err("auto precision");
        assert!(error.to_string().contains("--precision"), "{error}");
        let error = read(
            json!({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}),
            Overrides::default(),
        )
        .expect_err("auto bucket");
        assert!(error.to_string().contains("16777216"), "{error}");
        let error = read(
            json!({"train_micro_batch_size_per_gpu": "auto"}),
            Overrides::default(),
        )
        .expect_err("auto micro-batch");
        assert!(error.to_string().contains("--micro-batch"), "{error}");
        // --micro-batch covers the batch keys; --precision the precision.
        let reading = read(
            json!({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "bf16": {"enabled": "auto"}}),
            Overrides {
                precision: Some(Precision::Bf16),
                micro_batch: Some(4),
                ..Overrides::default()
            },
        )
        .expect("covered");
        assert_eq!(reading.micro_batch, 4);
        assert_eq!(reading.setup.precision, Precision::Bf16);
    }

    #[test]
    fn batch_triangle_gives_the_micro_batch() {
        let reading = read(
            json!({"train_batch_size": 256, "gradient_accumulation_steps": 4, "fp16": {"enabled": true}}),
            Overrides::default(),
        )
        .expect("derived");
        assert_eq!(
            (
                reading.micro_batch,
                reading.setup.gradient_accumulation_steps
            ),
            (8, 4)
        );
        assert_eq!(reading.setup.precision, Precision::Fp16);
        let error = read(json!({}), Overrides::default()).expect_err("no batch");
        assert_eq!(error, SetupError::MissingMicroBatch);
    }

    #[test]
    fn offload_and_checkpointing_are_read() {
        let reading = read(
            json!({
                "train_micro_batch_size_per_gpu": 2,
                "bf16": {"enabled": true},
                "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5},
                                       "offload_param": {"device": "nvme", "nvme_path": "/nvme"}},
                "activation_checkpointing": {"cpu_checkpointing": true},
                "optimizer": {"type": "Lion"}
            }),
            Overrides::default(),
        )
        .expect("reads");
        let zero = reading.setup.zero;
        assert_eq!(zero.offload_optimizer.device, OffloadDevice::Cpu);
        assert_eq!(zero.offload_optimizer.ratio, 0.5);
        assert_eq!(zero.offload_param.device, OffloadDevice::Nvme);
        assert!(zero.overlap_comm, "stage 3 overlaps by default");
        assert_eq!(reading.checkpointing, Checkpointing::Full);
        assert_eq!(reading.checkpoint_placement, CheckpointPlacement::Cpu);
        assert_eq!(reading.setup.optimizer.states_per_param, 1);
    }

    #[test]
    fn both_precisions_are_refused() {
        let error = read(
            json!({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true}, "bf16": {"enabled": true}}),
            Overrides::default(),
        )
        .expect_err("conflict");
        assert_eq!(error, SetupError::ConflictingPrecision);
    }
}
