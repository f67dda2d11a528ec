//! The model as the full estimate sees it: counts from the [`ModelSpec`], and the shape and
//! tensor list the activation, persistence and staging terms need.
//!
//! When the spec carries no architecture (`--params`, or safetensors without a `config.json`),
//! the GPT-3-shaped decoder that [`crate::model::gpt_shape`] assumes for the largest layer is
//! assumed for the activations too, and the assumption is reported.

use crate::model::architecture::{Architecture, Embeddings, Family, FeedForward};
use crate::model::{LmHead, ModelSpec, gpt_shape, layouts};
use serde::Serialize;

/// Whether the shape came with the model or was assumed from its parameter count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShapeOrigin {
    /// From the preset or `config.json`.
    Given,
    /// Assumed: a GPT-3-shaped decoder of about the given size.
    AssumedFromCount,
}

/// How a family normalises, which decides the bytes its norms store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// `nn.LayerNorm`: the input is stored in the activation dtype.
    LayerNorm,
    /// Hugging Face's RMSNorm (Llama, Mistral, Qwen2, T5): the input is upcast, so an fp32
    /// copy (4 bytes per element) is what backward keeps.
    RmsNormUpcast,
}

/// Whether the family's default config trains with dropout (so 1-byte masks are stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dropout {
    /// Dropout probability > 0 (GPT-2, BERT, T5): masks are stored.
    Present,
    /// Dropout 0 (Llama, Mistral, Qwen2, BLOOM): PyTorch skips it, nothing is stored.
    Absent,
}

/// Whether the MLP is gated (SwiGLU, gated-GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mlp {
    /// `up -> activation -> down`.
    Dense,
    /// `down(act(gate(x)) * up(x))`.
    Gated,
}

/// The dimensions the activation formulas use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerDims {
    /// Decoder (or encoder) blocks with one attention each.
    pub self_attention_layers: u64,
    /// Blocks with an extra cross-attention (T5's decoder).
    pub cross_attention_layers: u64,
    /// Model width.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// `heads x head_dim`.
    pub attention_width: u64,
    /// `kv_heads x head_dim`.
    pub kv_width: u64,
    /// MLP inner width.
    pub intermediate: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Dense or gated MLP.
    pub mlp: Mlp,
    /// Norm kind.
    pub norm: NormKind,
    /// Dropout or not.
    pub dropout: Dropout,
}

/// Everything about the model the full estimate reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelDims {
    /// Parameters, from the spec (each shared storage once).
    pub total_params: u64,
    /// DeepSpeed's largest layer, from the spec.
    pub largest_layer: u64,
    /// The largest single tensor (sizes the ZeRO-1/2 offload staging buffers).
    pub largest_tensor: u64,
    /// Parameters that are a matrix multiply per token (excludes the input embedding and
    /// learned positions, unless tied to the LM head), for FLOP counts.
    pub matmul_params: u64,
    /// The shape.
    pub layers: LayerDims,
    /// Given or assumed.
    pub shape_origin: ShapeOrigin,
    /// Element counts of the tensors with their own storage, in `named_parameters` order.
    #[serde(skip)]
    pub tensor_numels: Vec<u64>,
}

impl ModelDims {
    /// Reads a model specification.
    pub fn from_spec(spec: &ModelSpec) -> ModelDims {
        let (arch, origin) = match spec.architecture {
            Some(arch) => (arch, ShapeOrigin::Given),
            None => (
                gpt_shape::shape(gpt_shape::closest_layers(spec.total_params)),
                ShapeOrigin::AssumedFromCount,
            ),
        };
        let head = spec.lm_head.map_or(LmHead::Include, |report| report.choice);
        let tensors = layouts::tensors(&arch, head);
        let tensor_numels: Vec<u64> = tensors
            .iter()
            .filter(|t| t.storage == crate::model::tensors::Storage::Owned)
            .map(|t| t.numel)
            .collect();
        let largest_tensor = tensors
            .iter()
            .map(|t| t.numel)
            .max()
            .unwrap_or(0)
            .min(spec.total_params);
        ModelDims {
            total_params: spec.total_params,
            largest_layer: spec.largest_layer.params,
            largest_tensor,
            matmul_params: matmul_params(&arch, spec.total_params),
            layers: layer_dims(&arch),
            shape_origin: origin,
            tensor_numels,
        }
    }

