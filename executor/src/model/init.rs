//! Fresh parameters the way `transformers` initialises a `GPT2LMHeadModel`.
//!
//! Weights of `wte`, `wpe`, `c_attn`, `c_fc` ~ N(0, 0.02); the two `c_proj` weights per block
//! ~ N(0, 0.02 / sqrt(2 L)); biases 0; LayerNorm weights 1, biases 0. The random stream is
//! this crate's own (splitmix64 + Box-Muller), so values differ from torch's; the distribution
//! is the same.

use super::{Gpt2Config, ParamLayout};
use crate::tensor::Span;

/// Hugging Face's `initializer_range` default.
pub(crate) const INITIALIZER_RANGE: f64 = 0.02;

/// A deterministic stream of standard normal samples.
pub(crate) struct Normal {
    state: u64,
    spare: Option<f64>,
}

impl Normal {
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            state: seed,
            spare: None,
        }
    }

    /// splitmix64.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    pub(crate) fn sample(&mut self) -> f64 {
        if let Some(spare) = self.spare.take() {
            return spare;
        }
        let radius = (-2.0 * self.uniform().ln()).sqrt();
        let angle = std::f64::consts::TAU * self.uniform();
        self.spare = Some(radius * angle.sin());
        radius * angle.cos()
    }
}

/// A parameter buffer for `layout`, initialised as `transformers` does, from `seed`.
pub fn init_params(config: &Gpt2Config, layout: &ParamLayout, seed: u64) -> Vec<f32> {
    let mut params = vec![0.0f32; layout.num_params()];
    let mut normal = Normal::new(seed);
    let mut fill_normal = |params: &mut [f32], span: Span, std: f64| {
        for x in span.of_mut(params) {
            *x = (normal.sample() * std) as f32;
        }
    };
    let proj_std = INITIALIZER_RANGE / (2.0 * config.n_layer as f64).sqrt();
    fill_normal(&mut params, layout.wte, INITIALIZER_RANGE);
    fill_normal(&mut params, layout.wpe, INITIALIZER_RANGE);
    for block in &layout.blocks {
        fill_normal(&mut params, block.c_attn_weight, INITIALIZER_RANGE);
        fill_normal(&mut params, block.attn_proj_weight, proj_std);
        fill_normal(&mut params, block.fc_weight, INITIALIZER_RANGE);
        fill_normal(&mut params, block.mlp_proj_weight, proj_std);
        block.ln_1_weight.of_mut(&mut params).fill(1.0);
        block.ln_2_weight.of_mut(&mut params).fill(1.0);
    }
    layout.ln_f_weight.of_mut(&mut params).fill(1.0);
    params
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_has_the_documented_statistics() {
        let config = Gpt2Config {
            vocab_size: 512,
            n_positions: 32,
            n_embd: 64,
            n_layer: 2,
            n_head: 4,
            layer_norm_epsilon: 1e-5,
        };
        let layout = ParamLayout::new(&config);
        let params = init_params(&config, &layout, 7);
        let wte = layout.wte.of(&params);
        let n = wte.len() as f64;
        let mean = wte.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let std = (wte
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n)
            .sqrt();
        assert!(
            mean.abs() < 1e-3 && (std - 0.02).abs() < 1e-3,
            "mean {mean} std {std}"
        );
        let block = layout.blocks[1];
        assert!(block.ln_2_weight.of(&params).iter().all(|&x| x == 1.0));
        assert!(block.fc_bias.of(&params).iter().all(|&x| x == 0.0));
        assert_eq!(params, init_params(&config, &layout, 7));
    }
}
