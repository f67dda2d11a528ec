//! [`ParamLayout`]: where every GPT-2 parameter lives in the flat parameter buffer.
//!
//! Tensors are packed in Hugging Face's `model.parameters()` order, under Hugging Face names,
//! so a DeepSpeed-style flat partition of this buffer cuts the same elements DeepSpeed would.
//! The gradient buffer has exactly the same layout. Conv1D weights are `[in, out]` (applied as
//! `y = x @ W + b`); the `lm_head` is tied to `wte` and has no entry of its own.
//!
//! Shapes, with `V` vocab, `maxT` positions, `C` channels, `L` layers:
//!
//! | name | shape |
//! |---|---|
//! | `transformer.wte.weight` | `(V, C)` |
//! | `transformer.wpe.weight` | `(maxT, C)` |
//! | `transformer.h.{l}.ln_1.weight`, `.bias` | `(C)` |
//! | `transformer.h.{l}.attn.c_attn.weight`, `.bias` | `(C, 3C)`, `(3C)` |
//! | `transformer.h.{l}.attn.c_proj.weight`, `.bias` | `(C, C)`, `(C)` |
//! | `transformer.h.{l}.ln_2.weight`, `.bias` | `(C)` |
//! | `transformer.h.{l}.mlp.c_fc.weight`, `.bias` | `(C, 4C)`, `(4C)` |
//! | `transformer.h.{l}.mlp.c_proj.weight`, `.bias` | `(4C, C)`, `(C)` |
//! | `transformer.ln_f.weight`, `.bias` | `(C)` |

use super::Gpt2Config;
use crate::tensor::{Span, TensorTable};

/// The spans of one transformer block's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockParams {
    /// `ln_1.weight` `(C)`.
    pub ln_1_weight: Span,
    /// `ln_1.bias` `(C)`.
    pub ln_1_bias: Span,
    /// `attn.c_attn.weight` `(C, 3C)`, output columns `[q | k | v]`.
    pub c_attn_weight: Span,
    /// `attn.c_attn.bias` `(3C)`.
    pub c_attn_bias: Span,
    /// `attn.c_proj.weight` `(C, C)`.
    pub attn_proj_weight: Span,
    /// `attn.c_proj.bias` `(C)`.
    pub attn_proj_bias: Span,
    /// `ln_2.weight` `(C)`.
    pub ln_2_weight: Span,
    /// `ln_2.bias` `(C)`.
    pub ln_2_bias: Span,
    /// `mlp.c_fc.weight` `(C, 4C)`.
    pub fc_weight: Span,
    /// `mlp.c_fc.bias` `(4C)`.
    pub fc_bias: Span,
    /// `mlp.c_proj.weight` `(4C, C)`.
    pub mlp_proj_weight: Span,
    /// `mlp.c_proj.bias` `(C)`.
    pub mlp_proj_bias: Span,
}

/// The parameter (and gradient) buffer layout of a GPT-2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    table: TensorTable,
    /// `transformer.wte.weight` `(V, C)`, also the tied `lm_head.weight`.
    pub wte: Span,
    /// `transformer.wpe.weight` `(maxT, C)`.
    pub wpe: Span,
    /// One entry per transformer block.
    pub blocks: Vec<BlockParams>,
    /// `transformer.ln_f.weight` `(C)`.
    pub ln_f_weight: Span,
    /// `transformer.ln_f.bias` `(C)`.
    pub ln_f_bias: Span,
}

impl ParamLayout {
    /// The layout for `config` (which the caller has validated).
    pub fn new(config: &Gpt2Config) -> Self {
        let (v, max_t, c) = (config.vocab_size, config.n_positions, config.n_embd);
        let mut table = TensorTable::new();
        let wte = table.push("transformer.wte.weight", &[v, c]);
        let wpe = table.push("transformer.wpe.weight", &[max_t, c]);
        let blocks = (0..config.n_layer)
            .map(|l| {
                let mut push = |suffix: &str, shape: &[usize]| {
                    table.push(format!("transformer.h.{l}.{suffix}"), shape)
                };
                BlockParams {
                    ln_1_weight: push("ln_1.weight", &[c]),
                    ln_1_bias: push("ln_1.bias", &[c]),
                    c_attn_weight: push("attn.c_attn.weight", &[c, 3 * c]),
                    c_attn_bias: push("attn.c_attn.bias", &[3 * c]),
                    attn_proj_weight: push("attn.c_proj.weight", &[c, c]),
                    attn_proj_bias: push("attn.c_proj.bias", &[c]),
                    ln_2_weight: push("ln_2.weight", &[c]),
                    ln_2_bias: push("ln_2.bias", &[c]),
                    fc_weight: push("mlp.c_fc.weight", &[c, 4 * c]),
                    fc_bias: push("mlp.c_fc.bias", &[4 * c]),
                    mlp_proj_weight: push("mlp.c_proj.weight", &[4 * c, c]),
                    mlp_proj_bias: push("mlp.c_proj.bias", &[c]),
                }
            })
            .collect();
        let ln_f_weight = table.push("transformer.ln_f.weight", &[c]);
        let ln_f_bias = table.push("transformer.ln_f.bias", &[c]);
        Self {
            table,
            wte,
            wpe,
            blocks,
            ln_f_weight,
            ln_f_bias,
        }
    }

    /// Every parameter tensor with its Hugging Face name and shape, in buffer order.
    pub fn table(&self) -> &TensorTable {
        &self.table
    }

    /// Number of parameters (elements of the flat buffer).
    pub fn num_params(&self) -> usize {
        self.table.total_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_124m_has_the_known_parameter_count() {
        let layout = ParamLayout::new(&Gpt2Config::gpt2());
        assert_eq!(layout.num_params(), 124_439_808);
        assert_eq!(layout.table().entries().len(), 2 + 12 * 12 + 2);
        assert_eq!(
            layout.table().entries()[4].name,
            "transformer.h.0.attn.c_attn.weight"
        );
        assert_eq!(layout.table().entries()[4].shape, vec![768, 2304]);
    }
}
