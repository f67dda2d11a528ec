//! Key-level rules from the registry: features DeepSpeed 0.19.8 removed (it refuses the file),
//! deprecated spellings (they still work), and a deprecated key given with its replacement
//! (DeepSpeed asserts), a key given under both of its spellings with different values
//! (pydantic keeps one of them silently), and keys of `pipeline` DeepSpeed never reads.

use serde_json::Value;

use crate::config::registry::{self, ALIASES, DeprecatedKey, WithReplacement};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;
use crate::validate::suggest;

/// Every removed or deprecated key anywhere in `document`.
pub fn check(document: &Value) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    walk(document, "", &mut found);
    spellings(document, &mut found);
    pipeline_keys(document, &mut found);
    found
}

/// The keys of `pipeline` DeepSpeed 0.19.8 knows: its defaults (`runtime/config.py:272-285`)
/// and `use_reentrant`, read by the pipeline engine (`runtime/pipe/engine.py:210`).
pub const PIPELINE_KEYS: &[&str] = &[
    "stages",
    "partition",
    "seed_layers",
    "activation_checkpoint_interval",
    "pipe_partitioned",
    "grad_partitioned",
    "use_reentrant",
];

/// `pipeline` is copied key by key over DeepSpeed's defaults and read with `dict` lookups, so
/// any other key is silently ignored. Real configs keep their own script's settings there
/// (`chunks`, `partition_method`, ...), so a key far from every known one is a warning; a near
/// miss of a known key (`pipe_partitoned`) is a typo and an error, as in the closed sections.
fn pipeline_keys(document: &Value, found: &mut Vec<Diagnostic>) {
    let Some(Value::Object(section)) = document.get("pipeline") else {
        return;
    };
    for key in section
        .keys()
        .filter(|k| !PIPELINE_KEYS.contains(&k.as_str()))
    {
        let pointer = json_pointer::child("/pipeline", key);
        let nearest = suggest::nearest(key, PIPELINE_KEYS.iter().copied(), suggest::NEAR_MISS);
        found.push(match nearest {
            Some(meant) => Diagnostic::error(
                Code::UnknownKey,
                &pointer,
                format!("unknown key `{key}` in `pipeline`"),
            )
            .with_help(format!("did you mean `{meant}`?")),
            None => Diagnostic::warning(
                Code::IgnoredSetting,
                &pointer,
                format!("`pipeline.{key}` is not a DeepSpeed key; DeepSpeed ignores it"),
            )
            .with_help(format!(
                "fine if your own code reads it; DeepSpeed reads only {}",
                PIPELINE_KEYS.join(", ")
            )),
        });
    }
}

/// An alias and its canonical name both given, with different values.
fn spellings(document: &Value, found: &mut Vec<Diagnostic>) {
    for alias in ALIASES {
        let Some(Value::Object(section)) = document.pointer(alias.parent) else {
            continue;
        };
        let (Some(short), Some(long)) = (section.get(alias.alias), section.get(alias.canonical))
        else {
            continue;
        };
        let same = match (short.as_f64(), long.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => short == long,
        };
        if same {
            continue;
        }
        found.push(
            Diagnostic::error(
                Code::ConflictingSpellings,
                json_pointer::child(alias.parent, alias.alias),
                format!(
                    "`{}` is `{}` written twice with different values: `{}` = {short} and `{}` = {long}; DeepSpeed silently keeps one of them",
                    alias.alias, alias.canonical, alias.alias, alias.canonical
                ),
            )
            .with_help(format!("keep only `{}`", alias.canonical)),
        );
    }
}

fn walk(value: &Value, pointer: &str, found: &mut Vec<Diagnostic>) {
    let Value::Object(members) = value else {
        return;
    };
    for (key, member) in members {
        let child = json_pointer::child(pointer, key);
        if let Some(removed) = registry::removed_feature(pointer, key) {
            let diagnostic = Diagnostic::error(Code::RemovedFeature, &child, removed.message);
            found.push(match removed.replacement {
                Some(replacement) => diagnostic.with_help(format!("use {replacement} instead")),
                None => diagnostic.with_help(format!("remove `{key}`")),
            });
            continue;
        }
        if let Some(deprecated) = registry::deprecated_key(pointer, key) {
            // `"zero_optimization": true` is deprecated; the object form is its replacement.
            let value_form = replacement_key(deprecated) == key;
            if !(value_form && member.is_object()) {
                let both = !value_form && members.contains_key(replacement_key(deprecated));
                found.push(deprecation(deprecated, &child, both));
            }
        }
        walk(member, &child, found);
    }
}

/// The replacement's key name (the registry may add a value or a location after it).
fn replacement_key(deprecated: &DeprecatedKey) -> &'static str {
    deprecated
        .replacement
        .split([' ', ':'])
        .next()
        .unwrap_or(deprecated.replacement)
}

fn deprecation(deprecated: &DeprecatedKey, pointer: &str, replacement_present: bool) -> Diagnostic {
    let clash = replacement_present.then_some(deprecated.with_replacement);
    if clash == Some(WithReplacement::OldIgnored) {
        return Diagnostic::warning(
            Code::DeprecatedKey,
            pointer,
            format!(
                "`{}` is deprecated and ignored here: `{}` is also given and wins",
                deprecated.old,
                replacement_key(deprecated)
            ),
        )
        .with_help(format!("remove `{}`", deprecated.old));
    }
    if clash == Some(WithReplacement::Refused) {
        return Diagnostic::error(
            Code::DeprecatedAndReplacement,
            pointer,
            format!(
                "`{}` and its replacement `{}` are both given; DeepSpeed refuses: \"Cannot provide deprecated parameter '{}' and replacing parameter '{}' together\"",
                deprecated.old,
                replacement_key(deprecated),
                deprecated.old,
                replacement_key(deprecated)
            ),
        )
        .with_help(format!("remove `{}`", deprecated.old));
    }
    Diagnostic::warning(
        Code::DeprecatedKey,
        pointer,
        format!("`{}` is deprecated: {}", deprecated.old, deprecated.note),
    )
    .with_help(format!("use {} instead", deprecated.replacement))
}
