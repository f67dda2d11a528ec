//! Activation bytes of one transformer layer for one micro-batch on one GPU, counted tensor by
//! tensor as Megatron-LM (Transformer Engine) keeps them for backward.
//!
//! Per layer, with `T = s·b` tokens (÷ `u` under Ulysses), `e` bytes per element, `q`/`kv`
//! the query/key widths, `f` the MLP width, `t` the tensor-parallel degree:
//!
//! | tensor | bytes | split |
//! |---|---|---|
//! | input and output of both layer norms | `4·e·T·h` | `÷t` with Megatron SP |
//! | norm statistics (fp32 mean and rstd) | `2·8·T` (LayerNorm), `2·4·T` (RMSNorm) | `÷t` with SP |
//! | hidden-dropout masks (attention and MLP outputs) | `2·T·h` | `÷t` with SP |
//! | flash attention: Q, K, V, output, fp32 log-sum-exp | `e·T·(2q + 2kv)/t + 4·T·a/t` | `÷t` |
//! | eager attention: Q, K and V (expanded to all heads), scores, context | `4·e·T·q/t + e·a·s·T/t` (+ `3·a·s·T/t` with attention dropout) | `÷t` |
//! | MLP: fc1 output, activation output | `e·T·f·(g + 1)/t` (`g = 2` for SwiGLU) | `÷t` |
//!
//! For GPT-3 shapes (no GQA, eager attention, dropout) this is Korthikanti et al.'s
//! `s·b·h·(34 + 5·a·s/h)` per layer; with grouped-query and flash attention it is smaller.
//! Selective recompute drops what the core attention recomputes (scores; flash's statistics);
//! full recompute keeps each group's input only, and rebuilds one group in backward.

use serde::Serialize;

use super::layout::{DropoutUse, Job, Recompute, SequenceParallel};
use super::shape::Norm;
use crate::memory::AttentionKernel;

/// Tokens of one micro-batch on one GPU, and what the sequence split divides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tokens {
    /// `s·b ÷ u`.
    pub tokens: u64,
    /// The divisor of the tensors Megatron's SP splits (`t` with SP, else 1).
    pub sequence_split: u64,
}

impl Tokens {
    /// The tokens of `job`'s micro-batch on one GPU.
    pub fn of(job: &Job) -> Tokens {
        let ulysses = job.layout.sequence.ulysses_degree();
        Tokens {
            tokens: job.batch.seq_len * job.batch.micro_batch / ulysses,
            sequence_split: match job.layout.sequence {
                SequenceParallel::Megatron => job.layout.tensor,
                _ => 1,
            },
        }
    }
}

/// One layer's activations, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerActivations {
    /// Everything the layer stores without recomputation.
    pub full: u64,
    /// What it stores with the job's recompute setting, per layer (full recompute: the
    /// group's input, spread over its layers; see [`stored_per_chunk`]).
    pub layer_input: u64,
    /// What selective recompute drops.
    pub recomputed_by_selective: u64,
    /// The largest gradient working set of the layer's backward (beyond what it stores).
    pub backward_working: u64,
}

/// One layer's activations for `job`.
pub fn layer_activations(job: &Job) -> LayerActivations {
    let shape = &job.shape;
    let e = job.training.precision.element_bytes();
    let Tokens {
        tokens: tk,
        sequence_split,
    } = Tokens::of(job);
    let t = job.layout.tensor;
    let h = shape.hidden;
    let q = shape.query_width();
    let kv = shape.kv_channels * shape.query_groups.div_ceil(t) * t;
    let heads = shape.heads;
    let f = shape.ffn_hidden;
    let gate = shape.mlp.fc1_width_factor();
    let seq = job.batch.seq_len;
    let hidden_masks = match job.training.dropout.hidden {
        DropoutUse::Applied => 2 * tk * h,
        DropoutUse::Skipped => 0,
    };
    let norm_stats = match shape.norm {
        Norm::LayerNorm => 2 * 8 * tk,
        Norm::RmsNorm => 2 * 4 * tk,
    };
    let replicated = (4 * e * tk * h + norm_stats + hidden_masks) / sequence_split;
    let (attention, recomputable) = match job.training.attention {
        AttentionKernel::Flash => {
            let lse = 4 * tk * heads / t;
            (e * tk * (2 * q + 2 * kv) / t + lse, lse)
        }
        AttentionKernel::Eager => {
            let scores = heads * seq * tk / t;
            let dropout = match job.training.dropout.attention {
                DropoutUse::Applied => scores + e * scores,
                DropoutUse::Skipped => 0,
            };
            (
                4 * e * tk * q / t + e * scores + dropout,
                e * scores + dropout,
            )
        }
    };
    let mlp = e * tk * f * (gate + 1) / t;
    let full = replicated + attention + mlp;
    LayerActivations {
        full,
        layer_input: e * tk * h / sequence_split,
        recomputed_by_selective: recomputable,
        backward_working: e * tk * (f * (gate + 1) / t + 2 * h),
    }
}

/// Bytes one model chunk of `layers` layers stores for one micro-batch under `recompute`,
/// and the extra bytes rebuilt while recomputing during its backward.
pub fn stored_per_chunk(job: &Job, layers: u64) -> (u64, u64) {
    let layer = layer_activations(job);
    match job.training.recompute {
        Recompute::None => (layers * layer.full, 0),
        Recompute::Selective => (layers * (layer.full - layer.recomputed_by_selective), 0),
        Recompute::Full {
            method,
            layers: group,
        } => match method {
            super::layout::RecomputeMethod::Uniform => {
                let group = group.max(1).min(layers.max(1));
                (
                    layers.div_ceil(group) * layer.layer_input,
                    group * layer.full,
                )
            }
            super::layout::RecomputeMethod::Block => {
                let recomputed = group.min(layers);
                (
                    recomputed * layer.layer_input + (layers - recomputed) * layer.full,
                    if recomputed > 0 { layer.full } else { 0 },
                )
            }
        },
    }
}
