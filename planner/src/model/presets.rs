//! Built-in model presets, defined by their architecture (counts are computed).
//!
//! Shapes come from each model's published `config.json`. Names are dsplan's short names; the
//! Hugging Face repository id of each preset is accepted too (`--model bigscience/T0_3B`).

use super::architecture::{Architecture, Bias, Embeddings, Family, FeedForward};
use super::error::ModelError;

/// A named architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// dsplan's name, e.g. `llama-2-7b`.
    pub name: &'static str,
    /// The Hugging Face repository it describes, e.g. `meta-llama/Llama-2-7b-hf` (`None` for
    /// dsplan's own test model).
    pub hub_id: Option<&'static str>,
    /// The shape.
    pub architecture: Architecture,
}

const fn gpt2(layers: u64, hidden: u64, heads: u64) -> Architecture {
    Architecture {
        family: Family::Gpt2,
        layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads,
        intermediate: 4 * hidden,
        vocab: 50_257,
        positions: Some(1024),
        embeddings: Embeddings::Tied,
    }
}

/// A decoder with the Llama layout (Llama, Mistral, Qwen2), untied embeddings.
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per config.json field"
)]
const fn llama_layout(
    family: Family,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    intermediate: u64,
    vocab: u64,
    positions: u64,
) -> Architecture {
    Architecture {
        family,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        intermediate,
        vocab,
        positions: Some(positions),
        embeddings: Embeddings::Untied,
    }
}

const LLAMA: Family = Family::Llama {
    attention_bias: Bias::Absent,
    mlp_bias: Bias::Absent,
};

/// T5 v1.1 XL (`google/t5-v1_1-xl`, `t5-xl-lm-adapt`), the base of bigscience/T0_3B.
const T5_V1_1_XL: Architecture = Architecture {
    family: Family::T5 {
        decoder_layers: 24,
        feed_forward: FeedForward::Gated,
        relative_attention_buckets: 32,
    },
    layers: 24,
    hidden: 2048,
    heads: 32,
    kv_heads: 32,
    head_dim: 64,
    intermediate: 5120,
    vocab: 32_128,
    positions: None,
    embeddings: Embeddings::Untied,
};

/// Every built-in preset.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "tiny-gpt2",
        hub_id: None,
        // The shape of the reference GPT-2 fixtures: vocab 256, 64 positions, width 64.
        architecture: Architecture {
            vocab: 256,
            positions: Some(64),
            intermediate: 256,
            ..gpt2(2, 64, 4)
        },
    },
    Preset {
        name: "tiny-llama",
        hub_id: None,
        // The shape of the reference Llama fixture: vocab 256, width 64, 4 heads of 16 sharing
        // 2 key/value heads, MLP 176, untied embeddings (3 layers there, 2 here).
        architecture: Architecture {
            head_dim: 16,
            ..llama_layout(LLAMA, 2, 64, 4, 2, 176, 256, 128)
        },
    },
    Preset {
        name: "gpt2",
        hub_id: Some("openai-community/gpt2"),
        architecture: gpt2(12, 768, 12),
    },
    Preset {
        name: "gpt2-medium",
        hub_id: Some("openai-community/gpt2-medium"),
        architecture: gpt2(24, 1024, 16),
    },
    Preset {
        name: "gpt2-large",
        hub_id: Some("openai-community/gpt2-large"),
        architecture: gpt2(36, 1280, 20),
    },
    Preset {
        name: "gpt2-xl",
        hub_id: Some("openai-community/gpt2-xl"),
        architecture: gpt2(48, 1600, 25),
    },
    Preset {
        name: "llama-2-7b",
        hub_id: Some("meta-llama/Llama-2-7b-hf"),
        architecture: llama_layout(LLAMA, 32, 4096, 32, 32, 11_008, 32_000, 4096),
    },
    Preset {
        name: "llama-2-13b",
        hub_id: Some("meta-llama/Llama-2-13b-hf"),
        architecture: llama_layout(LLAMA, 40, 5120, 40, 40, 13_824, 32_000, 4096),
    },
    Preset {
        name: "llama-2-70b",
        hub_id: Some("meta-llama/Llama-2-70b-hf"),
        architecture: llama_layout(LLAMA, 80, 8192, 64, 8, 28_672, 32_000, 4096),
    },
    Preset {
        name: "llama-3-8b",
        hub_id: Some("meta-llama/Meta-Llama-3-8B"),
        architecture: llama_layout(LLAMA, 32, 4096, 32, 8, 14_336, 128_256, 8192),
    },
    Preset {
        name: "llama-3-70b",
        hub_id: Some("meta-llama/Meta-Llama-3-70B"),
        architecture: llama_layout(LLAMA, 80, 8192, 64, 8, 28_672, 128_256, 8192),
    },
    Preset {
        name: "mistral-7b",
        hub_id: Some("mistralai/Mistral-7B-v0.1"),
        architecture: llama_layout(Family::Mistral, 32, 4096, 32, 8, 14_336, 32_000, 32_768),
    },
    Preset {
        name: "qwen2-7b",
        hub_id: Some("Qwen/Qwen2-7B"),
        architecture: llama_layout(Family::Qwen2, 28, 3584, 28, 4, 18_944, 152_064, 131_072),
    },
    Preset {
        name: "t5-3b",
        hub_id: Some("google-t5/t5-3b"),
        architecture: Architecture {
            family: Family::T5 {
                decoder_layers: 24,
                feed_forward: FeedForward::Dense,
                relative_attention_buckets: 32,
            },
            layers: 24,
            hidden: 1024,
            heads: 32,
            kv_heads: 32,
            head_dim: 128,
            intermediate: 16_384,
            vocab: 32_128,
            positions: None,
            embeddings: Embeddings::Tied,
        },
    },
    Preset {
        name: "t0-3b",
        hub_id: Some("bigscience/T0_3B"),
        architecture: T5_V1_1_XL,
    },
    Preset {
        name: "bert-base-uncased",
        hub_id: Some("google-bert/bert-base-uncased"),
        architecture: Architecture {
            family: Family::Bert { type_vocab_size: 2 },
            layers: 12,
            hidden: 768,
            heads: 12,
            kv_heads: 12,
            head_dim: 64,
            intermediate: 3072,
            vocab: 30_522,
            positions: Some(512),
            embeddings: Embeddings::Tied,
        },
    },
    Preset {
        name: "bloom-176b",
        hub_id: Some("bigscience/bloom"),
        architecture: Architecture {
            family: Family::Bloom,
            layers: 70,
            hidden: 14_336,
            heads: 112,
            kv_heads: 112,
            head_dim: 128,
            intermediate: 4 * 14_336,
            vocab: 250_880,
            positions: None,
            embeddings: Embeddings::Tied,
        },
    },
];

