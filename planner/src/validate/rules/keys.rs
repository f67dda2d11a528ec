//! Key-level rules from the registry: features DeepSpeed 0.19.8 removed (it refuses the file),
//! deprecated spellings (they still work), and a deprecated key given with its replacement
//! (DeepSpeed asserts), and a key given under both of its spellings with different values
//! (pydantic keeps one of them silently).

use serde_json::Value;

use crate::config::registry::{self, ALIASES, DeprecatedKey, WithReplacement};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;

/// Every removed or deprecated key anywhere in `document`.
pub fn check(document: &Value) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    walk(document, "", &mut found);
    spellings(document, &mut found);
    found
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
