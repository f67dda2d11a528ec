//! Which model a run trains, from the `--model` argument: a preset (fresh parameters from a
//! seed), a Hugging Face `config.json` (fresh parameters), or a `save_pretrained` directory
//! (its `config.json` and weights, trained from those weights). The `model_type` of a
//! `config.json` picks the family: `gpt2`, or `llama` / `qwen2` / `mistral`.

use std::fmt;
use std::path::Path;

use dsplan_planner::model::architecture::{Architecture, Bias, Embeddings, Family};
use dsplan_planner::model::presets;

use dsplan_planner::user_file::{FileKind, read_text};

use crate::io::LoadError;
use crate::io::hf_config::read_gpt2_config;
use crate::io::llama_config::read_llama_config;
use crate::io::llama_pretrained::load_llama_pretrained;
use crate::io::safetensors::load_pretrained;
use crate::model::llama::{AttentionBias, LlamaConfig, LlamaFamily};
use crate::model::rope::{Rope, RopeScaling};
use crate::model::{Gpt2Config, ModelConfig};

/// The preset trained when no `--model` is given: the reference fixtures' shape (vocabulary
/// 256, so byte-level text fits; 64 positions, width 64, 2 blocks).
pub const DEFAULT_PRESET: &str = "tiny-gpt2";

/// A model ready to train.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSource {
    /// Its family and shape.
    pub config: ModelConfig,
    /// Its initial parameters, flat.
    pub params: Vec<f32>,
    /// Where it came from, for messages.
    pub description: String,
}

/// Why `--model` names nothing trainable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoiceError {
    /// Not a preset, file or directory.
    Unknown {
        /// The argument.
        name: String,
        /// The closest preset name.
        suggestion: Option<String>,
    },
    /// A preset of an architecture the executor does not train.
    NotGpt2 {
        /// The preset.
        name: String,
    },
    /// The files could not be read.
    Load(LoadError),
}

impl fmt::Display for ModelChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelChoiceError::Unknown { name, suggestion } => {
                write!(
                    f,
                    "`{name}` is neither a model preset nor a file or directory"
                )?;
                if let Some(best) = suggestion {
                    write!(f, "; did you mean `{best}`?")?;
                }
                Ok(())
            }
            ModelChoiceError::NotGpt2 { name } => write!(
                f,
                "`{name}` is neither a GPT-2 with tied embeddings nor a Llama-family decoder; the executor trains those two families only"
            ),
            ModelChoiceError::Load(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ModelChoiceError {}

/// The model `--model` names (`None`: [`DEFAULT_PRESET`]); fresh parameters come from `seed`.
pub fn choose_model(argument: Option<&str>, seed: u64) -> Result<ModelSource, ModelChoiceError> {
    let name = argument.unwrap_or(DEFAULT_PRESET);
    let path = Path::new(name);
    if path.is_dir() {
        let config_path = path.join("config.json");
        let (config, params) = match is_gpt2(&config_path).map_err(ModelChoiceError::Load)? {
            true => {
                let (config, params) = load_pretrained(path).map_err(ModelChoiceError::Load)?;
                (ModelConfig::Gpt2(config), params)
            }
            false => {
                let (config, params) =
                    load_llama_pretrained(path).map_err(ModelChoiceError::Load)?;
                (ModelConfig::Llama(config), params)
            }
        };
        return Ok(ModelSource {
            config,
            params,
            description: format!("{} (pretrained weights)", path.display()),
        });
    }
    let config = model_config(argument)?;
    let shown = if dsplan_planner::user_file::exists(path) {
        path.display().to_string()
    } else {
        name.to_owned()
    };
    Ok(fresh(config, seed, shown))
}

/// `Err` naming `path` when the weights loaded from it hold NaN or infinite values (checked
/// as a checkpoint's tensors are: a run cannot train from them).
pub fn check_finite_weights(path: &Path, params: &[f32]) -> Result<(), LoadError> {
    let Some(first) = params.iter().position(|v| !v.is_finite()) else {
        return Ok(());
    };
    let count = params[first..].iter().filter(|v| !v.is_finite()).count();
    Err(LoadError::NonFinite {
        path: path.to_path_buf(),
        first,
        count,
    })
}

/// The shape of the model `--model` names, without allocating its parameters (read before a
/// run's memory is checked): a directory's or file's `config.json`, or a preset's shape.
pub fn model_config(argument: Option<&str>) -> Result<ModelConfig, ModelChoiceError> {
    let name = argument.unwrap_or(DEFAULT_PRESET);
    let path = Path::new(name);
    let config_file = if path.is_dir() {
        Some(path.join("config.json"))
    } else if dsplan_planner::user_file::exists(path) {
        Some(path.to_path_buf())
    } else {
        None
    };
    if let Some(file) = config_file {
        let gpt2 = is_gpt2(&file).map_err(ModelChoiceError::Load)?;
        return match gpt2 {
            true => read_gpt2_config(&file).map(ModelConfig::Gpt2),
            false => read_llama_config(&file).map(ModelConfig::Llama),
        }
        .map_err(ModelChoiceError::Load);
    }
    let Some(preset) = presets::find(name) else {
        return Err(ModelChoiceError::Unknown {
            name: name.to_owned(),
            suggestion: presets::closest(name),
        });
    };
    preset_config(&preset.architecture).ok_or_else(|| ModelChoiceError::NotGpt2 {
        name: preset.name.to_owned(),
    })
}

/// Whether the `config.json` at `path` describes a GPT-2 (`model_type` `"gpt2"` or absent).
fn is_gpt2(path: &Path) -> Result<bool, LoadError> {
    let text = read_text(path, FileKind::ModelConfig).map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| LoadError::Json(format!("{}: {e}", path.display())))?;
    Ok(matches!(
        value.get("model_type").and_then(serde_json::Value::as_str),
        None | Some("gpt2")
    ))
}

