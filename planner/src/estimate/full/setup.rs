//! What the full estimate needs to know about a training run: the training shape (sequence,
//! micro-batch, checkpointing, attention kernel) and the setup a DeepSpeed config describes
//! (precision, optimizer, ZeRO stage, offload, buckets).
//!
//! [`super::config_reading`] builds a [`TrainingSetup`] from a `ds_config.json`; `recommend`
//! builds one directly.

use crate::config::{OffloadDevice, ZeroStage};
use crate::estimate::ZeroInit;
pub use crate::memory::{
    AttentionKernel, CheckpointPlacement, Checkpointing, MAX_SHAPE_DIMENSION, Precision,
    TrainingShape,
};
use serde::Serialize;

use super::rows::Pinning;

/// The optimizer, as far as memory is concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OptimizerModel {
    /// The name it was recognised by (e.g. `AdamW`).
    pub name: String,
    /// States kept per parameter (Adam: 2, Lion: 1, SGD without momentum: 0).
    pub states_per_param: u64,
    /// Bytes of each state element (4 for fp32 states).
    pub state_bytes: u64,
}

impl OptimizerModel {
    /// AdamW with fp32 states, DeepSpeed's usual choice.
    pub fn adamw() -> OptimizerModel {
        OptimizerModel {
            name: "AdamW".to_owned(),
            states_per_param: 2,
            state_bytes: 4,
        }
    }
}

/// `zero_optimization.offload_optimizer`, read.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OffloadOptimizer {
    /// Where the fp32 master, optimizer states and fp32 gradients go.
    pub device: OffloadDevice,
    /// Fraction of optimizer sub-groups offloaded (stage 3; 1.0 otherwise).
    pub ratio: f64,
    /// Whether the host buffers are page-locked.
    pub pinning: Pinning,
    /// NVMe swap buffers (sub-groups) for optimizer state.
    pub buffer_count: u64,
}

/// `zero_optimization.offload_param`, read (stage 3 only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OffloadParam {
    /// Where the partitioned 16-bit parameters go.
    pub device: OffloadDevice,
    /// Whether the host buffers are page-locked.
    pub pinning: Pinning,
    /// NVMe swap buffers.
    pub buffer_count: u64,
    /// Elements per NVMe swap buffer.
    pub buffer_size: u64,
    /// Partition elements kept in host memory under NVMe offload.
    pub max_in_cpu: u64,
}

/// `zero_optimization`, read, with DeepSpeed's defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ZeroSetup {
    /// The stage.
    pub stage: ZeroStage,
    /// `contiguous_gradients` (forced on by offload in stages 1-2).
    pub contiguous_gradients: bool,
    /// `overlap_comm` as DeepSpeed resolves it.
    pub overlap_comm: bool,
    /// `reduce_bucket_size` in elements.
    pub reduce_bucket_size: u64,
    /// `allgather_bucket_size` in elements.
    pub allgather_bucket_size: u64,
    /// `stage3_prefetch_bucket_size` in elements.
    pub prefetch_bucket_size: u64,
    /// `stage3_max_live_parameters` in elements.
    pub max_live_parameters: u64,
    /// `stage3_param_persistence_threshold` in elements.
    pub param_persistence_threshold: u64,
    /// `stage3_model_persistence_threshold` in elements (`None`: unlimited).
    pub model_persistence_threshold: Option<u64>,
    /// `sub_group_size` in elements.
    pub sub_group_size: u64,
    /// Optimizer offload.
    pub offload_optimizer: OffloadOptimizer,
    /// Parameter offload.
    pub offload_param: OffloadParam,
}

impl ZeroSetup {
    /// DeepSpeed 0.19.8's defaults at `stage`, nothing offloaded.
    pub fn defaults(stage: ZeroStage) -> ZeroSetup {
        ZeroSetup {
            stage,
            contiguous_gradients: true,
            overlap_comm: stage == ZeroStage::Weights,
            reduce_bucket_size: 500_000_000,
            allgather_bucket_size: 500_000_000,
            prefetch_bucket_size: 50_000_000,
            max_live_parameters: 1_000_000_000,
            param_persistence_threshold: 100_000,
            model_persistence_threshold: None,
            sub_group_size: 1_000_000_000,
            offload_optimizer: OffloadOptimizer {
                device: OffloadDevice::None,
                ratio: 1.0,
                pinning: Pinning::Pinned,
                buffer_count: 4,
            },
            offload_param: OffloadParam {
                device: OffloadDevice::None,
                pinning: Pinning::Pinned,
                buffer_count: 5,
                buffer_size: 100_000_000,
                max_in_cpu: 1_000_000_000,
            },
        }
    }

    /// Whether the optimizer (and its states) leave the GPU. Stages 1-2 treat `nvme` as `cpu`.
    pub fn optimizer_offloaded(&self) -> bool {
        self.stage != ZeroStage::Disabled && self.offload_optimizer.device.is_offloaded()
    }

    /// Whether parameters leave the GPU (stage 3 only; stages 1-2 ignore `offload_param`).
    pub fn params_offloaded(&self) -> bool {
        self.stage == ZeroStage::Weights && self.offload_param.device.is_offloaded()
    }
}

/// Everything but the model and the shape: precision, optimizer, ZeRO, accumulation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingSetup {
    /// Training precision.
    pub precision: Precision,
    /// Bytes of one master-weight element (4; 2 with `*_master_weights_and_grads`; 0 in fp32).
    pub master_bytes: u64,
    /// Bytes of one gradient element in the accumulation dtype.
    pub grad_bytes: u64,
    /// Bytes of one element of the gradients handed to the optimizer (4; 2 with
    /// `*_master_weights_and_grads`).
    pub optimizer_grad_bytes: u64,
    /// The optimizer.
    pub optimizer: OptimizerModel,
    /// ZeRO.
    pub zero: ZeroSetup,
    /// `gradient_accumulation_steps`.
    pub gradient_accumulation_steps: u64,
    /// Whether ZeRO-3 builds the model under `zero.Init`.
    pub zero_init: ZeroInit,
}

impl TrainingSetup {
    /// Mixed (or plain fp32) precision with AdamW, DeepSpeed's defaults at `stage`.
    pub fn new(precision: Precision, stage: ZeroStage) -> TrainingSetup {
        let element = precision.element_bytes();
        TrainingSetup {
            precision,
            master_bytes: if precision.is_mixed() { 4 } else { 0 },
            grad_bytes: element,
            optimizer_grad_bytes: 4,
            optimizer: OptimizerModel::adamw(),
            zero: ZeroSetup::defaults(stage),
            gradient_accumulation_steps: 1,
            zero_init: ZeroInit::Enabled,
        }
    }
}
