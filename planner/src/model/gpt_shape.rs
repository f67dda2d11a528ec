//! The shape dsplan assumes when only a parameter count is given.
//!
//! DeepSpeed's ZeRO-3 estimator needs the largest layer as well as the total. When the user
//! gives only `--params`, dsplan assumes a GPT-3-shaped decoder: width = 128 x layers (the
//! aspect ratio of GPT-3 6.7B, 13B and 175B), heads of 128, a 4x MLP, GPT-2's vocabulary of
//! 50,257 tokens, 2,048 learned positions and tied embeddings. Of all depths, the one whose
//! parameter count is closest by ratio to the given total is taken, and its largest module is
//! the largest layer (capped at the total). For most sizes that module is the token embedding
//! (50,257 x width); from 99 layers (width 12,672) on, the MLP's first projection is larger.

use super::LmHead;
use super::architecture::{Architecture, Embeddings, Family};
use super::layouts;
use super::notes::Note;
use super::tensors;

/// The rule, in words, as reported in [`Note::InferredLargestLayer`].
pub const RULE: &str = "GPT-3-shaped decoder (width = 128 x layers, heads of 128, 4x MLP, vocabulary 50257, 2048 positions, tied embeddings) with the parameter count closest to the given one";

const WIDTH_PER_LAYER: u64 = 128;
const VOCAB: u64 = 50_257;
const POSITIONS: u64 = 2048;
/// Deeper than any model: the search stops here (width 1,048,576).
const MAX_LAYERS: u64 = 8192;

/// The assumed shape with `layers` layers.
pub fn shape(layers: u64) -> Architecture {
    let hidden = WIDTH_PER_LAYER * layers;
    Architecture {
        family: Family::Gpt2,
        layers,
        hidden,
        heads: layers,
        kv_heads: layers,
        head_dim: WIDTH_PER_LAYER,
        intermediate: 4 * hidden,
        vocab: VOCAB,
        positions: Some(POSITIONS),
        embeddings: Embeddings::Tied,
    }
}

/// Parameters of [`shape`]`(layers)`, in closed form: embeddings `(V + P) h`, per block
/// `12 h^2 + 13 h`, final norm `2 h`.
pub fn shape_params(layers: u64) -> u64 {
    let h = u128::from(WIDTH_PER_LAYER * layers);
    let n = u128::from(layers);
    let total = u128::from(VOCAB + POSITIONS) * h + n * (12 * h * h + 13 * h) + 2 * h;
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// The depth whose [`shape_params`] is closest to `total_params` by ratio.
pub fn closest_layers(total_params: u64) -> u64 {
    let target = total_params.max(1) as f64;
    let distance = |layers: u64| {
        let params = shape_params(layers) as f64;
        (params / target).max(target / params)
    };
    let mut best = 1;
    for layers in 1..=MAX_LAYERS {
        if distance(layers) < distance(best) {
            best = layers;
        }
        if shape_params(layers) >= total_params {
            break;
        }
    }
    best
}

/// The largest layer assumed for a model of `total_params` parameters, with the note that
/// reports the assumption.
pub fn infer_largest_layer(total_params: u64) -> (u64, Note) {
    let layers = closest_layers(total_params);
    let shape = shape(layers);
    let counted = tensors::count(&layouts::tensors(&shape, LmHead::Exclude));
    let largest_layer_params = counted.largest_layer.params.min(total_params);
    let note = Note::InferredLargestLayer {
        rule: RULE,
        shape,
        shape_params: counted.total,
        module: counted.largest_layer.module.unwrap_or_default(),
        largest_layer_params,
    };
    (largest_layer_params, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_form_matches_the_tensor_list() {
        for layers in [1, 7, 24, 96] {
            let listed = tensors::count(&layouts::tensors(&shape(layers), LmHead::Exclude)).total;
            assert_eq!(shape_params(layers), listed, "{layers} layers");
        }
    }

    #[test]
    fn gpt3_175b_is_recovered() {
        // 96 layers of width 12288: GPT-3 175B's shape.
        assert_eq!(closest_layers(175_000_000_000), 96);
        let (largest, note) = infer_largest_layer(175_000_000_000);
        // At width 12288 the embedding (50257 x 12288) is still the largest module.
        assert_eq!(largest, 50_257 * 12_288);
        assert!(
            matches!(note, Note::InferredLargestLayer { ref module, .. } if module == "transformer.wte")
        );
    }

    #[test]
    fn wide_shapes_switch_to_the_mlp() {
        let (largest, note) = infer_largest_layer(1_000_000_000_000);
        let Note::InferredLargestLayer { shape, module, .. } = note else {
            panic!("inferred note")
        };
        assert!(module.ends_with("mlp.c_fc"), "{module}");
        assert_eq!(largest, 4 * shape.hidden * shape.hidden + 4 * shape.hidden);
    }

    #[test]
    fn tiny_totals_cap_the_largest_layer() {
        let (largest, _) = infer_largest_layer(7);
        assert_eq!(largest, 7);
    }
}
