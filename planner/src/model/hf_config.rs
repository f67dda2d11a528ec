//! Hugging Face `config.json` files: the architecture of a model without its weights.
//!
//! Supported `model_type`s: gpt2, llama, mistral, qwen2, t5, bert, bloom. The shape keys each
//! family needs are required; keys with a well-known `transformers` default (key/value heads,
//! tied embeddings, biases, T5's decoder depth and buckets, BERT's token types) take that
//! default when absent, and the default is reported as a [`Note`].

use super::architecture::{Architecture, Bias, Embeddings, Family, FeedForward};
use super::error::ModelError;
use super::notes::Note;
use serde_json::{Map, Value};
use std::path::Path;

/// The `model_type` values dsplan can count.
pub const SUPPORTED_MODEL_TYPES: &[&str] =
    &["gpt2", "llama", "mistral", "qwen2", "t5", "bert", "bloom"];

/// Reads and parses a `config.json`.
pub fn read(path: &Path) -> Result<(Architecture, Vec<Note>), ModelError> {
    let text = crate::user_file::read_text(path, crate::user_file::FileKind::ModelConfig).map_err(
        |error| ModelError::Unreadable {
            path: path.to_owned(),
            reason: error.to_string(),
        },
    )?;
    parse(&text, path)
}

/// Parses the text of a `config.json` (`path` only names it in errors and notes).
pub fn parse(text: &str, path: &Path) -> Result<(Architecture, Vec<Note>), ModelError> {
    let value: Value = serde_json::from_str(text).map_err(|error| ModelError::NotJson {
        path: path.to_owned(),
        reason: error.to_string(),
    })?;
    let Value::Object(object) = value else {
        return Err(ModelError::NotJson {
            path: path.to_owned(),
            reason: "the top level is not an object".into(),
        });
    };
    let mut fields = Fields {
        path,
        object: &object,
        notes: Vec::new(),
    };
    let model_type = fields.model_type()?;
    let architecture = match model_type.as_str() {
        "gpt2" => gpt2(&mut fields)?,
        "llama" => {
            let attention_bias = fields.bias("attention_bias", false)?;
            let mlp_bias = fields.bias("mlp_bias", false)?;
            llama_layout(
                &mut fields,
                Family::Llama {
                    attention_bias,
                    mlp_bias,
                },
            )?
        }
        "mistral" => llama_layout(&mut fields, Family::Mistral)?,
        "qwen2" => llama_layout(&mut fields, Family::Qwen2)?,
        "t5" => t5(&mut fields)?,
        "bert" => bert(&mut fields)?,
        "bloom" => bloom(&mut fields)?,
        _ => {
            return Err(ModelError::UnsupportedModelType {
                path: path.to_owned(),
                model_type,
            });
        }
    };
    architecture.validate()?;
    Ok((architecture, fields.notes))
}

/// The config object being read, and the defaults taken so far.
struct Fields<'a> {
    path: &'a Path,
    object: &'a Map<String, Value>,
    notes: Vec<Note>,
}

