//! A Hugging Face Llama, Qwen2 or Mistral `config.json` as a [`LlamaConfig`], and back.
//!
//! RoPE settings are read from either layout `transformers` accepts: the nested
//! `rope_parameters` object of transformers 5 (`rope_type`, `rope_theta`, scaling fields), or
//! the older top-level `rope_theta` with `rope_scaling` (`rope_type` or `type`). Anything whose
//! arithmetic this implementation does not do is refused naming the key: another `rope_type`,
//! `partial_rotary_factor`, logit soft-capping, experts, MLP biases, another activation, dropout.

use std::path::Path;

use dsplan_planner::model::Embeddings;
use serde_json::{Map, Value, json};

use super::LoadError;
use super::config_keys::{number, optional_size, parse_object, read_text, size, unsupported};
use crate::model::llama::{AttentionBias, LlamaConfig, LlamaFamily};
use crate::model::rope::{Rope, RopeScaling};

/// Parses the text of a Llama-family `config.json`.
pub fn llama_config_from_json(text: &str) -> Result<LlamaConfig, LoadError> {
    let object = parse_object(text)?;
    let family = match object.get("model_type").and_then(Value::as_str) {
        Some("llama") => LlamaFamily::Llama,
        Some("qwen2") => LlamaFamily::Qwen2,
        Some("mistral") => LlamaFamily::Mistral,
        _ => {
            return Err(LoadError::ConfigKey {
                key: "model_type",
                problem: format!(
                    "is {}; the Llama family reader takes \"llama\", \"qwen2\" or \"mistral\"",
                    object.get("model_type").unwrap_or(&Value::Null)
                ),
            });
        }
    };
    let hidden_size = size(&object, "hidden_size")?;
    let num_attention_heads = size(&object, "num_attention_heads")?;
    let num_key_value_heads =
        optional_size(&object, "num_key_value_heads")?.unwrap_or(num_attention_heads);
    let head_dim =
        optional_size(&object, "head_dim")?.unwrap_or(hidden_size / num_attention_heads.max(1));
    let max_position_embeddings = size(&object, "max_position_embeddings")?;
    require(
        &object,
        "hidden_act",
        |v| v.as_str() == Some("silu"),
        "\"silu\"",
    )?;
    require(&object, "mlp_bias", |v| v.as_bool() == Some(false), "false")?;
    require(
        &object,
        "attention_dropout",
        |v| v.as_f64() == Some(0.0),
        "0.0",
    )?;
    for key in [
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "num_local_experts",
        "num_experts",
        "num_experts_per_tok",
    ] {
        require(&object, key, Value::is_null, "null (absent)")?;
    }
    let attention_bias = match (
        family,
        object.get("attention_bias").and_then(Value::as_bool),
    ) {
        (LlamaFamily::Qwen2, _) => AttentionBias::Qkv,
        (LlamaFamily::Llama, Some(true)) => AttentionBias::QkvO,
        (LlamaFamily::Mistral, Some(true)) => {
            return Err(unsupported("attention_bias", &Value::Bool(true), "false"));
        }
        _ => AttentionBias::Absent,
    };
    let embeddings = match object.get("tie_word_embeddings") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Embeddings::Untied,
        Some(Value::Bool(true)) => Embeddings::Tied,
        Some(other) => return Err(unsupported("tie_word_embeddings", other, "true or false")),
    };
    let sliding_window = match family {
        LlamaFamily::Llama => None,
        LlamaFamily::Mistral => optional_size(&object, "sliding_window")?,
        LlamaFamily::Qwen2 => match object.get("use_sliding_window").and_then(Value::as_bool) {
            Some(true) => optional_size(&object, "sliding_window")?,
            _ => None,
        },
    };
    let config = LlamaConfig {
        family,
        vocab_size: size(&object, "vocab_size")?,
        max_position_embeddings,
        hidden_size,
        num_hidden_layers: size(&object, "num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        intermediate_size: size(&object, "intermediate_size")?,
        rms_norm_eps: match object.get("rms_norm_eps") {
            None | Some(Value::Null) => 1e-6,
            Some(value) => number(value, "rms_norm_eps")? as f32,
        },
        rope: rope(&object, max_position_embeddings)?,
        attention_bias,
        embeddings,
        sliding_window,
    };
    config.validate()?;
    Ok(config)
}

