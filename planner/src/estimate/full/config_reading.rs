//! Reading a `ds_config.json` for the full estimate: the config goes through
//! [`crate::resolve::resolve`], as `dsplan run` reads it, and the plan is compiled from the
//! resolved config; the [`TrainingSetup`] the estimate reports is read from it with the plan's
//! own precision rule ([`crate::plan::precision`]).
//!
//! Before resolution, a key that changes memory and is still `"auto"` (a Hugging Face
//! placeholder) is an error that says what fills it: a flag of this command (`--precision`,
//! `--micro-batch`) or the model's hidden size, which `dsplan resolve` will fill. The flags are
//! written into the document (they fill or override the precision and the batch keys), and
//! every other `"auto"` (learning rate, betas, clipping, ...) and the scheduler section are
//! dropped: none of them changes memory, and the command has no training arguments to fill
//! them from.
//!
//! Activation checkpointing is a model setting, not a DeepSpeed one; a config that has an
//! `activation_checkpointing` section is read as full checkpointing (with `cpu_checkpointing`
//! keeping the checkpoints on the host), unless the caller says otherwise.

use serde_json::{Map, Value, json};
use std::fmt;

use crate::config::registry::AUTO_KEYS;
use crate::config::{self, AutoOr, DsConfig, OffloadDevice, ZeroStage};
use crate::diagnostics::Diagnostic;
use crate::estimate::{Topology, ZeroInit};
use crate::memory::states_per_param;
use crate::plan::precision;
use crate::resolve::{self, Environment};

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
    /// The config as resolved (flags written in): the plan is compiled from it.
    pub config: DsConfig,
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
    /// Resolution refuses the config, as DeepSpeed would: its errors.
    Refused(Vec<Diagnostic>),
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
            SetupError::Refused(diagnostics) => {
                write!(f, "the config is refused: {}", super::errors(diagnostics))
            }
        }
    }
}

impl std::error::Error for SetupError {}

/// Reads `document` for a cluster of `hardware`: resolved at its world size, with the flags
/// of `overrides` written in. `hidden` (the model's width) only improves the messages about
/// `"auto"` bucket sizes.
pub fn read_config(
    document: &Value,
    hardware: Topology,
    hidden: Option<u64>,
    overrides: &Overrides,
) -> Result<ConfigReading, SetupError> {
    unfilled_autos(document, hidden, overrides)?;
    let world = hardware.total_gpus();
    let mut notes = Vec::new();
    let written = with_flags(document, world, overrides, &mut notes);
    let typed = config::from_value(&written).map_err(SetupError::Invalid)?;
    precision::precision(&typed).map_err(|_| SetupError::ConflictingPrecision)?;
    let environment = Environment {
        world_size: Some(world),
        ..Environment::default()
    };
    let resolved = resolve::resolve(&written, &environment).map_err(SetupError::Refused)?;
    let config = resolved.typed;
    let setup = training_setup(
        &config,
        resolved.batch.gradient_accumulation_steps,
        overrides,
        &mut notes,
    )
    .map_err(|_| SetupError::ConflictingPrecision)?;

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
        micro_batch: resolved.batch.train_micro_batch_size_per_gpu,
        checkpointing,
        checkpoint_placement,
        notes,
        config,
    })
}

/// The estimate's view of a resolved `config`: its precision and dtypes by the plan's rule
/// ([`precision::dtypes`]), its optimizer, ZeRO section and accumulation.
fn training_setup(
    config: &DsConfig,
    accumulation: u64,
    overrides: &Overrides,
    notes: &mut Vec<String>,
) -> Result<TrainingSetup, precision::BothEnabled> {
    let precision = precision::precision(config)?;
    let zero = zero_setup(config);
    let dtypes = precision::dtypes(config, precision, zero.stage);
    let mut optimizer = optimizer(config, notes);
    optimizer.state_bytes = dtypes.optimizer_states.bytes();
    Ok(TrainingSetup {
        precision,
        master_bytes: dtypes.master.bytes(),
        grad_bytes: dtypes.grad_accum.bytes(),
        optimizer_grad_bytes: dtypes.master.bytes(),
        optimizer,
        zero,
        gradient_accumulation_steps: accumulation,
        zero_init: overrides.zero_init.unwrap_or(ZeroInit::Enabled),
    })
}

