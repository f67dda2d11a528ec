//! The configurations `recommend` walks, from fastest to most memory-frugal, and the
//! `ds_config.json` each one becomes.
//!
//! Bucket sizes follow the Hugging Face Trainer's model-derived values (research/peers.md §1.3:
//! `reduce_bucket_size = hidden²`, `stage3_prefetch_bucket_size = int(0.9·hidden²)`,
//! `stage3_param_persistence_threshold = 10·hidden`), which keep buckets proportional to the
//! layers instead of DeepSpeed's fixed 5e8 elements.

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::config::{OffloadDevice, ZeroStage};
use crate::estimate::full::{Checkpointing, Precision};

/// A ZeRO stage with an offload choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// ZeRO-1: optimizer states partitioned.
    Zero1,
    /// ZeRO-2: optimizer states and gradients partitioned.
    Zero2,
    /// ZeRO-2 with the optimizer (and its step) on the CPU: ZeRO-Offload.
    Zero2OffloadOptimizer,
    /// ZeRO-3: parameters partitioned too.
    Zero3,
    /// ZeRO-3 with the optimizer on the CPU, wholly or for a share of its sub-groups.
    Zero3OffloadOptimizer,
    /// ZeRO-3 with optimizer and parameters on the CPU.
    Zero3OffloadAll,
    /// ZeRO-3 with optimizer and parameters on NVMe: ZeRO-Infinity.
    Zero3Nvme,
}

impl Strategy {
    /// The walk order: fastest first.
    pub const WALK: [Strategy; 7] = [
        Strategy::Zero1,
        Strategy::Zero2,
        Strategy::Zero2OffloadOptimizer,
        Strategy::Zero3,
        Strategy::Zero3OffloadOptimizer,
        Strategy::Zero3OffloadAll,
        Strategy::Zero3Nvme,
    ];

    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Zero1 => "ZeRO-1",
            Strategy::Zero2 => "ZeRO-2",
            Strategy::Zero2OffloadOptimizer => "ZeRO-2 + optimizer offload",
            Strategy::Zero3 => "ZeRO-3",
            Strategy::Zero3OffloadOptimizer => "ZeRO-3 + optimizer offload",
            Strategy::Zero3OffloadAll => "ZeRO-3 + optimizer and param offload",
            Strategy::Zero3Nvme => "ZeRO-3 + NVMe offload",
        }
    }

    /// The ZeRO stage.
    pub fn stage(self) -> ZeroStage {
        match self {
            Strategy::Zero1 => ZeroStage::OptimizerStates,
            Strategy::Zero2 | Strategy::Zero2OffloadOptimizer => ZeroStage::Gradients,
            _ => ZeroStage::Weights,
        }
    }

    /// Where the optimizer goes.
    pub fn optimizer_device(self) -> OffloadDevice {
        match self {
            Strategy::Zero1 | Strategy::Zero2 | Strategy::Zero3 => OffloadDevice::None,
            Strategy::Zero3Nvme => OffloadDevice::Nvme,
            _ => OffloadDevice::Cpu,
        }
    }

    /// Where the parameters go.
    pub fn param_device(self) -> OffloadDevice {
        match self {
            Strategy::Zero3OffloadAll => OffloadDevice::Cpu,
            Strategy::Zero3Nvme => OffloadDevice::Nvme,
            _ => OffloadDevice::None,
        }
    }

    /// Whether anything lives in host memory or on NVMe.
    pub fn offloads(self) -> bool {
        self.optimizer_device().is_offloaded()
    }

    /// Whether it needs an NVMe path.
    pub fn needs_nvme(self) -> bool {
        self == Strategy::Zero3Nvme
    }
}

/// One concrete candidate: a strategy with its batch split and offload share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The strategy.
    pub strategy: Strategy,
    /// `train_micro_batch_size_per_gpu`.
    pub micro_batch: u64,
    /// `gradient_accumulation_steps`.
    pub accumulation: u64,
    /// `offload_optimizer.ratio` for a partial ZeRO-3 offload (`None`: everything).
    pub offload_ratio: Option<f64>,
}

/// What the configs are built from besides the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigInputs<'a> {
    /// Training precision.
    pub precision: Precision,
    /// Model width (sizes the buckets).
    pub hidden: u64,
    /// Largest single tensor (sizes the NVMe parameter buffers).
    pub largest_tensor: u64,
    /// Data-parallel world size.
    pub world: u64,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// NVMe directory, for [`Strategy::Zero3Nvme`].
    pub nvme_path: Option<&'a str>,
}

