//! A 3D-parallel training job: the model's shape, how the GPUs are split (tensor, pipeline,
//! sequence and data parallelism), the batch, and the runtime that holds the model states.

use serde::Serialize;

use super::error::FlagNames;
use super::shape::TransformerShape;
use crate::config::ZeroStage;
use crate::memory::{AttentionKernel, Precision};

/// The pipeline schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum PipelineSchedule {
    /// One forward, one backward (PipeDream-Flush), each rank holding one contiguous block of
    /// layers. Also what DeepSpeed's PipelineEngine runs.
    OneForwardOneBackward,
    /// Megatron-LM's interleaved schedule: each rank holds `virtual_stages` chunks of layers.
    Interleaved {
        /// Model chunks per rank (`--num-virtual-stages-per-pipeline-rank`).
        virtual_stages: u64,
    },
}

impl PipelineSchedule {
    /// Model chunks per pipeline rank (1 without interleaving).
    pub fn chunks(self) -> u64 {
        match self {
            PipelineSchedule::OneForwardOneBackward => 1,
            PipelineSchedule::Interleaved { virtual_stages } => virtual_stages,
        }
    }
}

/// Sequence parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum SequenceParallel {
    /// None.
    Off,
    /// Megatron-LM's (`--sequence-parallel`): the layer norms, dropouts and residuals of each
    /// tensor-parallel rank hold a slice of the sequence; no extra GPUs.
    Megatron,
    /// DeepSpeed-Ulysses (`sequence_parallel_size`): `degree` GPUs split every sequence and
    /// exchange heads by all-to-all around attention.
    Ulysses {
        /// GPUs per sequence.
        degree: u64,
    },
}

impl SequenceParallel {
    /// GPUs per sequence replica that Ulysses adds (1 otherwise).
    pub fn ulysses_degree(self) -> u64 {
        match self {
            SequenceParallel::Ulysses { degree } => degree,
            _ => 1,
        }
    }
}

/// How the GPUs are split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Tensor-parallel degree `t`.
    pub tensor: u64,
    /// Pipeline degree `p`.
    pub pipeline: u64,
    /// The pipeline schedule.
    pub schedule: PipelineSchedule,
    /// Sequence parallelism.
    pub sequence: SequenceParallel,
    /// Data-parallel degree `d`.
    pub data: u64,
}

impl Layout {
    /// GPUs: `t × p × u × d`, with `u` the Ulysses degree (1 without it).
    pub fn world(&self) -> u64 {
        self.tensor * self.pipeline * self.sequence.ulysses_degree() * self.data
    }

    /// GPUs over which ZeRO (or Megatron's distributed optimizer) shards the states of one
    /// model-parallel rank: `d`, times `u` under Ulysses (DeepSpeed shards over the
    /// sequence-and-data group).
    pub fn sharding_degree(&self) -> u64 {
        self.data * self.sequence.ulysses_degree()
    }
}

/// Megatron-LM's optimizer sharding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerSharding {
    /// Every data-parallel rank holds the fp32 master weights and Adam states.
    Replicated,
    /// `--use-distributed-optimizer`: master weights and Adam states are split over the
    /// data-parallel ranks (ZeRO-1-like).
    Distributed,
}

/// The runtime that holds the model states (parameters, gradients, master weights, optimizer
/// states).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Runtime {
    /// Megatron-LM: 16-bit parameters in one buffer, fp32 gradients in another
    /// (`main_grad`), fp32 master weights and Adam states.
    MegatronLm {
        /// Replicated or distributed optimizer.
        optimizer: OptimizerSharding,
    },
    /// DeepSpeed (Megatron-DeepSpeed, AutoTP, the PipelineEngine) with a ZeRO stage.
    DeepSpeed {
        /// The ZeRO stage.
        zero: ZeroStage,
        /// `reduce_bucket_size` in elements (stages 1-2).
        reduce_bucket: u64,
    },
}

/// Recomputation in backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Recompute {
    /// Every activation is stored.
    None,
    /// The core attention is recomputed (`--recompute-granularity selective`).
    Selective,
    /// Whole layers are recomputed from their stored input (`--recompute-granularity full`).
    Full {
        /// Uniform or block.
        method: RecomputeMethod,
        /// `--recompute-num-layers`.
        layers: u64,
    },
}

/// `--recompute-method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RecomputeMethod {
    /// Groups of `layers` consecutive layers each keep only the group's input.
    Uniform,
    /// The first `layers` layers of each pipeline stage are recomputed, the others store
    /// everything.
    Block,
}

/// Whether a dropout runs (it stores a 1-byte mask per element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DropoutUse {
    /// Probability above 0.
    Applied,
    /// Probability 0: no mask.
    Skipped,
}

/// The dropouts of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Dropout {
    /// After the attention projection, the MLP and the embedding (`--hidden-dropout`).
    pub hidden: DropoutUse,
    /// On the attention probabilities (`--attention-dropout`; stored only by eager attention).
    pub attention: DropoutUse,
}

/// Whether weight gradients go straight into the fp32 gradient buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradientAccumulationFusion {
    /// Fused (Megatron's default): no 16-bit weight gradient is allocated.
    Fused,
    /// `--no-gradient-accumulation-fusion`: each weight gradient is first a 16-bit tensor of
    /// the weight's size, then added to the buffer.
    Unfused,
}

/// Batch sizes, per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Batch {
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per micro-batch per model replica.
    pub micro_batch: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
}

impl Batch {
    /// Micro-batches per step of each pipeline: `global / (micro × d)` (checked to divide).
    pub fn micro_batches(&self, data: u64) -> u64 {
        self.global_batch / (self.micro_batch * data).max(1)
    }
}

/// How the job trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Training {
    /// Precision of parameters and activations.
    pub precision: Precision,
    /// Runtime and state sharding.
    pub runtime: Runtime,
    /// Recomputation.
    pub recompute: Recompute,
    /// Flash or eager attention.
    pub attention: AttentionKernel,
    /// Dropouts.
    pub dropout: Dropout,
    /// Gradient-accumulation fusion.
    pub gradient_fusion: GradientAccumulationFusion,
}

/// A whole job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Job {
    /// The model.
    pub shape: TransformerShape,
    /// The GPU split.
    pub layout: Layout,
    /// The batch.
    pub batch: Batch,
    /// How it trains.
    pub training: Training,
    /// How each knob was spelled (for errors).
    #[serde(skip)]
    pub names: FlagNames,
}

impl Job {
    /// Micro-batches per step of each pipeline.
    pub fn micro_batches(&self) -> u64 {
        self.batch.micro_batches(self.layout.data)
    }
}
