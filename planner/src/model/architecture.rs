//! Transformer architectures dsplan can count: the shape of a model, family by family.
//!
//! An [`Architecture`] is enough to list every parameter tensor of the Hugging Face
//! implementation (names included, see [`super::layouts`]), so parameter counts are computed,
//! never typed in.

use super::error::ModelError;
use serde::Serialize;

/// Whether a bias vector is present.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bias {
    /// The projection has a bias.
    Present,
    /// The projection has no bias.
    Absent,
}

/// Whether the output projection (LM head) shares the input embedding's storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Embeddings {
    /// `tie_word_embeddings = true`: the LM head adds no parameters.
    Tied,
    /// The LM head is its own `vocab x hidden` matrix.
    Untied,
}

/// T5's feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FeedForward {
    /// `wi`, `wo` (original T5, `feed_forward_proj = "relu"`).
    Dense,
    /// `wi_0`, `wi_1`, `wo` (T5 v1.1, `feed_forward_proj = "gated-gelu"`).
    Gated,
}

/// The model family, with the knobs that only that family has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "family", rename_all = "lowercase")]
pub enum Family {
    /// GPT-2: learned positions, fused QKV with biases, LayerNorm with biases, GELU MLP.
    Gpt2,
    /// Llama: rotary positions, RMSNorm, SwiGLU MLP, optional biases (`attention_bias`,
    /// `mlp_bias`, both absent in the released models).
    Llama {
        /// Bias on q, k, v and o projections.
        attention_bias: Bias,
        /// Bias on gate, up and down projections.
        mlp_bias: Bias,
    },
    /// Mistral: the Llama layout, no biases.
    Mistral,
    /// Qwen2: the Llama layout with biases on q, k and v (not o).
    Qwen2,
    /// T5 encoder-decoder: relative attention bias in each stack's first block, RMS-style
    /// LayerNorm without bias, no biases anywhere.
    T5 {
        /// Decoder blocks (`num_decoder_layers`); `layers` counts the encoder's.
        decoder_layers: u64,
        /// Dense or gated feed-forward.
        feed_forward: FeedForward,
        /// `relative_attention_num_buckets`.
        relative_attention_buckets: u64,
    },
    /// BERT encoder: learned positions and token types, biases everywhere, a pooler in the
    /// base model; the LM head is BertForMaskedLM's `cls.predictions`.
    Bert {
        /// `type_vocab_size`.
        type_vocab_size: u64,
    },
    /// BLOOM: ALiBi positions, embedding LayerNorm, fused QKV, biases everywhere.
    Bloom,
}

impl Family {
    /// The Hugging Face `model_type`.
    pub fn model_type(&self) -> &'static str {
        match self {
            Family::Gpt2 => "gpt2",
            Family::Llama { .. } => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::T5 { .. } => "t5",
            Family::Bert { .. } => "bert",
            Family::Bloom => "bloom",
        }
    }
}

/// The shape of a transformer, enough to list all its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Architecture {
    /// Family and family-specific knobs.
    #[serde(flatten)]
    pub family: Family,
    /// Transformer blocks (the encoder's for T5).
    pub layers: u64,
    /// Model width (`hidden_size`, `n_embd`, `d_model`).
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// Key/value heads (equal to `heads` without grouped-query attention).
    pub kv_heads: u64,
    /// Width of one head (`hidden / heads` unless the config says otherwise, e.g. T5's `d_kv`).
    pub head_dim: u64,
    /// MLP inner width (`intermediate_size`, `n_inner`, `d_ff`).
    pub intermediate: u64,
    /// Vocabulary size.
    pub vocab: u64,
    /// Context length: learned position rows (GPT-2, BERT) or `max_position_embeddings`
    /// (rotary, ALiBi); `None` for T5's relative positions.
    pub positions: Option<u64>,
    /// Tied or untied input and output embeddings.
    pub embeddings: Embeddings,
}

/// The largest value dsplan accepts for each dimension, by the name errors give it. Far above
/// any real model (the deepest have a few hundred layers, the widest a hidden size of a few
/// tens of thousands, vocabularies of a few hundred thousand), and low enough that a config
/// with a mistyped size is refused at once instead of a plan growing a graph of 10^9 layers
/// until the machine runs out of memory. Every product of three stays exact in u128.
pub const DIMENSION_LIMITS: [(&str, u64); 11] = [
    ("layers", 1 << 14),
    ("decoder_layers", 1 << 14),
    ("hidden", 1 << 20),
    ("heads", 1 << 16),
    ("kv_heads", 1 << 16),
    ("head_dim", 1 << 16),
    ("intermediate", 1 << 22),
    ("vocab", 1 << 24),
    ("type_vocab_size", 1 << 24),
    ("positions", 1 << 24),
    ("relative_attention_buckets", 1 << 16),
];

