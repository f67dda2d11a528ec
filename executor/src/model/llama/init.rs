//! Fresh parameters the way `transformers` initialises a Llama-family model: every Linear and
//! Embedding weight ~ N(0, 0.02), biases 0, RMSNorm weights 1 (dsplan's own random stream, as
//! for GPT-2).

use super::LlamaLayout;
use crate::model::init::{INITIALIZER_RANGE, Normal};
use crate::tensor::Span;

/// A parameter buffer for `layout`, initialised from `seed`.
pub fn init_llama_params(layout: &LlamaLayout, seed: u64) -> Vec<f32> {
    let mut params = vec![0.0f32; layout.num_params()];
    let mut normal = Normal::new(seed);
    let mut fill_normal = |params: &mut [f32], span: Span| {
        for x in span.of_mut(params) {
            *x = (normal.sample() * INITIALIZER_RANGE) as f32;
        }
    };
    fill_normal(&mut params, layout.embed);
    for block in &layout.blocks {
        for span in [
            block.q_weight,
            block.k_weight,
            block.v_weight,
            block.o_weight,
            block.gate_weight,
            block.up_weight,
            block.down_weight,
        ] {
            fill_normal(&mut params, span);
        }
        block.input_norm.of_mut(&mut params).fill(1.0);
        block.post_attention_norm.of_mut(&mut params).fill(1.0);
    }
    layout.norm.of_mut(&mut params).fill(1.0);
    if !layout.tied() {
        fill_normal(&mut params, layout.lm_head);
    }
    params
}