    /// Parameters with at most `threshold` elements, in order, until their running sum would
    /// pass `limit` (DeepSpeed's persistence rule, deepspeed-facts §4.6).
    pub fn persistent_params(&self, threshold: u64, limit: Option<u64>) -> u64 {
        let mut kept: u64 = 0;
        for &numel in &self.tensor_numels {
            if numel > threshold {
                continue;
            }
            let next = kept.saturating_add(numel);
            if limit.is_some_and(|limit| next > limit) {
                continue;
            }
            kept = next;
        }
        kept.min(self.total_params)
    }
}

/// The per-layer dimensions of an architecture.
fn layer_dims(arch: &Architecture) -> LayerDims {
    let (self_layers, cross_layers) = match arch.family {
        Family::T5 { decoder_layers, .. } => (arch.layers + decoder_layers, decoder_layers),
        _ => (arch.layers, 0),
    };
    let mlp = match arch.family {
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 => Mlp::Gated,
        Family::T5 {
            feed_forward: FeedForward::Gated,
            ..
        } => Mlp::Gated,
        _ => Mlp::Dense,
    };
    let norm = match arch.family {
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 | Family::T5 { .. } => {
            NormKind::RmsNormUpcast
        }
        Family::Gpt2 | Family::Bert { .. } | Family::Bloom => NormKind::LayerNorm,
    };
    let dropout = match arch.family {
        Family::Gpt2 | Family::Bert { .. } | Family::T5 { .. } => Dropout::Present,
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 | Family::Bloom => Dropout::Absent,
    };
    LayerDims {
        self_attention_layers: self_layers,
        cross_attention_layers: cross_layers,
        hidden: arch.hidden,
        heads: arch.heads,
        attention_width: arch.attention_width(),
        kv_width: arch.kv_width(),
        intermediate: arch.intermediate,
        vocab: arch.vocab,
        mlp,
        norm,
        dropout,
    }
}

/// Parameters used as matrix multiplies: the total, less the input embedding when the LM head
/// has its own matrix (the lookup costs no FLOPs) and less learned positions.
fn matmul_params(arch: &Architecture, total: u64) -> u64 {
    let embedding = arch.vocab.saturating_mul(arch.hidden);
    let positions = match arch.family {
        Family::Gpt2 | Family::Bert { .. } => {
            arch.positions.unwrap_or(0).saturating_mul(arch.hidden)
        }
        _ => 0,
    };
    let lookup_only = match arch.embeddings {
        Embeddings::Untied => embedding,
        Embeddings::Tied => 0,
    };
    total
        .saturating_sub(lookup_only)
        .saturating_sub(positions)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{load, presets};

    fn preset(name: &str, head: LmHead) -> ModelSpec {
        let preset = presets::lookup(name).expect("preset");
        load::from_preset(preset, head).expect("counts")
    }

    #[test]
    fn llama_is_gated_rms_without_dropout() {
        let dims = ModelDims::from_spec(&preset("llama-2-70b", LmHead::Include));
        assert_eq!(dims.layers.mlp, Mlp::Gated);
        assert_eq!(dims.layers.norm, NormKind::RmsNormUpcast);
        assert_eq!(dims.layers.dropout, Dropout::Absent);
        assert_eq!(dims.layers.kv_width, 8 * 128);
        // The untied input embedding is a lookup: 32000 x 8192 fewer matmul parameters.
        assert_eq!(dims.matmul_params, dims.total_params - 32_000 * 8192);
        // The largest tensor is an embedding matrix (32000 x 8192 > 28672 x 8192).
        assert_eq!(dims.largest_tensor, 32_000 * 8192);
    }

    #[test]
    fn persistence_keeps_small_tensors_in_order_under_the_limit() {
        let dims = ModelDims::from_spec(&preset("gpt2", LmHead::Include));
        // GPT-2 small: every bias and LayerNorm vector (<= 3 x 768) is persistent at 1e5.
        let small: u64 = dims.tensor_numels.iter().filter(|&&n| n <= 100_000).sum();
        assert_eq!(dims.persistent_params(100_000, None), small);
        assert!(small > 0);
        assert_eq!(dims.persistent_params(100_000, Some(0)), 0);
        assert_eq!(dims.persistent_params(0, None), 0);
    }

    #[test]
    fn counts_alone_assume_a_gpt3_shape() {
        let spec = load::from_params(13_000_000_000, None).expect("counts");
        let dims = ModelDims::from_spec(&spec);
        assert_eq!(dims.shape_origin, ShapeOrigin::AssumedFromCount);
        assert_eq!(dims.layers.self_attention_layers, 40);
        assert_eq!(dims.layers.hidden, 5120);
    }
}