/// The limit of dimension `name` ([`DIMENSION_LIMITS`]).
fn dimension_limit(name: &str) -> u64 {
    DIMENSION_LIMITS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(1 << 32, |&(_, limit)| limit)
}

impl Architecture {
    /// Checks that every dimension is at least 1 and at most its limit
    /// ([`DIMENSION_LIMITS`]), and that the heads divide what they must.
    pub fn validate(&self) -> Result<(), ModelError> {
        let mut dims = vec![
            ("layers", self.layers),
            ("hidden", self.hidden),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate", self.intermediate),
            ("vocab", self.vocab),
        ];
        if let Some(positions) = self.positions {
            dims.push(("positions", positions));
        }
        match self.family {
            Family::T5 {
                decoder_layers,
                relative_attention_buckets,
                ..
            } => {
                dims.push(("decoder_layers", decoder_layers));
                dims.push(("relative_attention_buckets", relative_attention_buckets));
            }
            Family::Bert { type_vocab_size } => dims.push(("type_vocab_size", type_vocab_size)),
            _ => {}
        }
        for (name, value) in dims {
            let limit = dimension_limit(name);
            if value == 0 || value > limit {
                return Err(ModelError::BadArchitecture {
                    reason: format!("`{name}` is {value}; it must be between 1 and {limit}"),
                });
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(ModelError::BadArchitecture {
                reason: format!(
                    "{} attention heads cannot be grouped over {} key/value heads",
                    self.heads, self.kv_heads
                ),
            });
        }
        Ok(())
    }

    /// Attention width: `heads * head_dim`.
    pub fn attention_width(&self) -> u64 {
        self.heads.saturating_mul(self.head_dim)
    }

    /// Key/value width: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> u64 {
        self.kv_heads.saturating_mul(self.head_dim)
    }

    /// One line describing the shape, for human output.
    pub fn describe(&self) -> String {
        let layers = match self.family {
            Family::T5 { decoder_layers, .. } => {
                format!("{}+{} layers", self.layers, decoder_layers)
            }
            _ => format!("{} layers", self.layers),
        };
        let heads = if self.kv_heads == self.heads {
            format!("{} heads of {}", self.heads, self.head_dim)
        } else {
            format!(
                "{} heads of {} ({} key/value)",
                self.heads, self.head_dim, self.kv_heads
            )
        };
        let feed_forward = match self.family {
            Family::T5 {
                feed_forward: FeedForward::Gated,
                ..
            } => " (gated)",
            _ => "",
        };
        let positions = self.positions.map_or(String::new(), |positions| {
            format!(", {positions} positions")
        });
        let embeddings = match self.embeddings {
            Embeddings::Tied => "tied",
            Embeddings::Untied => "untied",
        };
        format!(
            "{}: {layers}, hidden {}, {heads}, intermediate {}{feed_forward}, vocab {}{positions}, {embeddings} embeddings",
            self.family.model_type(),
            self.hidden,
            self.intermediate,
            self.vocab
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dimension_is_bounded_and_named() {
        let gpt2 = crate::model::presets::find("gpt2")
            .expect("the gpt2 preset")
            .architecture;
        assert!(gpt2.validate().is_ok());
        type Breaks = fn(&mut Architecture);
        let cases: [(&str, Breaks); 7] = [
            ("layers", |a| a.layers = 1_000_000_000),
            ("hidden", |a| a.hidden = 1_000_000_000),
            ("heads", |a| a.heads = 1 << 20),
            ("head_dim", |a| a.head_dim = 1 << 20),
            ("intermediate", |a| a.intermediate = 1 << 30),
            ("vocab", |a| a.vocab = 1_000_000_000_000),
            ("positions", |a| a.positions = Some(1_000_000_000_000)),
        ];
        for (name, break_it) in cases {
            let mut arch = gpt2;
            break_it(&mut arch);
            let error = arch.validate().expect_err(name).to_string();
            assert!(error.contains(&format!("`{name}`")), "{name}: {error}");
        }
    }
}