/// An error for the first key that changes memory and is still `"auto"` with no flag to fill
/// it, or for a config with no batch size at all and no `--micro-batch`.
fn unfilled_autos(
    document: &Value,
    hidden: Option<u64>,
    overrides: &Overrides,
) -> Result<(), SetupError> {
    let auto = |pointer: &str| document.pointer(pointer).and_then(Value::as_str) == Some("auto");
    let bf16 = if document.get("bf16").is_some() {
        "/bf16/enabled"
    } else {
        "/bfloat16/enabled"
    };
    if overrides.precision.is_none() {
        for (pointer, shown) in [("/fp16/enabled", "/fp16/enabled"), (bf16, "/bf16/enabled")] {
            if auto(pointer) {
                return Err(SetupError::Auto {
                    pointer: shown,
                    fill: AutoFill::Flag("--precision fp16|bf16|fp32"),
                });
            }
        }
    }
    let square = hidden.map(|h| h.saturating_mul(h));
    let buckets = [
        (
            "/zero_optimization/reduce_bucket_size",
            "hidden_size²",
            square,
        ),
        (
            "/zero_optimization/stage3_prefetch_bucket_size",
            "int(0.9 × hidden_size²)",
            square.map(|sq| (sq as f64 * 0.9) as u64),
        ),
        (
            "/zero_optimization/stage3_param_persistence_threshold",
            "10 × hidden_size",
            hidden.map(|h| h.saturating_mul(10)),
        ),
    ];
    for (pointer, rule, value) in buckets {
        if auto(pointer) {
            return Err(SetupError::Auto {
                pointer,
                fill: AutoFill::HiddenSize { rule, value },
            });
        }
    }
    if overrides.micro_batch.is_some() {
        return Ok(());
    }
    let keys = [
        "/train_batch_size",
        "/train_micro_batch_size_per_gpu",
        "/gradient_accumulation_steps",
    ];
    let micro_given = document
        .pointer("/train_micro_batch_size_per_gpu")
        .is_some_and(|v| !v.is_null() && v.as_str() != Some("auto"));
    if keys.iter().any(|key| auto(key)) && !micro_given {
        return Err(SetupError::Auto {
            pointer: "/train_micro_batch_size_per_gpu",
            fill: AutoFill::Flag("--micro-batch"),
        });
    }
    if keys[..2]
        .iter()
        .all(|key| document.pointer(key).is_none_or(Value::is_null))
    {
        return Err(SetupError::MissingMicroBatch);
    }
    Ok(())
}

/// `document` with the flags written in (`--precision` as the fp16/bf16 sections,
/// `--micro-batch` with the accumulation the config implies and the train batch that follows
/// over `world` ranks), and every `"auto"` left dropped.
fn with_flags(
    document: &Value,
    world: u64,
    overrides: &Overrides,
    notes: &mut Vec<String>,
) -> Value {
    let mut document = document.clone();
    let concrete = |pointer: &str| document.pointer(pointer).and_then(Value::as_u64);
    let batch = overrides.micro_batch.map(|micro| {
        let steps = match (
            concrete("/gradient_accumulation_steps"),
            concrete("/train_batch_size"),
        ) {
            (Some(steps), _) => steps,
            (None, Some(train)) => (train / micro.saturating_mul(world).max(1)).max(1),
            (None, None) => {
                notes.push("gradient_accumulation_steps taken as 1".to_owned());
                1
            }
        };
        (micro, steps)
    });
    for pointer in AUTO_KEYS {
        if document.pointer(pointer).and_then(Value::as_str) == Some("auto") {
            remove(&mut document, pointer);
        }
    }
    let Some(top) = document.as_object_mut() else {
        return document;
    };
    // The learning-rate schedule holds no memory, and its step counts come from training
    // arguments this command does not have (`total_num_steps: "auto"`).
    top.remove("scheduler");
    if let Some((micro, steps)) = batch {
        top.insert("train_micro_batch_size_per_gpu".into(), json!(micro));
        top.insert("gradient_accumulation_steps".into(), json!(steps));
        top.insert(
            "train_batch_size".into(),
            json!(micro.saturating_mul(steps).saturating_mul(world)),
        );
    }
    if let Some(chosen) = overrides.precision {
        top.remove("bfloat16");
        for (section, on) in [
            ("fp16", chosen == Precision::Fp16),
            ("bf16", chosen == Precision::Bf16),
        ] {
            let entry = top
                .entry(section)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(object) = entry.as_object_mut() {
                object.insert("enabled".into(), json!(on));
            } else {
                *entry = json!({"enabled": on});
            }
        }
    }
    document
}