/// The elements per NVMe swap buffer: DeepSpeed's 1e8, or more when one parameter's partition
/// is larger (a partition must be smaller than the buffer, deepspeed-facts §4.7).
fn nvme_buffer_size(inputs: &ConfigInputs<'_>) -> u64 {
    let partition = inputs.largest_tensor.div_ceil(inputs.world.max(1));
    100_000_000u64.max(partition + 1)
}

/// The `ds_config.json` of a plan.
pub fn ds_config(plan: &Plan, inputs: &ConfigInputs<'_>) -> Value {
    let h = inputs.hidden;
    let square = h.saturating_mul(h);
    let mut zero = Map::new();
    zero.insert("stage".into(), json!(plan.strategy.stage().number()));
    zero.insert("overlap_comm".into(), json!(true));
    zero.insert("contiguous_gradients".into(), json!(true));
    zero.insert("reduce_bucket_size".into(), json!(square));
    if plan.strategy.stage() == ZeroStage::Weights {
        zero.insert(
            "stage3_prefetch_bucket_size".into(),
            json!((square as f64 * 0.9) as u64),
        );
        zero.insert(
            "stage3_param_persistence_threshold".into(),
            json!(h.saturating_mul(10)),
        );
        zero.insert("stage3_max_live_parameters".into(), json!(1_000_000_000u64));
        zero.insert("stage3_max_reuse_distance".into(), json!(1_000_000_000u64));
        zero.insert("sub_group_size".into(), json!(1_000_000_000u64));
        zero.insert(
            "stage3_gather_16bit_weights_on_model_save".into(),
            json!(true),
        );
    }
    let nvme_path = inputs.nvme_path.unwrap_or("/local_nvme");
    match plan.strategy.optimizer_device() {
        OffloadDevice::None => {}
        OffloadDevice::Cpu => {
            let mut section = json!({"device": "cpu", "pin_memory": true});
            if let Some(ratio) = plan.offload_ratio {
                section["ratio"] = json!(ratio);
            }
            zero.insert("offload_optimizer".into(), section);
        }
        OffloadDevice::Nvme => {
            zero.insert(
                "offload_optimizer".into(),
                json!({"device": "nvme", "nvme_path": nvme_path, "pin_memory": true,
                       "buffer_count": 4}),
            );
        }
    }
    match plan.strategy.param_device() {
        OffloadDevice::None => {}
        OffloadDevice::Cpu => {
            zero.insert(
                "offload_param".into(),
                json!({"device": "cpu", "pin_memory": true}),
            );
        }
        OffloadDevice::Nvme => {
            zero.insert(
                "offload_param".into(),
                json!({"device": "nvme", "nvme_path": nvme_path, "pin_memory": true,
                       "buffer_count": 5, "buffer_size": nvme_buffer_size(inputs)}),
            );
        }
    }
    let mut config = Map::new();
    config.insert(
        "train_batch_size".into(),
        json!(plan.micro_batch * plan.accumulation * inputs.world),
    );
    config.insert(
        "train_micro_batch_size_per_gpu".into(),
        json!(plan.micro_batch),
    );
    config.insert(
        "gradient_accumulation_steps".into(),
        json!(plan.accumulation),
    );
    config.insert("gradient_clipping".into(), json!(1.0));
    match inputs.precision {
        Precision::Bf16 => {
            config.insert("bf16".into(), json!({"enabled": true}));
        }
        Precision::Fp16 => {
            config.insert(
                "fp16".into(),
                json!({"enabled": true, "loss_scale": 0, "initial_scale_power": 16,
                       "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}),
            );
        }
        Precision::Fp32 => {}
    }
    config.insert("optimizer".into(), json!({"type": "AdamW"}));
    config.insert("zero_optimization".into(), Value::Object(zero));
    if inputs.checkpointing == Checkpointing::Full {
        config.insert(
            "activation_checkpointing".into(),
            json!({"partition_activations": false, "cpu_checkpointing": false,
                   "contiguous_memory_optimization": false,
                   "synchronize_checkpoint_boundary": false}),
        );
    }
    Value::Object(config)
}
