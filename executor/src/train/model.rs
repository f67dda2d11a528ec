//! Which model a run trains, from the `--model` argument: a preset (fresh parameters from a
//! seed), a Hugging Face `config.json` (fresh parameters), or a `save_pretrained` directory
//! (its `config.json` and `model.safetensors`, trained from those weights).

use std::fmt;
use std::path::Path;

use dsplan_planner::model::architecture::{Embeddings, Family};
use dsplan_planner::model::presets;

use crate::io::LoadError;
use crate::io::hf_config::read_gpt2_config;
use crate::io::safetensors::load_pretrained;
use crate::model::{Gpt2Config, ParamLayout, init_params};

/// The preset trained when no `--model` is given: the reference fixtures' shape (vocabulary
/// 256, so byte-level text fits; 64 positions, width 64, 2 blocks).
pub const DEFAULT_PRESET: &str = "tiny-gpt2";

/// A model ready to train.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSource {
    /// Its shape.
    pub config: Gpt2Config,
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
    /// A preset of another architecture.
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
                "`{name}` is not a GPT-2 with tied embeddings; the executor trains GPT-2 models only"
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
        let (config, params) = load_pretrained(path).map_err(ModelChoiceError::Load)?;
        return Ok(ModelSource {
            config,
            params,
            description: format!("{} (pretrained weights)", path.display()),
        });
    }
    let config = model_config(argument)?;
    let shown = if path.is_file() {
        path.display().to_string()
    } else {
        name.to_owned()
    };
    Ok(fresh(config, seed, shown))
}

/// The shape of the model `--model` names, without allocating its parameters (read before a
/// run's memory is checked): a directory's or file's `config.json`, or a preset's shape.
pub fn model_config(argument: Option<&str>) -> Result<Gpt2Config, ModelChoiceError> {
    let name = argument.unwrap_or(DEFAULT_PRESET);
    let path = Path::new(name);
    if path.is_dir() {
        return read_gpt2_config(&path.join("config.json")).map_err(ModelChoiceError::Load);
    }
    if path.is_file() {
        return read_gpt2_config(path).map_err(ModelChoiceError::Load);
    }
    let Some(preset) = presets::find(name) else {
        return Err(ModelChoiceError::Unknown {
            name: name.to_owned(),
            suggestion: presets::closest(name),
        });
    };
    let arch = preset.architecture;
    let gpt2 = arch.family == Family::Gpt2
        && arch.embeddings == Embeddings::Tied
        && arch.intermediate == 4 * arch.hidden;
    let dim = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let config = Gpt2Config {
        vocab_size: dim(arch.vocab),
        n_positions: dim(arch.positions.unwrap_or(0)),
        n_embd: dim(arch.hidden),
        n_layer: dim(arch.layers),
        n_head: dim(arch.heads),
        layer_norm_epsilon: 1e-5,
    };
    if !gpt2 || config.validate().is_err() {
        return Err(ModelChoiceError::NotGpt2 {
            name: preset.name.to_owned(),
        });
    }
    Ok(config)
}

fn fresh(config: Gpt2Config, seed: u64, name: String) -> ModelSource {
    let params = init_params(&config, &ParamLayout::new(&config), seed);
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
        assert_eq!(tiny.config.vocab_size, 256);
        assert_eq!(
            tiny.params.len(),
            ParamLayout::new(&tiny.config).num_params()
        );
        assert!(matches!(
            choose_model(Some("llama-2-7b"), 1),
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
