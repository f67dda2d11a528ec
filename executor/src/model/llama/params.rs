//! [`LlamaLayout`]: where every parameter of a Llama-family decoder lives in the flat buffer.
//!
//! Tensors are packed in Hugging Face's `named_parameters()` order under Hugging Face names
//! (a weight's bias right after it), so a DeepSpeed-style flat partition cuts the same
//! elements. Linear weights are `[out, in]`. With tied embeddings `lm_head` has no entry of
//! its own. `C` hidden, `NH`/`KV` heads, `hs` head width, `I` intermediate, `V` vocab:
//!
//! | name | shape |
//! |---|---|
//! | `model.embed_tokens.weight` | `(V, C)` |
//! | `model.layers.{l}.self_attn.q_proj.weight`, `.bias` (Qwen2) | `(NH*hs, C)`, `(NH*hs)` |
//! | `model.layers.{l}.self_attn.k_proj.weight`, `.bias` | `(KV*hs, C)`, `(KV*hs)` |
//! | `model.layers.{l}.self_attn.v_proj.weight`, `.bias` | `(KV*hs, C)`, `(KV*hs)` |
//! | `model.layers.{l}.self_attn.o_proj.weight`, `.bias` (`attention_bias`) | `(C, NH*hs)`, `(C)` |
//! | `model.layers.{l}.mlp.gate_proj.weight` | `(I, C)` |
//! | `model.layers.{l}.mlp.up_proj.weight` | `(I, C)` |
//! | `model.layers.{l}.mlp.down_proj.weight` | `(C, I)` |
//! | `model.layers.{l}.input_layernorm.weight` | `(C)` |
//! | `model.layers.{l}.post_attention_layernorm.weight` | `(C)` |
//! | `model.norm.weight` | `(C)` |
//! | `lm_head.weight` (untied only) | `(V, C)` |
//!
//! Units ([`ParamUnit`]): `Embedding` is `embed_tokens`; `Block(l)` layer `l`; `FinalNorm` is
//! `model.norm` and, untied, `lm_head`.

use dsplan_planner::model::Embeddings;

use super::config::{AttentionBias, LlamaConfig};
use crate::model::units::{ParamTable, ParamUnit};
use crate::tensor::{Span, TensorTable};

/// The spans of one decoder layer's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaBlockParams {
    /// `self_attn.q_proj.weight` `(NH*hs, C)`.
    pub q_weight: Span,
    /// `self_attn.q_proj.bias` `(NH*hs)`.
    pub q_bias: Option<Span>,
    /// `self_attn.k_proj.weight` `(KV*hs, C)`.
    pub k_weight: Span,
    /// `self_attn.k_proj.bias` `(KV*hs)`.
    pub k_bias: Option<Span>,
    /// `self_attn.v_proj.weight` `(KV*hs, C)`.
    pub v_weight: Span,
    /// `self_attn.v_proj.bias` `(KV*hs)`.
    pub v_bias: Option<Span>,
    /// `self_attn.o_proj.weight` `(C, NH*hs)`.
    pub o_weight: Span,
    /// `self_attn.o_proj.bias` `(C)`.
    pub o_bias: Option<Span>,
    /// `mlp.gate_proj.weight` `(I, C)`.
    pub gate_weight: Span,
    /// `mlp.up_proj.weight` `(I, C)`.
    pub up_weight: Span,
    /// `mlp.down_proj.weight` `(C, I)`.
    pub down_weight: Span,
    /// `input_layernorm.weight` `(C)`.
    pub input_norm: Span,
    /// `post_attention_layernorm.weight` `(C)`.
    pub post_attention_norm: Span,
}

/// The parameter (and gradient) buffer layout of a Llama-family decoder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaLayout {
    table: TensorTable,
    /// `model.embed_tokens.weight` `(V, C)`.
    pub embed: Span,
    /// One entry per layer.
    pub blocks: Vec<LlamaBlockParams>,
    /// `model.norm.weight` `(C)`.
    pub norm: Span,
    /// `lm_head.weight` `(V, C)`: its own span when untied, `embed` when tied.
    pub lm_head: Span,
}

