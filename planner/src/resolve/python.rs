//! How Python sees a JSON value once `json.load` has read it: its `repr` (for the Trainer's
//! mismatch lines) and `==` (for deciding that there is a mismatch at all).

use serde_json::Value;

use crate::schedule::py_float_repr;

/// `repr()` of the Python object `json.load` makes of `value` (`True`, `3e-05`, `[0.9, 0.999]`,
/// `'8'`).
pub fn py_repr(value: &Value) -> String {
    match value {
        Value::Null => "None".to_string(),
        Value::Bool(true) => "True".to_string(),
        Value::Bool(false) => "False".to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.to_string(),
            (_, Some(u)) => u.to_string(),
            _ => py_float_repr(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'")),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(py_repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(map) => {
            let inner: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("'{k}': {}", py_repr(v)))
                .collect();
            format!("{{{}}}", inner.join(", "))
        }
    }
}

/// Python's `a == b` for JSON-loaded values: `1 == 1.0`, `True == 1`, lists element-wise,
/// `'8' != 8`.
pub fn py_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(key, p)| y.get(key).is_some_and(|q| py_equal(p, q)))
        }
        _ => match (as_number(a), as_number(b)) {
            (Some(x), Some(y)) => x == y,
            (None, None) => a == b,
            _ => false,
        },
    }
}

/// Numbers and booleans as Python compares them (`bool` is a subclass of `int`).
fn as_number(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn repr_is_pythons() {
        assert_eq!(py_repr(&json!(3e-5)), "3e-05");
        assert_eq!(py_repr(&json!(0.0)), "0.0");
        assert_eq!(py_repr(&json!(20000)), "20000");
        assert_eq!(py_repr(&json!([0.99, 0.999])), "[0.99, 0.999]");
        assert_eq!(py_repr(&json!(true)), "True");
        assert_eq!(py_repr(&json!("8")), "'8'");
    }

    #[test]
    fn equality_is_pythons() {
        assert!(py_equal(&json!(1), &json!(1.0)));
        assert!(py_equal(&json!(true), &json!(1)));
        assert!(py_equal(&json!([0.9, 0.999]), &json!([0.9, 0.999])));
        assert!(!py_equal(&json!("8"), &json!(8)));
        assert!(!py_equal(&json!([0.9]), &json!([0.9, 0.999])));
        assert!(!py_equal(&json!(false), &json!(true)));
    }
}
