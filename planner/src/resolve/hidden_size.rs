//! The model's hidden size, looked up the way the Trainer does: `model.config.hidden_size`
//! (which transformers maps to each family's own key, e.g. GPT-2's `n_embd`), then
//! `max(model.config.hidden_sizes)`, then the same two inside `text_config` (multimodal
//! models).
//!
//! A model is a built-in preset, a Hugging Face `config.json`, or a directory (or a
//! `*.safetensors` file) with a `config.json` beside it: transformers reads the hidden size from
//! that file, never from the weights.

use std::path::Path;

use serde_json::Value;

use super::env::{HiddenSize, HiddenSizeLookup, HiddenSizeSource};
use crate::model::presets;

/// transformers' `attribute_map` entries that make `config.hidden_size` read another key.
const HIDDEN_SIZE_KEY: &[(&str, &str)] = &[
    ("gpt2", "n_embd"),
    ("gptj", "n_embd"),
    ("gpt_bigcode", "n_embd"),
    ("codegen", "n_embd"),
    ("openai-gpt", "n_embd"),
    ("ctrl", "n_embd"),
    ("t5", "d_model"),
    ("mt5", "d_model"),
    ("umt5", "d_model"),
    ("longt5", "d_model"),
    ("switch_transformers", "d_model"),
    ("bart", "d_model"),
    ("mbart", "d_model"),
    ("marian", "d_model"),
    ("pegasus", "d_model"),
    ("blenderbot", "d_model"),
    ("blenderbot-small", "d_model"),
    ("m2m_100", "d_model"),
    ("plbart", "d_model"),
    ("led", "d_model"),
    ("whisper", "d_model"),
    ("mpt", "d_model"),
    ("xlnet", "d_model"),
    ("distilbert", "dim"),
    ("xlm", "emb_dim"),
    ("flaubert", "emb_dim"),
];

/// Families whose config class takes a legacy `n_embed` over `hidden_size`.
const N_EMBED_FIRST: &[&str] = &["bloom", "falcon"];

/// The hidden size of a parsed `config.json`: `Ok(Some((h, what was read)))`, `Ok(None)` when
/// the config has neither `hidden_size` nor `hidden_sizes` (transformers raises then), `Err`
/// for a value that is not a positive whole number.
pub fn from_config(config: &Value) -> Result<Option<(u64, String)>, String> {
    if let Some(found) = top_level(config, "")? {
        return Ok(Some(found));
    }
    match config.get("text_config") {
        Some(text) if text.is_object() => top_level(text, "text_config."),
        _ => Ok(None),
    }
}

/// `hidden_size` (under its family's key), then `max(hidden_sizes)`, at one level.
fn top_level(config: &Value, prefix: &str) -> Result<Option<(u64, String)>, String> {
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let mut keys: Vec<&str> = Vec::new();
    if N_EMBED_FIRST.contains(&model_type) {
        keys.push("n_embed");
    }
    match HIDDEN_SIZE_KEY
        .iter()
        .find(|(family, _)| *family == model_type)
    {
        Some((_, key)) => keys.push(key),
        None => keys.push("hidden_size"),
    }
    for key in keys {
        if let Some(value) = config.get(key).filter(|v| !v.is_null()) {
            let shown = if key == "hidden_size" {
                format!("{prefix}hidden_size")
            } else {
                format!("{prefix}{key} (hidden_size of {model_type})")
            };
            return whole(value, &shown).map(|h| Some((h, shown)));
        }
    }
    match config.get("hidden_sizes") {
        Some(Value::Array(sizes)) if !sizes.is_empty() => {
            let shown = format!("max({prefix}hidden_sizes)");
            let mut largest = 0;
            for size in sizes {
                largest = largest.max(whole(size, &shown)?);
            }
            Ok(Some((largest, shown)))
        }
        _ => Ok(None),
    }
}

fn whole(value: &Value, what: &str) -> Result<u64, String> {
    value
        .as_f64()
        .filter(|v| *v >= 1.0 && v.fract() == 0.0 && *v < 9.0e15)
        .map(|v| v as u64)
        .ok_or_else(|| format!("{what} must be a positive whole number, found {value}"))
}

/// The hidden size of the model `reference` names (see the module doc). `Err` when the model
/// cannot be found or read.
pub fn from_model(reference: &str) -> Result<HiddenSizeLookup, String> {
    let path = Path::new(reference);
    let config_path = if path.is_dir() {
        path.join("config.json")
    } else if crate::user_file::exists(path) {
        // A FIFO or a device named as the model is refused by what it is when it is read.
        if path.extension().is_some_and(|e| e == "safetensors") {
            path.parent().unwrap_or(Path::new(".")).join("config.json")
        } else {
            path.to_owned()
        }
    } else {
        let preset = presets::lookup(reference).map_err(|error| error.to_string())?;
        return Ok(HiddenSizeLookup::Known(HiddenSize {
            value: preset.architecture.hidden,
            source: HiddenSizeSource::Preset {
                name: preset.name.to_string(),
            },
        }));
    };
    let shown = config_path.display().to_string();
    let text = crate::user_file::read_text(&config_path, crate::user_file::FileKind::ModelConfig).map_err(|error| {
        format!("cannot read {shown} (transformers reads the hidden size from the model's config.json): {error}")
    })?;
    let config: Value =
        serde_json::from_str(&text).map_err(|error| format!("{shown} is not JSON: {error}"))?;
    Ok(
        match from_config(&config).map_err(|e| format!("{shown}: {e}"))? {
            Some((value, key)) => HiddenSizeLookup::Known(HiddenSize {
                value,
                source: HiddenSizeSource::Config { path: shown, key },
            }),
            None => HiddenSizeLookup::NotInModel {
                model: reference.to_string(),
            },
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn h(config: Value) -> Option<u64> {
        from_config(&config).expect("readable").map(|(h, _)| h)
    }

    #[test]
    fn follows_transformers_lookup_order() {
        assert_eq!(
            h(json!({"model_type": "llama", "hidden_size": 4096})),
            Some(4096)
        );
        assert_eq!(h(json!({"model_type": "gpt2", "n_embd": 768})), Some(768));
        assert_eq!(h(json!({"model_type": "t5", "d_model": 1024})), Some(1024));
        assert_eq!(
            h(json!({"model_type": "bloom", "n_embed": 14336, "hidden_size": 64})),
            Some(14336)
        );
        assert_eq!(h(json!({"hidden_sizes": [256, 1024, 512]})), Some(1024));
        assert_eq!(
            h(
                json!({"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 5120}})
            ),
            Some(5120)
        );
        assert_eq!(h(json!({"model_type": "resnet"})), None);
        assert!(from_config(&json!({"hidden_size": "big"})).is_err());
    }

    #[test]
    fn presets_and_missing_models() {
        assert_eq!(
            from_model("gpt2").expect("preset"),
            HiddenSizeLookup::Known(HiddenSize {
                value: 768,
                source: HiddenSizeSource::Preset {
                    name: "gpt2".into()
                }
            })
        );
        assert!(from_model("gtp2-larg").is_err());
    }
}
