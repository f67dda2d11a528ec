//! The model as the full estimate describes it: counts from the [`ModelSpec`], and the shape
//! its notes, the cost model and `recommend`'s configs read. (The memory terms come from the
//! plan's graph of the same spec, [`crate::plan::ModelGraph::for_estimate`].)
//!
//! When the spec carries no architecture (`--params`, or safetensors without a `config.json`),
//! the GPT-3-shaped decoder that [`crate::model::gpt_shape`] assumes for the largest layer is
//! assumed for the activations too, with the MLP width the plan's graph uses to hold exactly
//! the given count ([`crate::plan::assumed`]), and the assumption is reported.

use crate::memory::layer_dims;
pub use crate::memory::{Dropout, LayerDims, Mlp, NormKind};
use crate::model::architecture::{Architecture, Embeddings, Family};
use crate::model::{LmHead, ModelSpec, layouts};
use crate::plan::assumed::assumed_architecture;
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
}

impl ModelDims {
    /// Reads a model specification.
    pub fn from_spec(spec: &ModelSpec) -> ModelDims {
        let (arch, origin) = match spec.architecture {
            Some(arch) => (arch, ShapeOrigin::Given),
            None => (
                assumed_architecture(spec.total_params),
                ShapeOrigin::AssumedFromCount,
            ),
        };
        let head = spec.lm_head.map_or(LmHead::Include, |report| report.choice);
        let tensors = layouts::tensors(&arch, head);
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
        }
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
    fn counts_alone_assume_a_gpt3_shape() {
        let spec = load::from_params(13_000_000_000, None).expect("counts");
        let dims = ModelDims::from_spec(&spec);
        assert_eq!(dims.shape_origin, ShapeOrigin::AssumedFromCount);
        assert_eq!(dims.layers.self_attention_layers, 40);
        assert_eq!(dims.layers.hidden, 5120);
    }
}
