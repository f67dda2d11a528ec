//! Structural checks: the document against the JSON Schema generated from the config types.
//!
//! This is a small walker over the subset of JSON Schema that schemars emits (`$ref`, `type`,
//! `properties`, `additionalProperties`, `enum`, `const`, `anyOf`/`oneOf`/`allOf`, numeric
//! bounds, `items`/`prefixItems`, `required`). Walking it ourselves, instead of translating a
//! general validator's errors back, lets every diagnostic use what the schema knows at that
//! spot: the valid keys for a did-you-mean, the allowed values, whether `"auto"` is accepted.
//! A test checks that the generated schema uses no keyword outside [`SUPPORTED_KEYWORDS`].

use serde_json::{Map, Value};

use super::suggest::{self, NEAR_MISS, WORTH_SUGGESTING};
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

/// The largest integer a JSON number holds exactly; schema integers are capped there.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

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

fn unknown_key(key: &str, pointer: &str, known: &[&str]) -> Diagnostic {
    let section = json_pointer::parent(pointer);
    let nearest = suggest::nearest(key, known.iter().copied(), WORTH_SUGGESTING);
    let at_top_level = section.is_empty();
    if at_top_level && !nearest.is_some_and(|best| suggest::similarity(key, best) >= NEAR_MISS) {
        return Diagnostic::warning(
            Code::UnusedTopLevelKey,
            pointer,
            format!("`{key}` is not a DeepSpeed key; DeepSpeed ignores it"),
        )
        .with_help("fine if your own code reads it; otherwise check its spelling");
    }
    let message = if at_top_level {
        format!("unknown top-level key `{key}`")
    } else {
        format!("unknown key `{key}` in {}", section_name(section))
    };
    let diagnostic = Diagnostic::error(Code::UnknownKey, pointer, message);
    match nearest {
        Some(best) => diagnostic.with_help(format!("did you mean `{best}`?")),
        None if !known.is_empty() && known.len() <= 12 => {
            diagnostic.with_help(format!("valid keys here: {}", known.join(", ")))
        }
        None => diagnostic,
    }
}

fn wrong_type(value: &Value, expected: &str, pointer: &str) -> Diagnostic {
    let name = display_name(pointer);
    if let (Some(number), true) = (value.as_f64(), expected.contains("integer"))
        && number.fract() != 0.0
        && number.is_finite()
    {
        return Diagnostic::error(
            Code::NonIntegral,
            pointer,
            format!("`{name}` must be an integer; {value} has a fractional part"),
        )
        .with_help(format!("use a whole number such as {}", number.round()));
    }
    let diagnostic = Diagnostic::error(
        Code::WrongType,
        pointer,
        format!(
            "`{name}` must be {expected}; found {} {value}",
            kind_name(value)
        ),
    );
    match value {
        Value::String(text) if text.trim().parse::<f64>().is_ok() && !expected.contains("string") => {
            diagnostic.with_help(format!(
                "write {} without quotes: DeepSpeed's pydantic sections happen to coerce a quoted number, its plain keys (batch sizes, gradient_clipping) do not",
                text.trim()
            ))
        }
        Value::String(text) if matches!(text.as_str(), "true" | "false") => diagnostic
            .with_help(format!("write {text} without quotes")),
        _ => diagnostic,
    }
}

fn auto_not_allowed(pointer: &str) -> Diagnostic {
    if pointer == "/bfloat16/enabled" {
        return Diagnostic::error(
            Code::AutoNotAllowed,
            pointer,
            "`bfloat16.enabled` cannot be \"auto\": the Hugging Face Trainer fills only `bf16.enabled`, so DeepSpeed drops this \"auto\" and trains without bf16",
        )
        .with_help("rename the section `bfloat16` to `bf16`");
    }
    Diagnostic::error(
        Code::AutoNotAllowed,
        pointer,
        format!("`{}` cannot be \"auto\": neither the Hugging Face Trainer nor dsplan fills it", display_name(pointer)),
    )
    .with_help(
        "give a value; DeepSpeed itself silently uses the default for \"auto\" inside its pydantic sections and crashes on it elsewhere",
    )
}

fn needs_resolution(pointer: &str) -> Diagnostic {
    Diagnostic::info(
        Code::NeedsResolution,
        pointer,
        format!(
            "`{}` is \"auto\": filled by the Hugging Face Trainer or `dsplan resolve`",
            display_name(pointer)
        ),
    )
    .with_help(
        "run `dsplan resolve` with your training arguments to see the value DeepSpeed will get",
    )
}

/// JSON equality where `1` equals `1.0` (as in Python and JSON Schema).
fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn is_auto(value: &Value) -> bool {
    value.as_str() == Some("auto")
}

