//! Structural checks: the document against the JSON Schema generated from the config types.
//!
//! This is a small walker over the subset of JSON Schema that schemars emits (`$ref`, `type`,
//! `properties`, `additionalProperties`, `enum`, `const`, `anyOf`/`oneOf`/`allOf`, numeric
//! bounds, `items`/`prefixItems`, `required`). Walking it ourselves, instead of translating a
//! general validator's errors back, lets every diagnostic use what the schema knows at that
//! spot: the valid keys for a did-you-mean, the allowed values, whether `"auto"` is accepted.
//! A test checks that the generated schema uses no keyword outside [`SUPPORTED_KEYWORDS`].

use serde_json::{Map, Value};

mod messages;
mod types;

pub(crate) use messages::display_name;
use messages::{auto_not_allowed, needs_resolution, section_name, unknown_key, wrong_type};
use types::{
    coerces_to, describe_types, format_limit, is_auto, join_alternatives, json_equal, matches_type,
    same_kind, type_names,
};

use super::suggest::{self, WORTH_SUGGESTING};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;

/// Every schema keyword the walker understands (assertions and annotations alike).
pub const SUPPORTED_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$defs",
    "$ref",
    "$comment",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "format",
    "type",
    "enum",
    "const",
    "properties",
    "additionalProperties",
    "required",
    "anyOf",
    "oneOf",
    "allOf",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "readOnly",
    "writeOnly",
];

/// Unknown keys reported one by one in a single object; the rest are summarised, so a
/// pathological file (hundreds of thousands of keys) stays fast to check.
const MAX_UNKNOWN_KEYS_REPORTED: usize = 100;

/// Check `document` against `schema` and return every structural problem.
pub fn check(document: &Value, schema: &Value) -> Vec<Diagnostic> {
    let walker = Walker { root: schema };
    let mut found = Vec::new();
    walker.check(document, schema, "", &mut found);
    found
}

struct Walker<'s> {
    root: &'s Value,
}

