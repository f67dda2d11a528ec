//! [`from_value`]: a parsed JSON document to a typed [`DsConfig`], refusing what DeepSpeed
//! 0.19.8 refuses.

use serde_json::{Map, Value};

use super::registry::{ALIASES, AUTO_KEYS, REMOVED_FEATURES};
use super::root::{DsConfig, LEGACY_ALLGATHER_SIZE};

/// Types a `ds_config.json` document.
///
/// Beyond what the types check (value types, enums, unknown keys in the sections DeepSpeed
/// closes, `"auto"` only where the Hugging Face Trainer fills it), this refuses the keys of
/// features DeepSpeed 0.19.8 removed, and `"auto"` under a key's second spelling. The legacy
/// `"zero_optimization": true` becomes stage 1 with `allgather_size` (default 5e8) as its
/// all-gather bucket, as in DeepSpeed. Unknown top-level keys are ignored, as DeepSpeed does.
///
/// The error names the top-level key whose value could not be read.
pub fn from_value(value: &Value) -> Result<DsConfig, String> {
    let Some(top) = value.as_object() else {
        return Err(format!(
            "a DeepSpeed config must be a JSON object, found {}",
            kind_name(value)
        ));
    };
    for feature in REMOVED_FEATURES {
        let section = if feature.parent.is_empty() {
            Some(value)
        } else {
            value.pointer(feature.parent)
        };
        if section
            .and_then(Value::as_object)
            .is_some_and(|s| s.contains_key(feature.key))
        {
            return Err(format!(
                "`{}/{}`: {}",
                feature.parent, feature.key, feature.message
            ));
        }
    }
    for alias in ALIASES {
        let canonical = format!("{}/{}", alias.parent, alias.canonical);
        let spelled = format!("{}/{}", alias.parent, alias.alias);
        if AUTO_KEYS.contains(&canonical.as_str())
            && value.pointer(&spelled).and_then(Value::as_str) == Some("auto")
        {
            return Err(format!(
                "`{spelled}` cannot be \"auto\": the Hugging Face Trainer only fills `{canonical}`"
            ));
        }
    }
    let mut config: DsConfig =
        serde_json::from_value(value.clone()).map_err(|error| locate(top, error))?;
    if value.get("zero_optimization") == Some(&Value::Bool(true)) {
        config.zero_optimization.allgather_bucket_size = config
            .allgather_size
            .unwrap_or(super::primitives::NonNegativeInt(LEGACY_ALLGATHER_SIZE));
    }
    Ok(config)
}

/// Prefixes a deserialisation error with the top-level key it came from, found by reading each
/// key on its own.
fn locate(top: &Map<String, Value>, error: serde_json::Error) -> String {
    for (key, member) in top {
        let mut alone = Map::new();
        alone.insert(key.clone(), member.clone());
        if let Err(inner) = serde_json::from_value::<DsConfig>(Value::Object(alone)) {
            return format!("`{key}`: {inner}");
        }
    }
    error.to_string()
}

/// The JSON pointer of what [`from_value`] refused, as deep as it can be told: the top-level
/// key whose value does not read, then, level by level, the member without which its object
/// reads (`/zero_optimization/offload_optimizer/buffer_count`). `""` when no single key is to
/// blame.
pub fn refused_pointer(value: &Value) -> String {
    let Some(top) = value.as_object() else {
        return String::new();
    };
    let reads = |key: &str, member: &Value| {
        let mut alone = Map::new();
        alone.insert(key.to_string(), member.clone());
        serde_json::from_value::<DsConfig>(Value::Object(alone)).is_ok()
    };
    for (key, member) in top {
        if reads(key, member) {
            continue;
        }
        let mut pointer = crate::json_pointer::child("", key);
        // `inside`: where the blamed value sits inside `member` (`""` is `member` itself).
        let mut inside = String::new();
        while let Some(Value::Object(fields)) = member.pointer(&inside) {
            let culprit = fields.keys().find(|field| {
                let mut trimmed = member.clone();
                if let Some(Value::Object(object)) = trimmed.pointer_mut(&inside) {
                    object.remove(field.as_str());
                }
                reads(key, &trimmed)
            });
            let Some(field) = culprit else { break };
            inside = crate::json_pointer::child(&inside, field);
            pointer = crate::json_pointer::child(&pointer, field);
        }
        return pointer;
    }
    String::new()
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