/// The RoPE settings, from `rope_parameters` or from `rope_theta` + `rope_scaling`.
fn rope(object: &Map<String, Value>, max_positions: usize) -> Result<Rope, LoadError> {
    let (params, theta_key, type_key): (Option<&Map<String, Value>>, _, _) = match object
        .get("rope_parameters")
    {
        Some(Value::Object(params)) => (
            Some(params),
            "rope_parameters.rope_theta",
            "rope_parameters.rope_type",
        ),
        None | Some(Value::Null) => match object.get("rope_scaling") {
            Some(Value::Object(params)) => (Some(params), "rope_theta", "rope_scaling.rope_type"),
            None | Some(Value::Null) => (None, "rope_theta", "rope_scaling.rope_type"),
            Some(other) => return Err(unsupported("rope_scaling", other, "an object or null")),
        },
        Some(other) => return Err(unsupported("rope_parameters", other, "an object")),
    };
    let theta = params
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| object.get("rope_theta"));
    let theta = match theta {
        None | Some(Value::Null) => 10_000.0,
        Some(value) => number(value, theta_key)?,
    } as f32;
    let Some(params) = params else {
        return Ok(Rope {
            theta,
            scaling: RopeScaling::Default,
        });
    };
    if let Some(factor) = params.get("partial_rotary_factor")
        && factor.as_f64() != Some(1.0)
    {
        return Err(unsupported(
            "rope_parameters.partial_rotary_factor",
            factor,
            "1.0",
        ));
    }
    let kind = params
        .get("rope_type")
        .or_else(|| params.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let field = |key: &'static str| -> Result<f32, LoadError> {
        match params.get(key) {
            Some(value) => Ok(number(value, key)? as f32),
            None => Err(LoadError::ConfigKey {
                key,
                problem: format!("is missing from the {kind} RoPE scaling parameters"),
            }),
        }
    };
    let original = |fallback: usize| -> Result<usize, LoadError> {
        match params.get("original_max_position_embeddings") {
            None | Some(Value::Null) => Ok(fallback),
            Some(value) => value
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| LoadError::ConfigKey {
                    key: "original_max_position_embeddings",
                    problem: format!("must be a positive integer, found {value}"),
                }),
        }
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: field("factor")?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: field("factor")?,
            original_max_positions: original(max_positions)?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: field("factor")?,
            low_freq_factor: field("low_freq_factor")?,
            high_freq_factor: field("high_freq_factor")?,
            original_max_positions: match params.get("original_max_position_embeddings") {
                Some(_) => original(0)?,
                None => {
                    return Err(LoadError::ConfigKey {
                        key: "original_max_position_embeddings",
                        problem: "is missing from the llama3 RoPE scaling parameters".into(),
                    });
                }
            },
        },
        other => {
            return Err(unsupported(
                type_key,
                &Value::String(other.to_owned()),
                "\"default\", \"linear\", \"dynamic\" or \"llama3\"",
            ));
        }
    };
    Ok(Rope { theta, scaling })
}

/// Reads and parses a Llama-family `config.json` file.
pub fn read_llama_config(path: &Path) -> Result<LlamaConfig, LoadError> {
    llama_config_from_json(&read_text(path)?)
}

