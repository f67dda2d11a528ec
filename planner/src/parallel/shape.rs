//! The shape of a GPT-style decoder as Megatron-LM describes it: what the 3D estimates need,
//! from Megatron's flags or from a model dsplan already knows ([`crate::model::Architecture`]).

use serde::Serialize;

use super::error::ParallelError;
use crate::model::{Architecture, Bias, Embeddings, Family};

/// The MLP of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mlp {
    /// `fc1 -> GELU -> fc2` (Megatron's default).
    Gelu,
    /// Gated: `fc1` is twice as wide (`--swiglu`).
    SwiGlu,
}

impl Mlp {
    /// How many `ffn_hidden` columns `fc1` has.
    pub fn fc1_width_factor(self) -> u64 {
        match self {
            Mlp::Gelu => 1,
            Mlp::SwiGlu => 2,
        }
    }
}

/// The normalisation layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Norm {
    /// LayerNorm: a weight and a bias.
    LayerNorm,
    /// RMSNorm: a weight only.
    RmsNorm,
}

impl Norm {
    /// Parameters per channel.
    pub fn params_per_channel(self) -> u64 {
        match self {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
        }
    }
}

/// Biases of the linear layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinearBias {
    /// Every linear has a bias (Megatron's `--add-bias-linear`, the default; GPT-2).
    All,
    /// Only the QKV projection (Qwen2).
    QkvOnly,
    /// None (`--disable-bias-linear`; Llama).
    None,
}

/// Position information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Positions {
    /// A learned position table of `rows` rows (`--position-embedding-type learned_absolute`).
    Learned {
        /// `--max-position-embeddings`.
        rows: u64,
    },
    /// Rotary or no position parameters.
    Rotary,
}

/// How the vocabulary is padded before it is split over the tensor-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum VocabPadding {
    /// Megatron-LM pads to a multiple of `divisible_by × t` (`--make-vocab-size-divisible-by`,
    /// default 128).
    DivisibleBy {
        /// `--make-vocab-size-divisible-by`.
        divisible_by: u64,
    },
    /// The checkpoint's vocabulary is used as it is (a Hugging Face model under AutoTP): it
    /// must split evenly.
    Fixed,
}

/// A decoder-only transformer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TransformerShape {
    /// `--num-layers`.
    pub layers: u64,
    /// `--hidden-size`.
    pub hidden: u64,
    /// `--num-attention-heads`.
    pub heads: u64,
    /// `--num-query-groups` (equal to `heads` without grouped-query attention).
    pub query_groups: u64,
    /// `--kv-channels`: the width of one head.
    pub kv_channels: u64,
    /// `--ffn-hidden-size`.
    pub ffn_hidden: u64,
    /// The tokenizer's vocabulary, before padding.
    pub vocab: u64,
    /// How the vocabulary is padded.
    pub padding: VocabPadding,
    /// GELU or SwiGLU.
    pub mlp: Mlp,
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Biases of the linear layers.
    pub bias: LinearBias,
    /// Position parameters.
    pub positions: Positions,
    /// Tied or untied input and output embeddings.
    pub embeddings: Embeddings,
}

impl TransformerShape {
    /// Width of the query projection (`kv_channels × heads`).
    pub fn query_width(&self) -> u64 {
        self.kv_channels * self.heads
    }

    /// Width of the key (or value) projection (`kv_channels × query_groups`).
    pub fn kv_width(&self) -> u64 {
        self.kv_channels * self.query_groups
    }

    /// The vocabulary after padding for `tensor` ranks, or why it cannot be split.
    pub fn padded_vocab(&self, tensor: u64, flag: &str) -> Result<u64, ParallelError> {
        match self.padding {
            VocabPadding::DivisibleBy { divisible_by } => {
                if divisible_by == 0 {
                    return Err(ParallelError::new(
                        flag,
                        "the vocabulary cannot be padded to a multiple of 0",
                        "give a positive value (Megatron-LM's default is 128)",
                    ));
                }
                let multiple = divisible_by * tensor;
                Ok(self.vocab.div_ceil(multiple) * multiple)
            }
            VocabPadding::Fixed => {
                if self.vocab.is_multiple_of(tensor) {
                    Ok(self.vocab)
                } else {
                    Err(ParallelError::new(
                        flag,
                        format!(
                            "the model's vocabulary of {} tokens cannot be padded (its embedding is fixed by the checkpoint) and does not split over {tensor} tensor-parallel ranks",
                            self.vocab
                        ),
                        "choose a tensor-parallel degree that divides the vocabulary, or train with Megatron-LM, which pads it (--make-vocab-size-divisible-by)",
                    ))
                }
            }
        }
    }

    /// The shape of a Hugging Face model dsplan knows, when it is a decoder Megatron can
    /// express (GPT-2 and the Llama family).
    pub fn from_architecture(arch: &Architecture) -> Result<TransformerShape, ParallelError> {
        let (mlp, norm, bias, positions) = match arch.family {
            Family::Gpt2 => (
                Mlp::Gelu,
                Norm::LayerNorm,
                LinearBias::All,
                Positions::Learned {
                    rows: arch.positions.unwrap_or(1024),
                },
            ),
            Family::Llama {
                attention_bias,
                mlp_bias,
            } => {
                let bias = match (attention_bias, mlp_bias) {
                    (Bias::Absent, Bias::Absent) => LinearBias::None,
                    (Bias::Present, Bias::Present) => LinearBias::All,
                    _ => {
                        return Err(ParallelError::new(
                            "--model",
                            "a Llama model with biases on only one of attention and MLP is not modelled by the 3D estimate",
                            "use a model with both or neither",
                        ));
                    }
                };
                (Mlp::SwiGlu, Norm::RmsNorm, bias, Positions::Rotary)
            }
            Family::Mistral => (
                Mlp::SwiGlu,
                Norm::RmsNorm,
                LinearBias::None,
                Positions::Rotary,
            ),
            Family::Qwen2 => (
                Mlp::SwiGlu,
                Norm::RmsNorm,
                LinearBias::QkvOnly,
                Positions::Rotary,
            ),
            other => {
                return Err(ParallelError::new(
                    "--model",
                    format!(
                        "the 3D estimate models decoder-only GPT-2 and Llama-family models, not `{}`",
                        other.model_type()
                    ),
                    "give a GPT-2, Llama, Mistral or Qwen2 model, or Megatron-LM flags with --megatron-args",
                ));
            }
        };
        Ok(TransformerShape {
            layers: arch.layers,
            hidden: arch.hidden,
            heads: arch.heads,
            query_groups: arch.kv_heads,
            kv_channels: arch.head_dim,
            ffn_hidden: arch.intermediate,
            vocab: arch.vocab,
            padding: VocabPadding::Fixed,
            mlp,
            norm,
            bias,
            positions,
            embeddings: arch.embeddings,
        })
    }
}
