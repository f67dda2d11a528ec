//! Activation memory: one clearly named formula, [`activation_sizes`], to be replaced by the
//! detailed estimate of issue 4 (`planner/src/estimate/`) when it lands.
//!
//! Per transformer block, the tensors autograd keeps for backward, for micro-batch b, sequence
//! s, width h, MLP width I, a heads, in bytes for a 16-bit model (Korthikanti et al., 2022,
//! "Reducing Activation Recomputation in Large Transformer Models", §4, generalised from the
//! 4h MLP to any I): attention 11·sbh + 5·as²b, MLP 3·sbh + 4·sbI, two norms 4·sbh, so
//! sb(18h + 4I) + 5as²b (34·sbh + 5as²b when I = 4h). An fp32 model doubles it. Dropout masks
//! are included as in the paper, although GPT-2 fixtures and most fine-tuning run without.
//! With per-block recomputation only the block input (sbh elements) is kept, and the block's
//! full set lives again while its backward runs. The LM head keeps its logits (sbV in the
//! model dtype, plus an fp32 copy for the loss).

use serde::Serialize;

use super::dtype::Dtype;
use super::settings::{Batch, Recompute};
use crate::model::Architecture;

/// Activation bytes of one rank's micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ActivationSizes {
    /// Kept per block from its forward to its backward.
    pub per_block_kept: u64,
    /// Extra while one block's backward runs (recomputed activations; 0 without recompute).
    pub per_block_recomputed: u64,
    /// Embedding output kept for backward.
    pub embedding: u64,
    /// Logits and the fp32 loss input.
    pub logits: u64,
}

/// The activation sizes for `arch` under `batch`, in `dtype`, with `recompute`.
pub fn activation_sizes(
    arch: &Architecture,
    batch: &Batch,
    dtype: Dtype,
    recompute: Recompute,
) -> ActivationSizes {
    let (b, s) = (batch.micro_batch, batch.sequence_length);
    let (h, inner, heads) = (arch.hidden, arch.intermediate, arch.heads);
    let scale = |bytes_16bit: u64| bytes_16bit / 2 * dtype.bytes();
    let full_block = scale(s * b * (18 * h + 4 * inner) + 5 * heads * s * s * b);
    let (kept, recomputed) = match recompute {
        Recompute::None => (full_block, 0),
        Recompute::PerBlock => (s * b * h * dtype.bytes(), full_block),
    };
    ActivationSizes {
        per_block_kept: kept,
        per_block_recomputed: recomputed,
        embedding: s * b * h * dtype.bytes(),
        logits: s * b * arch.vocab * (dtype.bytes() + 4),
    }
}
