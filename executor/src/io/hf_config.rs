//! A Hugging Face GPT-2 `config.json` as a [`Gpt2Config`].
//!
//! Reads the five sizes and `layer_norm_epsilon` (default `1e-5`), and refuses keys whose values
//! ask for arithmetic this implementation does not do, rather than computing something else.
//! Dropout probabilities are not read: the model runs without dropout.

use std::path::Path;

use serde_json::Value;

use super::LoadError;
use super::config_keys::{number, parse_object, read_text, require, size, unsupported};
use crate::model::Gpt2Config;

/// Parses the text of a GPT-2 `config.json`.
pub fn gpt2_config_from_json(text: &str) -> Result<Gpt2Config, LoadError> {
    let object = parse_object(text)?;
    if let Some(model_type) = object.get("model_type")
        && model_type.as_str() != Some("gpt2")
    {
        return Err(unsupported("model_type", model_type, "\"gpt2\""));
    }
    let vocab_size = size(&object, "vocab_size")?;
    let n_positions = size(&object, "n_positions")?;
    let n_embd = size(&object, "n_embd")?;
    let config = Gpt2Config {
        vocab_size,
        n_positions,
        n_embd,
        n_layer: size(&object, "n_layer")?,
        n_head: size(&object, "n_head")?,
        layer_norm_epsilon: match object.get("layer_norm_epsilon") {
            None | Some(Value::Null) => 1e-5,
            Some(value) => number(value, "layer_norm_epsilon")? as f32,
        },
    };
    require(
        &object,
        "activation_function",
        |v| matches!(v.as_str(), Some("gelu_new" | "gelu_pytorch_tanh")),
        "\"gelu_new\"",
    )?;
    require(
        &object,
        "n_inner",
        |v| v.is_null() || v.as_u64() == Some(4 * n_embd as u64),
        "null or 4 * n_embd",
    )?;
    require(
        &object,
        "tie_word_embeddings",
        |v| v.as_bool() == Some(true),
        "true",
    )?;
    require(
        &object,
        "scale_attn_weights",
        |v| v.as_bool() == Some(true),
        "true",
    )?;
    require(
        &object,
        "scale_attn_by_inverse_layer_idx",
        |v| v.as_bool() == Some(false),
        "false",
    )?;
    require(
        &object,
        "add_cross_attention",
        |v| v.as_bool() == Some(false),
        "false",
    )?;
    config.validate()?;
    Ok(config)
}

/// Reads and parses a GPT-2 `config.json` file.
pub fn read_gpt2_config(path: &Path) -> Result<Gpt2Config, LoadError> {
    gpt2_config_from_json(&read_text(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sizes_and_defaults() {
        let config = gpt2_config_from_json(
            r#"{"model_type": "gpt2", "vocab_size": 256, "n_positions": 64, "n_embd": 64,
                "n_layer": 2, "n_head": 4, "n_inner": null, "activation_function": "gelu_new"}"#,
        )
        .expect("valid config");
        assert_eq!(config.vocab_size, 256);
        assert_eq!(config.layer_norm_epsilon, 1e-5);
    }

    #[test]
    fn refuses_what_is_not_implemented() {
        let base =
            r#""vocab_size": 256, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4"#;
        let untied = format!("{{{base}, \"tie_word_embeddings\": false}}");
        assert!(matches!(
            gpt2_config_from_json(&untied),
            Err(LoadError::ConfigKey {
                key: "tie_word_embeddings",
                ..
            })
        ));
        let relu = format!("{{{base}, \"activation_function\": \"relu\"}}");
        assert!(matches!(
            gpt2_config_from_json(&relu),
            Err(LoadError::ConfigKey {
                key: "activation_function",
                ..
            })
        ));
        let missing = r#"{"vocab_size": 256}"#;
        assert!(matches!(
            gpt2_config_from_json(missing),
            Err(LoadError::ConfigKey {
                key: "n_positions",
                ..
            })
        ));
        let bad_heads = format!("{{{}}}", base.replace("\"n_head\": 4", "\"n_head\": 5"));
        assert!(matches!(
            gpt2_config_from_json(&bad_heads),
            Err(LoadError::Config(_))
        ));
    }
}