/// Removes the key at `pointer`.
fn remove(document: &mut Value, pointer: &str) {
    let Some((parent, key)) = pointer.rsplit_once('/') else {
        return;
    };
    if let Some(Value::Object(object)) = document.pointer_mut(parent) {
        object.remove(key);
    }
}

/// `zero_optimization` of a resolved config (deprecated spellings already migrated, every
/// default written), as the estimate reports it.
fn zero_setup(config: &DsConfig) -> ZeroSetup {
    let zero = &config.zero_optimization;
    let mut setup = ZeroSetup::defaults(zero.stage);
    let size = |value: &AutoOr<config::NonNegativeInt>, default: u64| {
        value.value().map_or(default, |v| v.get())
    };
    // Resolution has turned `cpu_offload` and `cpu_offload_param` into these sections.
    let optimizer_section = zero.offload_optimizer.clone().unwrap_or_default();
    let param_section = zero.offload_param.clone().unwrap_or_default();
    setup.contiguous_gradients = zero.contiguous_gradients;
    setup.overlap_comm = zero.overlap_comm_resolved();
    setup.reduce_bucket_size = zero
        .reduce_bucket_size
        .value()
        .map_or(setup.reduce_bucket_size, |v| v.get());
    setup.allgather_bucket_size = zero.allgather_bucket_size.get();
    setup.prefetch_bucket_size = size(&zero.prefetch_bucket_size, setup.prefetch_bucket_size);
    setup.max_live_parameters = zero.max_live_parameters.get();
    setup.param_persistence_threshold = size(
        &zero.param_persistence_threshold,
        setup.param_persistence_threshold,
    );
    setup.model_persistence_threshold = zero.model_persistence_threshold.map(|t| t.get());
    setup.sub_group_size = zero.sub_group_size.get();
    setup.offload_optimizer = OffloadOptimizer {
        device: if zero.stage == ZeroStage::Disabled {
            OffloadDevice::None
        } else {
            optimizer_section.device
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
        device: param_section.device,
        pinning: Pinning::from_flag(param_section.pin_memory),
        buffer_count: param_section.buffer_count.get(),
        buffer_size: param_section.buffer_size.get(),
        max_in_cpu: param_section.max_in_cpu.get(),
    };
    setup
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
            Topology::new(8, 1).expect("valid"),
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
    fn autos_that_do_not_change_memory_are_dropped_and_flags_fill_the_rest() {
        let reading = read(
            json!({
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_clipping": "auto",
                "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
                "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto",
                              "warmup_num_steps": "auto"}},
                "bf16": {"enabled": "auto"},
            }),
            Overrides {
                precision: Some(Precision::Fp16),
                micro_batch: Some(4),
                ..Overrides::default()
            },
        )
        .expect("reads");
        assert_eq!(reading.micro_batch, 4);
        assert_eq!(reading.setup.precision, Precision::Fp16);
        assert_eq!(
            reading
                .config
                .train_batch_size
                .as_ref()
                .and_then(|v| v.value())
                .map(|v| v.get()),
            Some(32),
            "4 x 1 x 8 ranks"
        );
        assert!(reading.notes.iter().any(|n| n.contains("taken as 1")));
    }

    #[test]
    fn the_config_is_resolved_as_dsplan_run_reads_it() {
        // The legacy spellings are migrated: `cpu_offload` is optimizer offload to the CPU.
        let reading = read(
            json!({"train_micro_batch_size_per_gpu": 2, "bfloat16": {"enabled": true},
                   "zero_optimization": {"stage": 2, "cpu_offload": true}}),
            Overrides::default(),
        )
        .expect("reads");
        assert_eq!(reading.setup.precision, Precision::Bf16);
        assert_eq!(
            reading.setup.zero.offload_optimizer.device,
            OffloadDevice::Cpu
        );
        // What DeepSpeed refuses is refused, with the resolver's diagnostics.
        let error = read(
            json!({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2,
                   "gradient_accumulation_steps": 1}),
            Overrides::default(),
        )
        .expect_err("10 is not 2 x 1 x 8");
        assert!(matches!(error, SetupError::Refused(_)), "{error:?}");
        assert!(error.to_string().contains("/train_batch_size"), "{error}");
    }

    #[test]
    fn bf16_without_zero_accumulates_gradients_in_bf16() {
        let reading = read(
            json!({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}}),
            Overrides::default(),
        )
        .expect("reads");
        assert_eq!(
            reading.setup.grad_bytes, 2,
            "DeepSpeed 0.19.8's get_data_types: the model dtype"
        );
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
