//! Reading a Hugging Face `config.json`: the JSON object, its sizes and numbers, and the keys
//! whose values ask for arithmetic this implementation does not do. Shared by the GPT-2 and
//! the Llama-family readers, so both say the same thing about the same mistake.

use std::path::Path;

use serde_json::{Map, Value};

use super::LoadError;

/// The text of a `config.json` file.
pub fn read_text(path: &Path) -> Result<String, LoadError> {
    dsplan_planner::user_file::read_text(path, dsplan_planner::user_file::FileKind::ModelConfig)
        .map_err(|e| LoadError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// The top-level object of a `config.json`.
pub fn parse_object(text: &str) -> Result<Map<String, Value>, LoadError> {
    let value: Value = serde_json::from_str(text).map_err(|e| LoadError::Json(e.to_string()))?;
    match value {
        Value::Object(object) => Ok(object),
        _ => Err(LoadError::Json("the top level is not an object".into())),
    }
}

/// A required non-negative integer.
pub fn size(object: &Map<String, Value>, key: &'static str) -> Result<usize, LoadError> {
    optional_size(object, key)?.ok_or_else(|| LoadError::ConfigKey {
        key,
        problem: "is missing".into(),
    })
}

/// A non-negative integer that may be absent or null (the model's default then applies).
pub fn optional_size(
    object: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<usize>, LoadError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .map(Some)
            .ok_or_else(|| LoadError::ConfigKey {
                key,
                problem: format!("must be a non-negative integer, found {value}"),
            }),
    }
}

/// A number.
pub fn number(value: &Value, key: &'static str) -> Result<f64, LoadError> {
    value.as_f64().ok_or_else(|| LoadError::ConfigKey {
        key,
        problem: format!("must be a number, found {value}"),
    })
}

/// An optional key that, when present, must pass `ok` (`supported` says what would).
pub fn require(
    object: &Map<String, Value>,
    key: &'static str,
    ok: impl Fn(&Value) -> bool,
    supported: &str,
) -> Result<(), LoadError> {
    match object.get(key) {
        Some(value) if !ok(value) => Err(unsupported(key, value, supported)),
        _ => Ok(()),
    }
}

/// `key`'s `value` asks for something only `supported` is implemented for.
pub fn unsupported(key: &'static str, value: &Value, supported: &str) -> LoadError {
    LoadError::ConfigKey {
        key,
        problem: format!("is {value}; only {supported} is implemented"),
    }
}