fn same_kind(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Whether a string value would become `option` under pydantic's lax coercion.
fn coerces_to(value: &Value, option: &Value) -> bool {
    match (value, option) {
        (Value::String(text), Value::Number(n)) => text.trim().parse::<f64>().ok() == n.as_f64(),
        _ => false,
    }
}

fn type_names(types: &Value) -> Vec<&str> {
    match types {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

fn matches_type(value: &Value, types: &Value) -> bool {
    type_names(types).iter().any(|name| match *name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => {
            value
                .as_f64()
                .is_some_and(|n| n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER)
                || value.is_u64()
                || value.is_i64()
        }
        _ => false,
    })
}

fn describe_types(types: &Value) -> String {
    let names: Vec<String> = type_names(types)
        .into_iter()
        .map(|name| match name {
            "object" => "an object",
            "array" => "an array",
            "string" => "a string",
            "boolean" => "true or false",
            "null" => "null",
            "number" => "a number",
            "integer" => "an integer",
            other => other,
        })
        .map(str::to_string)
        .collect();
    join_alternatives(&names)
}

fn join_alternatives(items: &[String]) -> String {
    let mut unique: Vec<&String> = Vec::new();
    for item in items {
        if !unique.contains(&item) {
            unique.push(item);
        }
    }
    match unique.as_slice() {
        [] => "a valid value".to_string(),
        [one] => (*one).clone(),
        [init @ .., last] => {
            let head: Vec<&str> = init.iter().map(|s| s.as_str()).collect();
            format!("{} or {}", head.join(", "), last)
        }
    }
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "the string",
        Value::Bool(_) => "the boolean",
        Value::Null => "",
        Value::Number(n) if n.is_f64() => "the number",
        Value::Number(_) => "the integer",
    }
}

fn format_limit(limit: f64) -> String {
    if limit.fract() == 0.0 && limit.abs() < 1e16 {
        format!("{}", limit as i64)
    } else {
        format!("{limit}")
    }
}

/// `zero_optimization.offload_param.device` for `/zero_optimization/offload_param/device`.
pub(crate) fn display_name(pointer: &str) -> String {
    let tokens = json_pointer::tokens(pointer);
    if tokens.is_empty() {
        "the config".to_string()
    } else {
        tokens.join(".")
    }
}

/// "the top level" or "`zero_optimization`".
pub(crate) fn section_name(pointer: &str) -> String {
    if pointer.is_empty() {
        "the top level".to_string()
    } else {
        format!("`{}`", display_name(pointer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "train_batch_size": {"anyOf": [{"const": "auto"}, {"$ref": "#/$defs/Count"}]},
                "steps_per_print": {"$ref": "#/$defs/Count"},
                "zero_optimization": {"$ref": "#/$defs/Zero"},
                "betas": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                          "minItems": 2, "maxItems": 2}
            },
            "$defs": {
                "Count": {"type": "integer", "minimum": 0, "maximum": 9007199254740992u64},
                "Zero": {
                    "type": "object", "additionalProperties": false,
                    "properties": {
                        "stage": {"type": "integer", "enum": [0, 1, 2, 3]},
                        "overlap_comm": {"type": ["boolean", "null"]},
                        "device": {"type": "string", "enum": ["none", "cpu", "nvme"]}
                    }
                }
            }
        })
    }

    fn codes(document: Value) -> Vec<(Code, String)> {
        check(&document, &schema())
            .into_iter()
            .map(|d| (d.code, d.pointer))
            .collect()
    }

    #[test]
    fn accepts_a_valid_document() {
        let found = codes(json!({"train_batch_size": 5e8, "zero_optimization": {"stage": 2}}));
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn reports_every_problem_with_its_pointer() {
        let found = codes(json!({
            "train_batch_size": 2.5,
            "steps_per_print": "auto",
            "zero_optimisation": {},
            "zero_optimization": {"stage": "2", "overlap_com": true, "device": "gpu"},
            "betas": [0.9]
        }));
        assert_eq!(
            found,
            vec![
                (Code::NonIntegral, "/train_batch_size".into()),
                (Code::AutoNotAllowed, "/steps_per_print".into()),
                (Code::UnknownKey, "/zero_optimisation".into()),
                (Code::InvalidEnumValue, "/zero_optimization/stage".into()),
                (Code::UnknownKey, "/zero_optimization/overlap_com".into()),
                (Code::InvalidEnumValue, "/zero_optimization/device".into()),
                (Code::OutOfRange, "/betas".into()),
            ]
        );
    }

    #[test]
    fn auto_where_allowed_is_information() {
        let found = check(&json!({"train_batch_size": "auto"}), &schema());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].code, Code::NeedsResolution);
        assert!(!found[0].is_error());
    }

    #[test]
    fn unrelated_top_level_key_is_a_warning() {
        let found = check(&json!({"my_project_flag": 1}), &schema());
        assert_eq!(found[0].code, Code::UnusedTopLevelKey);
        assert!(!found[0].is_error());
    }

    #[test]
    fn quoted_number_gets_coercion_help() {
        let found = check(&json!({"zero_optimization": {"stage": "2"}}), &schema());
        let help = found[0].help.as_deref().unwrap_or_default();
        assert!(help.contains("without quotes"), "{help}");
        let found = check(&json!({"steps_per_print": "10"}), &schema());
        assert_eq!(found[0].code, Code::WrongType);
        assert!(
            found[0]
                .help
                .as_deref()
                .unwrap_or_default()
                .contains("write 10")
        );
    }

    #[test]
    fn misspelt_enum_value_gets_a_suggestion() {
        let found = check(&json!({"zero_optimization": {"device": "CPU"}}), &schema());
        assert_eq!(found[0].help.as_deref(), Some("did you mean `cpu`?"));
    }
}