impl<'s> Walker<'s> {
    /// Follow `$ref` chains to the schema that actually constrains the value.
    fn resolve(&self, mut schema: &'s Value) -> &'s Value {
        for _ in 0..32 {
            let Some(reference) = schema.get("$ref").and_then(Value::as_str) else {
                return schema;
            };
            match reference
                .strip_prefix('#')
                .and_then(|p| self.root.pointer(p))
            {
                Some(target) => schema = target,
                None => return schema,
            }
        }
        schema
    }

    fn check(&self, value: &Value, schema: &'s Value, pointer: &str, out: &mut Vec<Diagnostic>) {
        let schema = self.resolve(schema);
        let Some(keywords) = schema.as_object() else {
            if schema == &Value::Bool(false) {
                out.push(Diagnostic::error(
                    Code::UnknownKey,
                    pointer,
                    format!(
                        "`{}` is not allowed here",
                        json_pointer::last_token(pointer)
                    ),
                ));
            }
            return;
        };

        // Alternatives first: they decide which branch's finer checks apply.
        if let Some(branches) = keywords
            .get("anyOf")
            .or_else(|| keywords.get("oneOf"))
            .and_then(Value::as_array)
        {
            self.check_alternatives(value, branches, pointer, out);
        }
        if let Some(all) = keywords.get("allOf").and_then(Value::as_array) {
            for branch in all {
                self.check(value, branch, pointer, out);
            }
        }

        if let Some(expected) = keywords.get("const")
            && !json_equal(value, expected)
        {
            out.push(self.value_not_allowed(value, std::slice::from_ref(expected), pointer));
            return;
        }
        if let Some(options) = keywords.get("enum").and_then(Value::as_array)
            && !options.iter().any(|option| json_equal(value, option))
        {
            out.push(self.value_not_allowed(value, options, pointer));
            return;
        }
        if let Some(types) = keywords.get("type")
            && !matches_type(value, types)
        {
            out.push(if is_auto(value) {
                auto_not_allowed(pointer)
            } else {
                wrong_type(value, &describe_types(types), pointer)
            });
            return;
        }

        match value {
            Value::Object(members) => self.check_object(members, keywords, pointer, out),
            Value::Array(items) => self.check_array(items, keywords, pointer, out),
            Value::Number(_) => check_bounds(value, keywords, pointer, out),
            Value::String(text) => check_length(text, keywords, pointer, out),
            Value::Bool(_) | Value::Null => {}
        }
    }

    /// `anyOf`/`oneOf`: fine if one branch accepts the value; otherwise report the errors of
    /// the branch that expects this kind of value, or one wrong-type error listing them all.
    fn check_alternatives(
        &self,
        value: &Value,
        branches: &'s [Value],
        pointer: &str,
        out: &mut Vec<Diagnostic>,
    ) {
        let mut attempts = Vec::with_capacity(branches.len());
        for branch in branches {
            let mut errors = Vec::new();
            self.check(value, branch, pointer, &mut errors);
            if errors.iter().all(|d| !d.is_error()) {
                out.extend(errors);
                if is_auto(value) && self.accepts_auto(branch) {
                    out.push(needs_resolution(pointer));
                }
                return;
            }
            attempts.push((branch, errors));
        }
        if is_auto(value) {
            out.push(auto_not_allowed(pointer));
            return;
        }
        let same_kind: Vec<_> = attempts
            .iter()
            .filter(|(branch, _)| self.expects_kind_of(branch, value))
            .collect();
        if let [(_, errors)] = same_kind.as_slice() {
            out.extend(errors.iter().cloned());
            return;
        }
        let expected: Vec<String> = branches.iter().map(|b| self.describe(b)).collect();
        out.push(wrong_type(value, &join_alternatives(&expected), pointer));
    }

    fn check_object(
        &self,
        members: &Map<String, Value>,
        keywords: &'s Map<String, Value>,
        pointer: &str,
        out: &mut Vec<Diagnostic>,
    ) {
        let properties = keywords.get("properties").and_then(Value::as_object);
        let additional = keywords.get("additionalProperties");
        let known: Vec<&str> =
            properties.map_or_else(Vec::new, |p| p.keys().map(String::as_str).collect());
        let mut unknown = 0usize;
        for (key, member) in members {
            let child = json_pointer::child(pointer, key);
            if let Some(property) = properties.and_then(|p| p.get(key)) {
                self.check(member, property, &child, out);
                continue;
            }
            match additional {
                Some(Value::Bool(false)) => {
                    unknown += 1;
                    if unknown <= MAX_UNKNOWN_KEYS_REPORTED {
                        out.push(unknown_key(key, &child, &known));
                    }
                }
                Some(schema @ Value::Object(_)) => self.check(member, schema, &child, out),
                _ => {}
            }
        }
        if unknown > MAX_UNKNOWN_KEYS_REPORTED {
            let rest = unknown - MAX_UNKNOWN_KEYS_REPORTED;
            out.push(Diagnostic::error(
                Code::UnknownKey,
                pointer,
                format!(
                    "{rest} more unknown keys in {} (only the first {MAX_UNKNOWN_KEYS_REPORTED} are listed)",
                    section_name(pointer)
                ),
            ));
        }
        if let Some(required) = keywords.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !members.contains_key(name) {
                    out.push(
                        Diagnostic::error(
                            Code::MissingKey,
                            pointer,
                            format!("`{}` is required in {}", name, section_name(pointer)),
                        )
                        .with_help(format!("add `\"{name}\"`")),
                    );
                }
            }
        }
    }

    fn check_array(
        &self,
        items: &[Value],
        keywords: &'s Map<String, Value>,
        pointer: &str,
        out: &mut Vec<Diagnostic>,
    ) {
        let count_bound = |name: &str| keywords.get(name).and_then(Value::as_u64);
        let (min, max) = (count_bound("minItems"), count_bound("maxItems"));
        let len = items.len() as u64;
        if min.is_some_and(|m| len < m) || max.is_some_and(|m| len > m) {
            let wanted = match (min, max) {
                (Some(a), Some(b)) if a == b => format!("exactly {a}"),
                (Some(a), Some(b)) => format!("{a} to {b}"),
                (Some(a), None) => format!("at least {a}"),
                (None, Some(b)) => format!("at most {b}"),
                (None, None) => String::new(),
            };
            out.push(Diagnostic::error(
                Code::OutOfRange,
                pointer,
                format!(
                    "`{}` must have {wanted} items, found {len}",
                    display_name(pointer)
                ),
            ));
        }
        let prefix = keywords.get("prefixItems").and_then(Value::as_array);
        for (at, item) in items.iter().enumerate() {
            let child = json_pointer::index(pointer, at);
            match prefix.and_then(|p| p.get(at)) {
                Some(schema) => self.check(item, schema, &child, out),
                None => {
                    if let Some(schema) = keywords.get("items") {
                        self.check(item, schema, &child, out);
                    }
                }
            }
        }
    }

    /// Whether a branch (after `$ref`) would take a value of this JSON kind.
    fn expects_kind_of(&self, branch: &'s Value, value: &Value) -> bool {
        let branch = self.resolve(branch);
        if let Some(types) = branch.get("type") {
            return matches_type(value, types)
                || (value.is_number() && type_names(types).contains(&"integer"));
        }
        if let Some(options) = branch.get("enum").and_then(Value::as_array) {
            return options.iter().any(|o| same_kind(o, value));
        }
        if let Some(constant) = branch.get("const") {
            return same_kind(constant, value) && !is_auto(constant);
        }
        branch.get("properties").is_some() && value.is_object()
    }

    /// Whether a branch is the `{"const": "auto"}` alternative.
    fn accepts_auto(&self, branch: &'s Value) -> bool {
        self.resolve(branch).get("const").is_some_and(is_auto)
    }

    /// A short description of what a schema accepts, for "expected …" messages.
    fn describe(&self, schema: &'s Value) -> String {
        let schema = self.resolve(schema);
        if let Some(constant) = schema.get("const") {
            return constant.to_string();
        }
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            let listed: Vec<String> = options.iter().map(Value::to_string).collect();
            return format!("one of {}", listed.join(", "));
        }
        if let Some(types) = schema.get("type") {
            let mut text = describe_types(types);
            if type_names(types).contains(&"integer")
                && schema.get("minimum").and_then(Value::as_f64) == Some(0.0)
            {
                text = "a non-negative integer".to_string();
            }
            return text;
        }
        if schema.get("properties").is_some() {
            return "an object".to_string();
        }
        "a valid value".to_string()
    }

    fn value_not_allowed(&self, value: &Value, options: &[Value], pointer: &str) -> Diagnostic {
        if is_auto(value) {
            return auto_not_allowed(pointer);
        }
        let listed: Vec<String> = options.iter().map(Value::to_string).collect();
        let mut diagnostic = Diagnostic::error(
            Code::InvalidEnumValue,
            pointer,
            format!(
                "`{}` must be {}; found {}",
                display_name(pointer),
                if listed.len() == 1 {
                    listed[0].clone()
                } else {
                    format!("one of {}", listed.join(", "))
                },
                value
            ),
        );
        let coerced = options.iter().find(|option| coerces_to(value, option));
        if let Some(option) = coerced {
            diagnostic = diagnostic.with_help(format!(
                "write {option} without quotes: DeepSpeed's pydantic sections happen to coerce {value}, its plain keys do not"
            ));
        } else if let Some(typed) = value.as_str() {
            let names: Vec<&str> = options.iter().filter_map(Value::as_str).collect();
            if let Some(best) = suggest::nearest(typed, names, WORTH_SUGGESTING) {
                diagnostic = diagnostic.with_help(format!("did you mean `{best}`?"));
            }
        }
        diagnostic
    }
}