/// The `config.json` `save_pretrained` would write for `config` (transformers 5 layout:
/// `rope_parameters`), with `dtype` the stored tensors' (`"float32"`, `"bfloat16"`, ...).
pub fn llama_config_to_json(config: &LlamaConfig, dtype: &str) -> Value {
    let mut rope = Map::new();
    rope.insert("rope_theta".into(), json!(f64::from(config.rope.theta)));
    match config.rope.scaling {
        RopeScaling::Default => {
            rope.insert("rope_type".into(), json!("default"));
        }
        RopeScaling::Linear { factor } => {
            rope.insert("rope_type".into(), json!("linear"));
            rope.insert("factor".into(), json!(f64::from(factor)));
        }
        RopeScaling::Dynamic {
            factor,
            original_max_positions,
        } => {
            rope.insert("rope_type".into(), json!("dynamic"));
            rope.insert("factor".into(), json!(f64::from(factor)));
            rope.insert(
                "original_max_position_embeddings".into(),
                json!(original_max_positions),
            );
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_positions,
        } => {
            rope.insert("rope_type".into(), json!("llama3"));
            rope.insert("factor".into(), json!(f64::from(factor)));
            rope.insert("low_freq_factor".into(), json!(f64::from(low_freq_factor)));
            rope.insert(
                "high_freq_factor".into(),
                json!(f64::from(high_freq_factor)),
            );
            rope.insert(
                "original_max_position_embeddings".into(),
                json!(original_max_positions),
            );
        }
    }
    let mut out = json!({
        "architectures": [config.family.class()],
        "model_type": config.family.model_type(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": f64::from(config.rms_norm_eps),
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "tie_word_embeddings": config.embeddings == Embeddings::Tied,
        "rope_parameters": Value::Object(rope),
        "dtype": dtype,
        "use_cache": true,
    });
    if let Value::Object(map) = &mut out {
        match config.family {
            LlamaFamily::Llama => {
                map.insert(
                    "attention_bias".into(),
                    json!(config.attention_bias == AttentionBias::QkvO),
                );
                map.insert("mlp_bias".into(), json!(false));
            }
            LlamaFamily::Qwen2 => {
                map.insert(
                    "use_sliding_window".into(),
                    json!(config.sliding_window.is_some()),
                );
                map.insert("sliding_window".into(), json!(config.sliding_window));
            }
            LlamaFamily::Mistral => {
                map.insert("sliding_window".into(), json!(config.sliding_window));
            }
        }
    }
    out
}

/// An optional key that, when present and not null (null means the default here, as in
/// transformers), must pass `ok`.
fn require(
    object: &Map<String, Value>,
    key: &'static str,
    ok: impl Fn(&Value) -> bool,
    supported: &str,
) -> Result<(), LoadError> {
    super::config_keys::require(object, key, |v| v.is_null() || ok(v), supported)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#""model_type": "llama", "vocab_size": 256, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 176, "max_position_embeddings": 128"#;

    #[test]
    fn both_rope_layouts_read_the_same() {
        let new = format!(
            r#"{{{BASE}, "rope_parameters": {{"rope_type": "llama3", "rope_theta": 500000.0,
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}}}}"#
        );
        let legacy = format!(
            r#"{{{BASE}, "rope_theta": 500000.0, "rope_scaling": {{"type": "llama3",
            "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}}}}"#
        );
        let a = llama_config_from_json(&new).expect("new layout");
        assert_eq!(a, llama_config_from_json(&legacy).expect("legacy layout"));
        assert!(matches!(a.rope.scaling, RopeScaling::Llama3 { .. }));
        let saved = llama_config_to_json(&a, "float32").to_string();
        assert_eq!(llama_config_from_json(&saved).expect("round trip"), a);
    }

    #[test]
    fn refuses_what_is_not_implemented_naming_the_field() {
        for (extra, key) in [
            (
                r#""rope_scaling": {"rope_type": "yarn", "factor": 4.0}"#,
                "rope_scaling.rope_type",
            ),
            (
                r#""rope_parameters": {"rope_type": "longrope", "rope_theta": 1.0}"#,
                "rope_parameters.rope_type",
            ),
            (
                r#""attn_logit_softcapping": 50.0"#,
                "attn_logit_softcapping",
            ),
            (r#""num_local_experts": 8"#, "num_local_experts"),
            (r#""mlp_bias": true"#, "mlp_bias"),
            (r#""hidden_act": "gelu""#, "hidden_act"),
        ] {
            let text = format!("{{{BASE}, {extra}}}");
            match llama_config_from_json(&text) {
                Err(LoadError::ConfigKey { key: found, .. }) => assert_eq!(found, key, "{extra}"),
                other => panic!("{extra}: {other:?}"),
            }
        }
    }
}
