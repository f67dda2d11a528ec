//! [`Gpt2Config`]: the five numbers that fix a GPT-2's shapes, and their checks.

use std::fmt;

/// The shape of a GPT-2 (Hugging Face `GPT2Config` names).
///
/// Everything else is fixed by this implementation and matches `transformers`' defaults:
/// `activation_function = "gelu_new"`, MLP width `4 * n_embd`, tied `lm_head`, attention scaled
/// by `1/sqrt(head_dim)`, no dropout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gpt2Config {
    /// Vocabulary size `V` (rows of `wte`).
    pub vocab_size: usize,
    /// Longest sequence `maxT` (rows of `wpe`).
    pub n_positions: usize,
    /// Channels `C`.
    pub n_embd: usize,
    /// Transformer blocks `L`.
    pub n_layer: usize,
    /// Attention heads `NH`; `C` must divide by it.
    pub n_head: usize,
    /// LayerNorm epsilon (Hugging Face default `1e-5`).
    pub layer_norm_epsilon: f32,
}

/// Why a [`Gpt2Config`] cannot describe a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A size that must be positive is zero.
    Zero(&'static str),
    /// `n_embd` is not a multiple of `n_head`.
    HeadsDoNotDivideChannels {
        /// Channels.
        n_embd: usize,
        /// Heads.
        n_head: usize,
    },
    /// The epsilon is not a positive finite number.
    BadEpsilon,
    /// `num_attention_heads` is not a multiple of `num_key_value_heads`.
    KvHeadsDoNotDivideHeads {
        /// Query heads.
        heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },
    /// The rotary embedding pairs dimensions `i` and `i + hs/2`, so `head_dim` must be even.
    OddHeadDim(usize),
    /// `rope_theta` is not a positive finite number.
    BadRopeTheta,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Zero(field) => write!(f, "model config: `{field}` must be positive"),
            ConfigError::HeadsDoNotDivideChannels { n_embd, n_head } => write!(
                f,
                "GPT-2 config: n_embd ({n_embd}) is not a multiple of n_head ({n_head})"
            ),
            ConfigError::BadEpsilon => {
                write!(
                    f,
                    "model config: the norm epsilon (layer_norm_epsilon, rms_norm_eps) must be positive and finite"
                )
            }
            ConfigError::KvHeadsDoNotDivideHeads { heads, kv_heads } => write!(
                f,
                "model config: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            ),
            ConfigError::OddHeadDim(head_dim) => write!(
                f,
                "model config: head_dim ({head_dim}) must be even for rotary embeddings"
            ),
            ConfigError::BadRopeTheta => {
                write!(f, "model config: rope_theta must be positive and finite")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Gpt2Config {
    /// The 124M-parameter `gpt2` (`openai-community/gpt2`).
    pub const fn gpt2() -> Self {
        Self {
            vocab_size: 50257,
            n_positions: 1024,
            n_embd: 768,
            n_layer: 12,
            n_head: 12,
            layer_norm_epsilon: 1e-5,
        }
    }

    /// Channels per head, `hs = C / NH`.
    pub const fn head_dim(&self) -> usize {
        self.n_embd / self.n_head
    }

    /// Checks that the sizes describe a buildable model.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("n_positions", self.n_positions),
            ("n_embd", self.n_embd),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(ConfigError::HeadsDoNotDivideChannels {
                n_embd: self.n_embd,
                n_head: self.n_head,
            });
        }
        if !(self.layer_norm_epsilon.is_finite() && self.layer_norm_epsilon > 0.0) {
            return Err(ConfigError::BadEpsilon);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_is_valid_and_bad_configs_are_named() {
        assert_eq!(Gpt2Config::gpt2().validate(), Ok(()));
        let bad = Gpt2Config {
            n_head: 5,
            ..Gpt2Config::gpt2()
        };
        assert_eq!(
            bad.validate(),
            Err(ConfigError::HeadsDoNotDivideChannels {
                n_embd: 768,
                n_head: 5
            })
        );
        let zero = Gpt2Config {
            n_layer: 0,
            ..Gpt2Config::gpt2()
        };
        assert_eq!(zero.validate(), Err(ConfigError::Zero("n_layer")));
    }
}