fn check_bounds(
    value: &Value,
    keywords: &Map<String, Value>,
    pointer: &str,
    out: &mut Vec<Diagnostic>,
) {
    let Some(number) = value.as_f64() else { return };
    // An integer beyond 2^53 rounds to 2^53 as a float; compare integers exactly.
    if let Some(exact) = value
        .as_u64()
        .map(i128::from)
        .or_else(|| value.as_i64().map(i128::from))
        && exact.unsigned_abs() > 1 << 53
    {
        check_exact_bounds(value, exact, keywords, pointer, out);
        return;
    }
    let bound = |name: &str| keywords.get(name).and_then(Value::as_f64);
    let name = display_name(pointer);
    let violated = [
        (
            bound("minimum"),
            number < bound("minimum").unwrap_or(f64::NEG_INFINITY),
            "at least",
        ),
        (
            bound("maximum"),
            number > bound("maximum").unwrap_or(f64::INFINITY),
            "at most",
        ),
        (
            bound("exclusiveMinimum"),
            number <= bound("exclusiveMinimum").unwrap_or(f64::NEG_INFINITY),
            "greater than",
        ),
        (
            bound("exclusiveMaximum"),
            number >= bound("exclusiveMaximum").unwrap_or(f64::INFINITY),
            "less than",
        ),
    ];
    for (limit, broken, relation) in violated {
        if let (Some(limit), true) = (limit, broken) {
            out.push(Diagnostic::error(
                Code::OutOfRange,
                pointer,
                format!(
                    "`{name}` must be {relation} {}; found {value}",
                    format_limit(limit)
                ),
            ));
        }
    }
}

