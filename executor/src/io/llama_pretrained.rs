//! A Llama-family `save_pretrained` directory: `config.json` plus the weights (one file or
//! sharded), loaded into and saved from the flat buffer of [`LlamaLayout`].

use std::path::Path;

use super::LoadError;
use super::hf_weights::{TiedHead, read_weights, write_weights};
use super::llama_config::{llama_config_to_json, read_llama_config};
use super::safetensors::io_error;
use crate::io::output::write_output;
use crate::model::llama::{LlamaConfig, LlamaLayout};
use crate::zero::Dtype;

/// Loads `dir/config.json` and its weights.
pub fn load_llama_pretrained(dir: &Path) -> Result<(LlamaConfig, Vec<f32>), LoadError> {
    let config = read_llama_config(&dir.join("config.json"))?;
    let layout = LlamaLayout::new(&config);
    let tied = layout.tied().then_some(TiedHead {
        embed: layout.embed,
    });
    let params = read_weights(dir, layout.table(), tied)?;
    Ok((config, params))
}

/// Writes `config.json` and the weights of `params` in `dtype` into `dir` (created if
/// missing), sharded above `shard_bytes`. Returns the weight files written.
pub fn save_llama_pretrained(
    dir: &Path,
    config: &LlamaConfig,
    params: &[f32],
    dtype: Dtype,
    shard_bytes: u64,
) -> Result<Vec<String>, LoadError> {
    std::fs::create_dir_all(dir).map_err(|e| io_error(dir, e))?;
    let layout = LlamaLayout::new(config);
    let files = write_weights(dir, layout.table(), params, dtype, shard_bytes)?;
    let name = match dtype {
        Dtype::F32 => "float32",
        Dtype::Bf16 => "bfloat16",
        Dtype::F16 => "float16",
    };
    let text = serde_json::to_string_pretty(&llama_config_to_json(config, name))
        .map_err(|e| LoadError::Json(e.to_string()))?;
    let path = dir.join("config.json");
    write_output(&path, text.as_bytes()).map_err(|e| io_error(&path, e))?;
    Ok(files)
}

/// `save_pretrained`'s default shard size: directories above it are written as shards.
pub const SHARD_BYTES: u64 = 5_000_000_000;

/// Where `--save-model` wrote a trained model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavedTo {
    /// A GPT-2: one safetensors file of fp32 parameters.
    File,
    /// A Llama-family model: a `save_pretrained` directory with these weight files.
    Directory(Vec<String>),
}

/// Saves trained parameters the way each family is saved: a GPT-2 as one fp32 safetensors
/// file at `path` (atomically), a Llama-family model as a Hugging Face directory at `path`
/// (`config.json` and weights in the run's `dtype`, sharded above [`SHARD_BYTES`]).
pub fn save_trained(
    path: &Path,
    model: &crate::model::ModelConfig,
    params: &[f32],
    dtype: Dtype,
) -> Result<SavedTo, LoadError> {
    match model {
        crate::model::ModelConfig::Gpt2(config) => {
            let layout = crate::model::ParamLayout::new(config);
            crate::checkpoint::save_model(path, params, &layout)?;
            Ok(SavedTo::File)
        }
        crate::model::ModelConfig::Llama(config) => {
            save_llama_pretrained(path, config, params, dtype, SHARD_BYTES).map(SavedTo::Directory)
        }
    }
}
