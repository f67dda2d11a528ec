//! [`Settings`]: every choice the plan depends on, decided once from the config, the model and
//! the cluster ([`super::decide`]). Modes are enums; where DeepSpeed would silently fall back,
//! the setting here already holds the fallback and a diagnostic says so.

use serde::Serialize;

use super::backend::PlanBackend;
use super::dtype::Dtype;
use crate::config::ZeroStage;
use crate::estimate::ZeroInit;
use crate::memory::TrainingShape;
pub use crate::memory::{AttentionKernel, CheckpointPlacement, Checkpointing, Precision};

/// The element type of each kind of state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dtypes {
    /// The model's parameters (DeepSpeed's "16-bit" flat buffer; fp32 without mixed precision).
    pub params: Dtype,
    /// Gradients as backward produces them (the model dtype).
    pub gradients: Dtype,
    /// Gradient accumulation and the partitioned gradient buffer.
    pub grad_accum: Dtype,
    /// Gradient reduction on the wire (`communication_data_type`).
    pub communication: Dtype,
    /// Master weights the optimizer updates, and the gradients it reads at the step.
    pub master: Dtype,
    /// Optimizer states.
    pub optimizer_states: Dtype,
}

/// The optimizer, as far as memory and time are concerned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OptimizerChoice {
    /// The config's `optimizer.type` (or the assumed one).
    pub name: String,
    /// State tensors per parameter (Adam: `exp_avg`, `exp_avg_sq`).
    pub states: u64,
}

/// When gradients are reduced across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReduceTiming {
    /// After every micro-step's backward (ZeRO-2, ZeRO-3).
    EveryMicroStep,
    /// Only in the micro-step that ends gradient accumulation (stage 0, ZeRO-1).
    AccumulationBoundary,
}

/// Whether gradient reduction runs on its own stream, overlapping backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// On a side stream, concurrently with backward (`overlap_comm`).
    Overlapped,
    /// On the compute stream: backward waits for it.
    Serialized,
}

/// How gradients are stored before reduction (`contiguous_gradients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradientStorage {
    /// Copied into the IPG bucket buffer as they are produced.
    Contiguous,
    /// Each parameter's own gradient tensor.
    PerParameter,
}

/// Order of the parameters in the flat stage-1/2 buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlatOrder {
    /// `model.parameters()` order.
    Model,
    /// `round_robin_gradients`: parameter i goes to list i mod N, lists concatenated.
    RoundRobin,
}

/// Whether host memory is page-locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pinning {
    /// Page-locked: asynchronous full-bandwidth copies.
    Pinned,
    /// Ordinary pageable memory.
    Pageable,
}

impl Pinning {
    /// `pin_memory` as a [`Pinning`].
    pub fn from_flag(pin_memory: bool) -> Pinning {
        if pin_memory {
            Pinning::Pinned
        } else {
            Pinning::Pageable
        }
    }
}

/// Where offloaded state goes, after the planner's decisions.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "device", rename_all = "lowercase")]
pub enum OffloadTarget {
    /// Nothing offloaded.
    None,
    /// Host memory.
    Cpu {
        /// Pinned or pageable.
        pinning: Pinning,
    },
    /// NVMe files, staged through pinned host buffers.
    Nvme {
        /// The directory.
        path: String,
        /// Whether the host-side buffers (gradient partitions, `max_in_cpu` parameters) are
        /// pinned (`pin_memory`).
        pinning: Pinning,
        /// Pinned staging buffers.
        buffer_count: u64,
        /// Elements per staging buffer (parameter offload only; the optimizer's are sized by
        /// the largest sub-group).
        buffer_size: u64,
        /// Parameter elements kept in pinned host memory instead of NVMe (parameter offload).
        max_in_cpu: u64,
    },
}

impl OffloadTarget {
    /// Whether anything leaves the GPU.
    pub fn is_offloaded(&self) -> bool {
        !matches!(self, OffloadTarget::None)
    }

    /// `pin_memory` of the offload section (`None` when nothing is offloaded).
    pub fn pinning(&self) -> Option<Pinning> {
        match self {
            OffloadTarget::None => None,
            OffloadTarget::Cpu { pinning } | OffloadTarget::Nvme { pinning, .. } => Some(*pinning),
        }
    }
}

/// How the host optimizer of an offloaded step orders its update against the global gradient
/// norm and the overflow check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OffloadStepping {
    /// DeepSpeed's order: every gradient in, the norm and the overflow flag, then the step.
    Exact,
    /// SuperOffload-style (`offload_optimizer.super_offload`): each bucket is stepped as it
    /// arrives into a second copy of the state, committed when the norm and the overflow flag
    /// say the step stands, redone (clipping) or dropped (overflow) otherwise.
    Speculative,
}

impl OffloadStepping {
    /// Whether this is DeepSpeed's exact order.
    pub fn is_exact(&self) -> bool {
        *self == OffloadStepping::Exact
    }
}

/// How ZeRO-1/2 rebuilds the full parameter buffer after the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ParamGatherMode {
    /// One `all_gather_into_tensor` of the whole flat buffer (NCCL; `allgather_bucket_size`
    /// unused).
    IntoTensor,
    /// Shards of about `allgather_bucket_size` elements (backends without
    /// `all_gather_into_tensor`).
    Sharded,
}