/// The case-insensitive comparison key of a name.
fn canonical(name: &str) -> String {
    name.trim().to_ascii_lowercase()
}

/// The preset called `name` (case-insensitive), by dsplan name or Hugging Face id.
pub fn find(name: &str) -> Option<&'static Preset> {
    let wanted = canonical(name);
    PRESETS.iter().find(|preset| {
        canonical(preset.name) == wanted
            || preset.hub_id.is_some_and(|hub_id| {
                canonical(hub_id) == wanted
                    || canonical(hub_id.rsplit('/').next().unwrap_or(hub_id)) == wanted
            })
    })
}

/// The preset called `name`, or an error suggesting the closest one.
pub fn lookup(name: &str) -> Result<&'static Preset, ModelError> {
    find(name).ok_or_else(|| ModelError::UnknownPreset {
        name: name.to_owned(),
        suggestion: closest(name),
    })
}

/// The preset name closest to `name` (Jaro-Winkler on normalised spellings), when close enough
/// to be a plausible typo.
pub fn closest(name: &str) -> Option<String> {
    fn normalise(text: &str) -> String {
        let text = text.rsplit('/').next().unwrap_or(text);
        text.to_ascii_lowercase().replace(['_', '.', ' '], "-")
    }
    let wanted = normalise(name);
    let mut best: Option<(&str, f64)> = None;
    for preset in PRESETS {
        for candidate in std::iter::once(preset.name).chain(preset.hub_id) {
            let score = strsim::jaro_winkler(&wanted, &normalise(candidate));
            if best.is_none_or(|(_, top)| score > top) {
                best = Some((preset.name, score));
            }
        }
    }
    best.filter(|&(_, score)| score >= 0.85)
        .map(|(name, _)| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_found_by_name_and_hub_id() {
        assert_eq!(find("GPT2").map(|p| p.name), Some("gpt2"));
        assert_eq!(find("bigscience/T0_3B").map(|p| p.name), Some("t0-3b"));
        assert_eq!(find("T0_3B").map(|p| p.name), Some("t0-3b"));
        assert_eq!(
            find("meta-llama/Llama-2-7b-hf").map(|p| p.name),
            Some("llama-2-7b")
        );
        assert!(find("gpt5").is_none());
    }

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(closest("llama2-7b").as_deref(), Some("llama-2-7b"));
        assert_eq!(closest("t0_3b").as_deref(), Some("t0-3b"));
        assert_eq!(closest("mistral7b").as_deref(), Some("mistral-7b"));
        assert_eq!(closest("completely-different-thing"), None);
        let error = lookup("gpt2-mediun").expect_err("typo");
        assert_eq!(
            error,
            ModelError::UnknownPreset {
                name: "gpt2-mediun".into(),
                suggestion: Some("gpt2-medium".into())
            }
        );
    }

    #[test]
    fn names_are_unique_and_architectures_valid() {
        for (i, preset) in PRESETS.iter().enumerate() {
            assert!(preset.architecture.validate().is_ok(), "{}", preset.name);
            for other in &PRESETS[i + 1..] {
                assert_ne!(canonical(preset.name), canonical(other.name));
            }
        }
    }
}
