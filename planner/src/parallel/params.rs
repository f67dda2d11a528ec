//! Parameters each pipeline rank holds, exactly: its transformer layers split over the
//! tensor-parallel ranks (layer norms and the row-parallel biases replicated), the word and
//! position embeddings on the first stage, the final norm and the output layer on the last
//! (with tied embeddings and `p > 1`, Megatron-LM and DeepSpeed's PipelineEngine keep a copy of
//! the word embedding there for the output).

use serde::Serialize;

use super::layout::Layout;
use super::shape::{LinearBias, Positions, TransformerShape};
use crate::model::Embeddings;

/// Parameters of one transformer layer on one tensor-parallel rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerParams {
    /// Split over the tensor-parallel ranks (QKV, projection, fc1, fc2 and their
    /// column-parallel biases).
    pub split: u64,
    /// Replicated on every tensor-parallel rank (layer norms, row-parallel biases).
    pub replicated: u64,
    /// The largest single weight matrix, elements.
    pub largest_weight: u64,
}

impl LayerParams {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.split + self.replicated
    }
}

/// One layer's parameters on one of `tensor` ranks (`vocab` already padded elsewhere).
pub fn layer_params(shape: &TransformerShape, tensor: u64) -> LayerParams {
    let h = shape.hidden;
    let q = shape.query_width() / tensor;
    let kv = shape.kv_channels * shape.query_groups.div_ceil(tensor);
    let f = shape.ffn_hidden / tensor;
    let gate = shape.mlp.fc1_width_factor();
    let qkv = h * (q + 2 * kv);
    let proj = q * h;
    let fc1 = h * f * gate;
    let fc2 = f * h;
    let (split_bias, replicated_bias) = match shape.bias {
        LinearBias::All => (q + 2 * kv + f * gate, 2 * h),
        LinearBias::QkvOnly => (q + 2 * kv, 0),
        LinearBias::None => (0, 0),
    };
    LayerParams {
        split: qkv + proj + fc1 + fc2 + split_bias,
        replicated: replicated_bias + 2 * shape.norm.params_per_channel() * h,
        largest_weight: qkv.max(proj).max(fc1).max(fc2),
    }
}

/// Parameters of one pipeline rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StageParams {
    /// Transformer layers on the rank (over all its model chunks).
    pub layers: u64,
    /// Their parameters.
    pub transformer: u64,
    /// Word and position embeddings (first stage).
    pub embedding: u64,
    /// Final norm and output layer, or the tied copy of the word embedding (last stage).
    pub output: u64,
    /// The largest single weight, elements (for a 16-bit weight gradient).
    pub largest_weight: u64,
}

impl StageParams {
    /// Everything on the rank.
    pub fn total(&self) -> u64 {
        self.transformer + self.embedding + self.output
    }
}

/// Parameters of pipeline rank `rank` (0-based), with the vocabulary padded to `padded_vocab`.
pub fn stage_params(
    shape: &TransformerShape,
    layout: &Layout,
    padded_vocab: u64,
    rank: u64,
) -> StageParams {
    let t = layout.tensor;
    let p = layout.pipeline;
    let layer = layer_params(shape, t);
    let layers = shape.layers / p;
    let h = shape.hidden;
    let word = padded_vocab * h / t;
    let first = rank == 0;
    let last = rank + 1 == p;
    let embedding = if first {
        word + match shape.positions {
            Positions::Learned { rows } => rows * h,
            Positions::Rotary => 0,
        }
    } else {
        0
    };
    let output = if last {
        let head = match (shape.embeddings, p) {
            (Embeddings::Untied, _) => word,
            (Embeddings::Tied, 1) => 0,
            (Embeddings::Tied, _) => word,
        };
        head + shape.norm.params_per_channel() * h
    } else {
        0
    };
    let mut largest_weight = layer.largest_weight;
    if embedding > 0 || output > shape.norm.params_per_channel() * h {
        largest_weight = largest_weight.max(word);
    }
    StageParams {
        layers,
        transformer: layers * layer.total(),
        embedding,
        output,
        largest_weight,
    }
}