/// [`check_bounds`] for an integer beyond ±2^53, which a float does not hold exactly. Schema
/// bounds are integers within ±2^53, exact as floats.
fn check_exact_bounds(
    value: &Value,
    exact: i128,
    keywords: &Map<String, Value>,
    pointer: &str,
    out: &mut Vec<Diagnostic>,
) {
    let bound = |name: &str| {
        keywords
            .get(name)
            .and_then(Value::as_f64)
            .map(|limit| (limit, limit as i128))
    };
    let violated = [
        (
            bound("minimum"),
            std::cmp::Ordering::is_lt as fn(std::cmp::Ordering) -> bool,
            "at least",
        ),
        (bound("maximum"), std::cmp::Ordering::is_gt, "at most"),
        (
            bound("exclusiveMinimum"),
            std::cmp::Ordering::is_le,
            "greater than",
        ),
        (
            bound("exclusiveMaximum"),
            std::cmp::Ordering::is_ge,
            "less than",
        ),
    ];
    for (limit, broken, relation) in violated {
        if let Some((shown, limit)) = limit
            && broken(exact.cmp(&limit))
        {
            out.push(Diagnostic::error(
                Code::OutOfRange,
                pointer,
                format!(
                    "`{}` must be {relation} {}; found {value}",
                    display_name(pointer),
                    format_limit(shown)
                ),
            ));
        }
    }
}

fn check_length(
    text: &str,
    keywords: &Map<String, Value>,
    pointer: &str,
    out: &mut Vec<Diagnostic>,
) {
    let length = text.chars().count() as u64;
    let min = keywords.get("minLength").and_then(Value::as_u64);
    let max = keywords.get("maxLength").and_then(Value::as_u64);
    if min.is_some_and(|m| length < m) || max.is_some_and(|m| length > m) {
        out.push(Diagnostic::error(
            Code::OutOfRange,
            pointer,
            format!(
                "`{}` has a length of {length} characters, outside the allowed range",
                display_name(pointer)
            ),
        ));
    }
}

#[cfg(test)]
mod tests;
