//! Where each value of the resolved config came from: a rule recorded it, the file holds it
//! (under its own, an alternative or a deprecated spelling), or DeepSpeed's default applies.

use std::collections::BTreeMap;

use serde_json::Value;

use super::deprecated;
use super::provenance::Provenance;
use crate::config::registry::ALIASES;
use crate::json_pointer;

/// The provenance of every leaf of `config` (arrays count as one value).
pub(crate) fn trace(
    config: &Value,
    raw: &Value,
    recorded: &BTreeMap<String, Provenance>,
) -> BTreeMap<String, Provenance> {
    let mut origins = BTreeMap::new();
    walk(config, "", &mut |pointer| {
        let origin = recorded
            .get(pointer)
            .cloned()
            .or_else(|| in_file(raw, pointer).map(|pointer| Provenance::File { pointer }))
            .unwrap_or_else(Provenance::deepspeed_default);
        origins.insert(pointer.to_string(), origin);
    });
    origins
}

/// Calls `visit` with the pointer of every leaf of `value`, in document order.
pub fn walk(value: &Value, pointer: &str, visit: &mut impl FnMut(&str)) {
    match value {
        Value::Object(map) => {
            for (key, member) in map {
                walk(member, &json_pointer::child(pointer, key), visit);
            }
        }
        _ => visit(pointer),
    }
}

/// The pointer in the file that holds the value resolved at `pointer`, if the file has it.
fn in_file(raw: &Value, pointer: &str) -> Option<String> {
    let written = |p: &str| raw.pointer(p).is_some_and(|v| v.as_str() != Some("auto"));
    if written(pointer) {
        return Some(pointer.to_string());
    }
    let parent = json_pointer::parent(pointer);
    let key = json_pointer::last_token(pointer);
    for alias in ALIASES {
        if alias.parent == parent && alias.canonical == key {
            let spelled = json_pointer::child(parent, alias.alias);
            if written(&spelled) {
                return Some(spelled);
            }
        }
    }
    deprecated::old_spelling(raw, pointer)
}