/// The executor's config of a preset's architecture, if it trains that family. A Llama-family
/// preset gets `transformers`' defaults for what presets do not record: `rope_theta` 10000,
/// no RoPE scaling, `rms_norm_eps` 1e-6.
fn preset_config(arch: &Architecture) -> Option<ModelConfig> {
    let dim = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let config = match arch.family {
        Family::Gpt2 => {
            if arch.embeddings != Embeddings::Tied || arch.intermediate != 4 * arch.hidden {
                return None;
            }
            ModelConfig::Gpt2(Gpt2Config {
                vocab_size: dim(arch.vocab),
                n_positions: dim(arch.positions.unwrap_or(0)),
                n_embd: dim(arch.hidden),
                n_layer: dim(arch.layers),
                n_head: dim(arch.heads),
                layer_norm_epsilon: 1e-5,
            })
        }
        Family::Llama { .. } | Family::Qwen2 | Family::Mistral => {
            let (family, attention_bias) = match arch.family {
                Family::Qwen2 => (LlamaFamily::Qwen2, AttentionBias::Qkv),
                Family::Mistral => (LlamaFamily::Mistral, AttentionBias::Absent),
                Family::Llama {
                    attention_bias,
                    mlp_bias: Bias::Absent,
                } => (
                    LlamaFamily::Llama,
                    match attention_bias {
                        Bias::Absent => AttentionBias::Absent,
                        Bias::Present => AttentionBias::QkvO,
                    },
                ),
                _ => return None,
            };
            ModelConfig::Llama(LlamaConfig {
                family,
                vocab_size: dim(arch.vocab),
                max_position_embeddings: dim(arch.positions.unwrap_or(0)),
                hidden_size: dim(arch.hidden),
                num_hidden_layers: dim(arch.layers),
                num_attention_heads: dim(arch.heads),
                num_key_value_heads: dim(arch.kv_heads),
                head_dim: dim(arch.head_dim),
                intermediate_size: dim(arch.intermediate),
                rms_norm_eps: 1e-6,
                rope: Rope {
                    theta: 10_000.0,
                    scaling: RopeScaling::Default,
                },
                attention_bias,
                embeddings: arch.embeddings,
                sliding_window: None,
            })
        }
        _ => return None,
    };
    config.validate().is_ok().then_some(config)
}

fn fresh(config: ModelConfig, seed: u64, name: String) -> ModelSource {
    let params = config.init_params(seed);
    ModelSource {
        config,
        params,
        description: format!("{name} (initialised from seed {seed})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve_and_others_are_refused() {
        let tiny = choose_model(None, 1).expect("default");
        assert_eq!(tiny.config.vocab_size(), 256);
        assert_eq!(tiny.params.len(), tiny.config.layout().num_params());
        let llama = choose_model(Some("tiny-llama"), 1).expect("tiny-llama");
        assert!(matches!(llama.config, ModelConfig::Llama(_)));
        assert_eq!(llama.params.len(), llama.config.layout().num_params());
        assert!(matches!(
            choose_model(Some("t5-3b"), 1),
            Err(ModelChoiceError::NotGpt2 { .. })
        ));
        assert!(matches!(
            choose_model(Some("gpt2-mediun"), 1),
            Err(ModelChoiceError::Unknown {
                suggestion: Some(_),
                ..
            })
        ));
    }
}