impl LlamaLayout {
    /// The layout for `config` (validated by the caller).
    pub fn new(config: &LlamaConfig) -> Self {
        let (v, c, i) = (
            config.vocab_size,
            config.hidden_size,
            config.intermediate_size,
        );
        let (q, kv) = (config.q_width(), config.kv_width());
        let (qkv_bias, o_bias) = match config.attention_bias {
            AttentionBias::Absent => (false, false),
            AttentionBias::Qkv => (true, false),
            AttentionBias::QkvO => (true, true),
        };
        let mut table = TensorTable::new();
        let embed = table.push("model.embed_tokens.weight", &[v, c]);
        let blocks = (0..config.num_hidden_layers)
            .map(|l| {
                let mut push = |suffix: &str, shape: &[usize]| {
                    table.push(format!("model.layers.{l}.{suffix}"), shape)
                };
                let q_weight = push("self_attn.q_proj.weight", &[q, c]);
                let q_bias = qkv_bias.then(|| push("self_attn.q_proj.bias", &[q]));
                let k_weight = push("self_attn.k_proj.weight", &[kv, c]);
                let k_bias = qkv_bias.then(|| push("self_attn.k_proj.bias", &[kv]));
                let v_weight = push("self_attn.v_proj.weight", &[kv, c]);
                let v_bias = qkv_bias.then(|| push("self_attn.v_proj.bias", &[kv]));
                let o_weight = push("self_attn.o_proj.weight", &[c, q]);
                let o_bias = o_bias.then(|| push("self_attn.o_proj.bias", &[c]));
                LlamaBlockParams {
                    q_weight,
                    q_bias,
                    k_weight,
                    k_bias,
                    v_weight,
                    v_bias,
                    o_weight,
                    o_bias,
                    gate_weight: push("mlp.gate_proj.weight", &[i, c]),
                    up_weight: push("mlp.up_proj.weight", &[i, c]),
                    down_weight: push("mlp.down_proj.weight", &[c, i]),
                    input_norm: push("input_layernorm.weight", &[c]),
                    post_attention_norm: push("post_attention_layernorm.weight", &[c]),
                }
            })
            .collect();
        let norm = table.push("model.norm.weight", &[c]);
        let lm_head = match config.embeddings {
            Embeddings::Tied => embed,
            Embeddings::Untied => table.push("lm_head.weight", &[v, c]),
        };
        Self {
            table,
            embed,
            blocks,
            norm,
            lm_head,
        }
    }

    /// Every parameter tensor with its Hugging Face name and shape, in buffer order.
    pub fn table(&self) -> &TensorTable {
        &self.table
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.table.total_len()
    }

    /// Every unit, in buffer order.
    pub fn units(&self) -> Vec<ParamUnit> {
        std::iter::once(ParamUnit::Embedding)
            .chain((0..self.blocks.len()).map(ParamUnit::Block))
            .chain(std::iter::once(ParamUnit::FinalNorm))
            .collect()
    }

    /// Where `unit` lives (an empty span for a block that does not exist).
    pub fn unit_span(&self, unit: ParamUnit) -> Span {
        let covering = |first: Span, last: Span| Span::new(first.offset, last.end() - first.offset);
        match unit {
            ParamUnit::Embedding => self.embed,
            ParamUnit::Block(l) => match self.blocks.get(l) {
                Some(block) => covering(block.q_weight, block.post_attention_norm),
                None => Span::new(0, 0),
            },
            ParamUnit::FinalNorm => {
                let last = if self.lm_head == self.embed {
                    self.norm
                } else {
                    self.lm_head
                };
                covering(self.norm, last)
            }
        }
    }

    /// Whether `lm_head` is `embed_tokens`.
    pub fn tied(&self) -> bool {
        self.lm_head == self.embed
    }
}

impl ParamTable for LlamaLayout {
    fn tensors(&self) -> &TensorTable {
        self.table()
    }

    fn units(&self) -> Vec<ParamUnit> {
        LlamaLayout::units(self)
    }

    fn unit_span(&self, unit: ParamUnit) -> Span {
        LlamaLayout::unit_span(self, unit)
    }
}
