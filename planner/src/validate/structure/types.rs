//! JSON value kinds as JSON Schema sees them: type names, equality where `1 == 1.0`, and
//! the phrases messages use to describe expected and found values.

use serde_json::Value;

/// The largest integer a JSON number holds exactly; schema integers are capped there.
pub(crate) const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_992.0;

/// JSON equality where `1` equals `1.0` (as in Python and JSON Schema).
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

pub(crate) fn is_auto(value: &Value) -> bool {
    value.as_str() == Some("auto")
}

pub(crate) fn same_kind(a: &Value, b: &Value) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// Whether a string value would become `option` under pydantic's lax coercion.
pub(crate) fn coerces_to(value: &Value, option: &Value) -> bool {
    match (value, option) {
        (Value::String(text), Value::Number(n)) => text.trim().parse::<f64>().ok() == n.as_f64(),
        _ => false,
    }
}

pub(crate) fn type_names(types: &Value) -> Vec<&str> {
    match types {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

pub(crate) fn matches_type(value: &Value, types: &Value) -> bool {
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

pub(crate) fn describe_types(types: &Value) -> String {
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

pub(crate) fn join_alternatives(items: &[String]) -> String {
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

pub(crate) fn kind_name(value: &Value) -> &'static str {
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

pub(crate) fn format_limit(limit: f64) -> String {
    if limit.fract() == 0.0 && limit.abs() < 1e16 {
        format!("{}", limit as i64)
    } else {
        format!("{limit}")
    }
}
