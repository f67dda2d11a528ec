//! [`LlamaConfig`]: the shape of a Llama-family decoder (Llama, Qwen2, Mistral) and its checks.

use dsplan_planner::model::Embeddings;

use crate::model::ConfigError;
use crate::model::rope::Rope;

/// Which Hugging Face class the model is (`model_type`); the computation is the same, the
/// defaults of `config.json` and the biases differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlamaFamily {
    /// `LlamaForCausalLM` (`model_type` `"llama"`).
    Llama,
    /// `Qwen2ForCausalLM` (`"qwen2"`): biases on `q`, `k`, `v`.
    Qwen2,
    /// `MistralForCausalLM` (`"mistral"`).
    Mistral,
}

impl LlamaFamily {
    /// `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "llama",
            LlamaFamily::Qwen2 => "qwen2",
            LlamaFamily::Mistral => "mistral",
        }
    }

    /// The class name in `architectures`.
    pub fn class(self) -> &'static str {
        match self {
            LlamaFamily::Llama => "LlamaForCausalLM",
            LlamaFamily::Qwen2 => "Qwen2ForCausalLM",
            LlamaFamily::Mistral => "MistralForCausalLM",
        }
    }
}

/// Which attention projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBias {
    /// None (Llama, Mistral).
    Absent,
    /// `q_proj`, `k_proj`, `v_proj` (Qwen2).
    Qkv,
    /// `q_proj`, `k_proj`, `v_proj` and `o_proj` (Llama with `attention_bias: true`).
    QkvO,
}

/// The shape of a Llama-family decoder (Hugging Face `config.json` names).
///
/// Fixed by this implementation: SiLU-gated MLP without biases, RMSNorm, rotary embeddings in
/// the rotate-half layout, causal attention scaled by `head_dim^-0.5`, no dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlamaConfig {
    /// The class.
    pub family: LlamaFamily,
    /// `vocab_size` `V`.
    pub vocab_size: usize,
    /// `max_position_embeddings`: the longest sequence.
    pub max_position_embeddings: usize,
    /// `hidden_size` `C`.
    pub hidden_size: usize,
    /// `num_hidden_layers` `L`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads` `NH`.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` `KV` (divides `NH`).
    pub num_key_value_heads: usize,
    /// `head_dim` `hs` (even, for the rotation).
    pub head_dim: usize,
    /// `intermediate_size` `I`.
    pub intermediate_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `rope_theta` and the scaling.
    pub rope: Rope,
    /// Biases of the attention projections.
    pub attention_bias: AttentionBias,
    /// `tie_word_embeddings`.
    pub embeddings: Embeddings,
    /// The sliding attention window, if the config has one in use: sequences longer than it
    /// are refused (up to it, sliding attention is causal attention).
    pub sliding_window: Option<usize>,
}

impl LlamaConfig {
    /// `q` width `NH * hs`.
    pub const fn q_width(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// `k` (and `v`) width `KV * hs`.
    pub const fn kv_width(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// A `[q | k | v]` row, `(NH + 2 KV) * hs`.
    pub const fn qkv_width(&self) -> usize {
        self.q_width() + 2 * self.kv_width()
    }

    /// Checks that the sizes describe a buildable model.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(ConfigError::KvHeadsDoNotDivideHeads {
                heads: self.num_attention_heads,
                kv_heads: self.num_key_value_heads,
            });
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(ConfigError::OddHeadDim(self.head_dim));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(ConfigError::BadEpsilon);
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 0.0) {
            return Err(ConfigError::BadRopeTheta);
        }
        Ok(())
    }
}