impl Fields<'_> {
    fn error(&self, key: &str, problem: impl Into<String>) -> ModelError {
        ModelError::ConfigField {
            path: self.path.to_owned(),
            key: key.to_owned(),
            problem: problem.into(),
        }
    }

    fn model_type(&self) -> Result<String, ModelError> {
        match self.object.get("model_type") {
            Some(Value::String(model_type)) => Ok(model_type.clone()),
            Some(_) => Err(self.error("model_type", "must be a string")),
            None => Err(self.error(
                "model_type",
                "is missing; dsplan needs it to know the layout (is this a Hugging Face config.json?)",
            )),
        }
    }

    /// The first of `keys` present (and not null), as a whole number.
    fn lookup(&self, keys: &[&str]) -> Result<Option<u64>, ModelError> {
        for key in keys {
            match self.object.get(*key) {
                None | Some(Value::Null) => continue,
                Some(value) => return self.whole_number(key, value).map(Some),
            }
        }
        Ok(None)
    }

    fn whole_number(&self, key: &str, value: &Value) -> Result<u64, ModelError> {
        if let Some(number) = value.as_u64() {
            return Ok(number);
        }
        match value.as_f64() {
            Some(number) if number >= 0.0 && number.fract() == 0.0 && number < 1.8e19 => {
                Ok(number as u64)
            }
            _ => Err(self.error(key, format!("must be a whole number, not {value}"))),
        }
    }

    /// A shape key the family cannot do without (the first spelling is the canonical one).
    fn required(&self, keys: &[&str]) -> Result<u64, ModelError> {
        self.lookup(keys)?.ok_or_else(|| {
            self.error(keys[0], "is missing; dsplan needs it to count the parameters (a complete config.json has it)")
        })
    }

    /// A key with a well-known default: absent takes the default and records it, `null`
    /// takes it silently (that is what `null` means in these files).
    fn defaulted(&mut self, key: &str, default: u64) -> Result<u64, ModelError> {
        match self.object.get(key) {
            None => {
                self.notes.push(Note::ConfigDefault {
                    key: key.to_owned(),
                    value: default.to_string(),
                });
                Ok(default)
            }
            Some(Value::Null) => Ok(default),
            Some(value) => self.whole_number(key, value),
        }
    }

    fn flag(&mut self, key: &str, default: bool) -> Result<bool, ModelError> {
        match self.object.get(key) {
            None => {
                self.notes.push(Note::ConfigDefault {
                    key: key.to_owned(),
                    value: default.to_string(),
                });
                Ok(default)
            }
            Some(Value::Null) => Ok(default),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(value) => Err(self.error(key, format!("must be true or false, not {value}"))),
        }
    }

    fn bias(&mut self, key: &str, default: bool) -> Result<Bias, ModelError> {
        Ok(if self.flag(key, default)? {
            Bias::Present
        } else {
            Bias::Absent
        })
    }

    fn embeddings(&mut self, default_tied: bool) -> Result<Embeddings, ModelError> {
        Ok(if self.flag("tie_word_embeddings", default_tied)? {
            Embeddings::Tied
        } else {
            Embeddings::Untied
        })
    }

    /// `hidden / heads`, which must divide exactly.
    fn head_dim(&self, hidden: u64, heads: u64, heads_key: &str) -> Result<u64, ModelError> {
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(self.error(
                heads_key,
                format!("({heads}) must divide the hidden size {hidden}"),
            ));
        }
        Ok(hidden / heads)
    }
}

fn gpt2(fields: &mut Fields<'_>) -> Result<Architecture, ModelError> {
    let hidden = fields.required(&["n_embd"])?;
    let heads = fields.required(&["n_head"])?;
    let intermediate = match fields.lookup(&["n_inner"])? {
        Some(inner) => inner,
        None => hidden.saturating_mul(4),
    };
    Ok(Architecture {
        family: Family::Gpt2,
        layers: fields.required(&["n_layer"])?,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: fields.head_dim(hidden, heads, "n_head")?,
        intermediate,
        vocab: fields.required(&["vocab_size"])?,
        positions: Some(fields.required(&["n_positions"])?),
        embeddings: fields.embeddings(true)?,
    })
}

/// Llama, Mistral and Qwen2 share one config vocabulary.
fn llama_layout(fields: &mut Fields<'_>, family: Family) -> Result<Architecture, ModelError> {
    let hidden = fields.required(&["hidden_size"])?;
    let heads = fields.required(&["num_attention_heads"])?;
    let kv_heads = fields.defaulted("num_key_value_heads", heads)?;
    let head_dim = match fields.lookup(&["head_dim"])? {
        Some(head_dim) => head_dim,
        None => fields.head_dim(hidden, heads, "num_attention_heads")?,
    };
    Ok(Architecture {
        family,
        layers: fields.required(&["num_hidden_layers"])?,
        hidden,
        heads,
        kv_heads,
        head_dim,
        intermediate: fields.required(&["intermediate_size"])?,
        vocab: fields.required(&["vocab_size"])?,
        positions: fields.lookup(&["max_position_embeddings"])?,
        embeddings: fields.embeddings(false)?,
    })
}

fn t5(fields: &mut Fields<'_>) -> Result<Architecture, ModelError> {
    let layers = fields.required(&["num_layers"])?;
    let heads = fields.required(&["num_heads"])?;
    let feed_forward = match fields.object.get("feed_forward_proj") {
        None | Some(Value::Null) => FeedForward::Dense,
        Some(Value::String(projection)) if projection.starts_with("gated-") => FeedForward::Gated,
        Some(Value::String(projection)) if !projection.contains('-') => FeedForward::Dense,
        Some(other) => {
            return Err(fields.error(
                "feed_forward_proj",
                format!(
                    "is {other}; expected an activation name such as \"relu\" or \"gated-gelu\""
                ),
            ));
        }
    };
    let decoder_layers = fields.defaulted("num_decoder_layers", layers)?;
    let relative_attention_buckets = fields.defaulted("relative_attention_num_buckets", 32)?;
    Ok(Architecture {
        family: Family::T5 {
            decoder_layers,
            feed_forward,
            relative_attention_buckets,
        },
        layers,
        hidden: fields.required(&["d_model"])?,
        heads,
        kv_heads: heads,
        head_dim: fields.required(&["d_kv"])?,
        intermediate: fields.required(&["d_ff"])?,
        vocab: fields.required(&["vocab_size"])?,
        positions: None,
        embeddings: fields.embeddings(true)?,
    })
}