/// Stage-3 knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stage3Settings {
    /// `stage3_prefetch_bucket_size`: most elements prefetched at one module.
    pub prefetch_bucket_size: u64,
    /// `stage3_param_persistence_threshold`: tensors this small are never released.
    pub param_persistence_threshold: u64,
    /// `stage3_model_persistence_threshold`: cap on all persistent elements.
    pub model_persistence_threshold: u64,
    /// `stage3_max_live_parameters`: prefetching stops above this many gathered elements.
    pub max_live_parameters: u64,
    /// `stage3_max_reuse_distance`: keep a tensor gathered if it is used again within this
    /// many elements of trace.
    pub max_reuse_distance: u64,
    /// `sub_group_size`: partition elements per optimizer sub-group.
    pub sub_group_size: u64,
    /// Fetch with all-reduce instead of all-gather (`stage3_use_all_reduce_for_fetch_params`).
    pub fetch_with_all_reduce: bool,
}

/// The batch shape of one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Batch {
    /// Samples per rank per micro-step.
    pub micro_batch: u64,
    /// Micro-steps per optimizer step.
    pub gradient_accumulation_steps: u64,
    /// Samples per optimizer step over all ranks.
    pub train_batch_size: u64,
    /// Tokens per sample.
    pub sequence_length: u64,
}

/// Every decided setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Settings {
    /// ZeRO stage.
    pub stage: ZeroStage,
    /// Data-parallel ranks.
    pub world_size: u64,
    /// Batch shape.
    pub batch: Batch,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// Where full checkpointing keeps the layer inputs.
    pub checkpoint_placement: CheckpointPlacement,
    /// The attention kernel.
    pub attention: AttentionKernel,
    /// Whether the model is built under `zero.Init` (stage 3).
    pub zero_init: ZeroInit,
    /// Mixed precision.
    pub precision: Precision,
    /// Element types.
    pub dtypes: Dtypes,
    /// The optimizer.
    pub optimizer: OptimizerChoice,
    /// `reduce_bucket_size` in elements (stage 0: DeepSpeed's fixed 5e8).
    pub reduce_bucket_size: u64,
    /// `allgather_bucket_size` in elements.
    pub allgather_bucket_size: u64,
    /// When gradients are reduced.
    pub reduce_timing: ReduceTiming,
    /// Whether reduction overlaps backward.
    pub overlap: Overlap,
    /// Gradient storage before reduction.
    pub gradient_storage: GradientStorage,
    /// `reduce_scatter` as given.
    pub reduce_scatter: bool,
    /// `use_multi_rank_bucket_allreduce` as given.
    pub multi_rank_bucket_allreduce: bool,
    /// Order of the flat buffer (stages 1/2).
    pub flat_order: FlatOrder,
    /// How ZeRO-1/2 gathers parameters after the step.
    pub param_gather: ParamGatherMode,
    /// Optimizer-state offload.
    pub offload_optimizer: OffloadTarget,
    /// Fraction of stage-3 sub-groups whose optimizer runs on the CPU (`ratio`).
    pub offload_ratio: f64,
    /// Parameter offload (stage 3 only).
    pub offload_param: OffloadTarget,
    /// How the host optimizer orders its step against the norm and the overflow check (left
    /// out of the JSON when it is DeepSpeed's exact order).
    #[serde(skip_serializing_if = "OffloadStepping::is_exact")]
    pub offload_stepping: OffloadStepping,
    /// Stage-3 knobs (`None` below stage 3).
    pub stage3: Option<Stage3Settings>,
    /// The runtime the plan's buffers are listed for (left out of the JSON when it is the
    /// default, DeepSpeed on GPUs).
    #[serde(skip_serializing_if = "PlanBackend::is_deepspeed_gpu")]
    pub backend: PlanBackend,
}

impl Settings {
    /// Whether optimizer states are partitioned: ZeRO 1-3.
    pub fn partitions_optimizer(&self) -> bool {
        self.stage >= ZeroStage::OptimizerStates
    }

    /// Whether this is DeepSpeed's `BF16_Optimizer` (`_do_optimizer_sanity_check`): bf16 at
    /// stage 1 with an explicit fp32 `data_types.grad_accum_dtype` and no optimizer offload:
    /// full bf16 parameters, a full fp32 gradient accumulation buffer, the fp32 master and
    /// states partitioned. (bf16 without ZeRO accumulates in bf16 and is `FP16_Optimizer`.)
    pub fn bf16_optimizer(&self) -> bool {
        self.stage == ZeroStage::OptimizerStates
            && self.precision == Precision::Bf16
            && self.dtypes.grad_accum == Dtype::Fp32
            && self.offload_optimizer == OffloadTarget::None
    }

    /// Whether gradients are partitioned.
    pub fn partitions_gradients(&self) -> bool {
        self.stage >= ZeroStage::Gradients
    }

    /// Whether parameters are partitioned.
    pub fn partitions_params(&self) -> bool {
        self.stage == ZeroStage::Weights
    }

    /// Tokens one rank processes per micro-step.
    pub fn tokens_per_micro_step(&self) -> u64 {
        self.batch.micro_batch * self.batch.sequence_length
    }

    /// The activation shape of one micro-step.
    pub fn training_shape(&self) -> TrainingShape {
        TrainingShape {
            seq_len: self.batch.sequence_length,
            micro_batch: self.batch.micro_batch,
            checkpointing: self.checkpointing,
            checkpoint_placement: self.checkpoint_placement,
            attention: self.attention,
        }
    }
}
