//! The training shape the memory arithmetic reads: precision, sequence length, micro-batch,
//! activation checkpointing and the attention kernel.

use serde::Serialize;

/// The largest sequence length and micro-batch dsplan accepts (2^24 each): far beyond real
/// runs, small enough that every product of the activation formulas stays exact.
pub const MAX_SHAPE_DIMENSION: u64 = 1 << 24;

/// Which arithmetic the model trains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// fp16 mixed precision (`fp16.enabled`): 16-bit parameters, fp32 master weights.
    Fp16,
    /// bf16 mixed precision (`bf16.enabled`): 16-bit parameters, fp32 master weights.
    Bf16,
    /// Plain fp32: the parameters are the master weights.
    Fp32,
}

impl Precision {
    /// Bytes of one parameter (and one activation element) in the model dtype.
    pub fn element_bytes(self) -> u64 {
        match self {
            Precision::Fp16 | Precision::Bf16 => 2,
            Precision::Fp32 => 4,
        }
    }

    /// Whether an fp32 master copy exists next to 16-bit parameters.
    pub fn is_mixed(self) -> bool {
        self != Precision::Fp32
    }

    /// `fp16`, `bf16` or `fp32`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
        }
    }
}

/// Activation checkpointing (recomputation) of the transformer layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Checkpointing {
    /// Every activation is stored for backward.
    #[default]
    None,
    /// Only the attention-score tensors are recomputed (Korthikanti et al.'s selective
    /// recomputation).
    Selective,
    /// Only each layer's input is stored; the layer is recomputed in backward.
    Full,
}

/// Where checkpointed layer inputs are kept (`activation_checkpointing.cpu_checkpointing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckpointPlacement {
    /// On the GPU.
    #[default]
    Gpu,
    /// In host memory.
    Cpu,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttentionKernel {
    /// The `heads x seq x seq` score matrix is materialised (and stored for backward).
    #[default]
    Eager,
    /// FlashAttention: no score matrix, only fp32 softmax statistics per row.
    Flash,
}

/// The shape of one micro-step on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TrainingShape {
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per GPU per micro-step (`train_micro_batch_size_per_gpu`).
    pub micro_batch: u64,
    /// Recomputation of layer activations.
    pub checkpointing: Checkpointing,
    /// Where checkpoints are kept (only with [`Checkpointing::Full`]).
    pub checkpoint_placement: CheckpointPlacement,
    /// Attention kernel.
    pub attention: AttentionKernel,
}