fn bert(fields: &mut Fields<'_>) -> Result<Architecture, ModelError> {
    let hidden = fields.required(&["hidden_size"])?;
    let heads = fields.required(&["num_attention_heads"])?;
    let type_vocab_size = fields.defaulted("type_vocab_size", 2)?;
    Ok(Architecture {
        family: Family::Bert { type_vocab_size },
        layers: fields.required(&["num_hidden_layers"])?,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: fields.head_dim(hidden, heads, "num_attention_heads")?,
        intermediate: fields.required(&["intermediate_size"])?,
        vocab: fields.required(&["vocab_size"])?,
        positions: Some(fields.required(&["max_position_embeddings"])?),
        embeddings: fields.embeddings(true)?,
    })
}

fn bloom(fields: &mut Fields<'_>) -> Result<Architecture, ModelError> {
    // BloomConfig accepts the old `n_embed` spelling and maps `n_layer`/`n_head`.
    let hidden = fields.required(&["hidden_size", "n_embed"])?;
    let heads = fields.required(&["n_head", "num_attention_heads"])?;
    Ok(Architecture {
        family: Family::Bloom,
        layers: fields.required(&["n_layer", "num_hidden_layers"])?,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: fields.head_dim(hidden, heads, "n_head")?,
        intermediate: hidden.saturating_mul(4),
        vocab: fields.required(&["vocab_size"])?,
        positions: None,
        embeddings: fields.embeddings(true)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> Result<(Architecture, Vec<Note>), ModelError> {
        parse(text, Path::new("config.json"))
    }

    #[test]
    fn gqa_llama_config() {
        let text = r#"{"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80,
            "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 28672,
            "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": false,
            "attention_bias": false, "mlp_bias": false}"#;
        let (arch, notes) = parse_text(text).expect("valid");
        assert_eq!(
            (arch.kv_heads, arch.head_dim, arch.kv_width()),
            (8, 128, 1024)
        );
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn absent_defaults_are_reported() {
        let text = r#"{"model_type": "mistral", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}"#;
        let (arch, notes) = parse_text(text).expect("valid");
        assert_eq!(arch.kv_heads, 4);
        assert_eq!(arch.embeddings, Embeddings::Untied);
        let keys: Vec<&str> = notes
            .iter()
            .filter_map(|note| match note {
                Note::ConfigDefault { key, .. } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(keys, ["num_key_value_heads", "tie_word_embeddings"]);
    }

    #[test]
    fn t5_v1_1_is_gated_and_untied() {
        let text = r#"{"model_type": "t5", "d_model": 2048, "d_ff": 5120, "d_kv": 64, "num_heads": 32,
            "num_layers": 24, "num_decoder_layers": 24, "vocab_size": 32128,
            "relative_attention_num_buckets": 32, "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": false}"#;
        let (arch, _) = parse_text(text).expect("valid");
        assert!(matches!(
            arch.family,
            Family::T5 {
                feed_forward: FeedForward::Gated,
                ..
            }
        ));
        assert_eq!(arch.embeddings, Embeddings::Untied);
    }

    #[test]
    fn errors_name_the_key() {
        let missing =
            parse_text(r#"{"model_type": "gpt2", "n_embd": 64}"#).expect_err("incomplete");
        assert!(
            matches!(&missing, ModelError::ConfigField { key, .. } if key == "n_head"),
            "{missing}"
        );
        let unsupported = parse_text(r#"{"model_type": "mamba"}"#).expect_err("unsupported");
        assert!(unsupported.to_string().contains("mamba"));
        let wrong_type =
            parse_text(r#"{"model_type": "gpt2", "n_embd": "64"}"#).expect_err("string");
        assert!(
            wrong_type.to_string().contains("whole number"),
            "{wrong_type}"
        );
        assert!(matches!(parse_text("{"), Err(ModelError::NotJson { .. })));
        let indivisible = parse_text(
            r#"{"model_type": "gpt2", "n_embd": 65, "n_head": 4, "n_layer": 1, "vocab_size": 10, "n_positions": 8}"#,
        )
        .expect_err("65 / 4");
        assert!(indivisible.to_string().contains("divide"), "{indivisible}");
    }
}
