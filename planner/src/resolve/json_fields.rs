//! Typed fields read out of a JSON object (a training-arguments file, an SFT config), every
//! problem collected and each naming its field, so that one pass reports them all.

use serde_json::{Map, Value};

/// The fields of one JSON object and the problems found reading them.
pub struct JsonFields<'a> {
    /// The object read.
    pub object: &'a Map<String, Value>,
    /// One line per field that is present but not of its type.
    pub problems: Vec<String>,
}

impl<'a> JsonFields<'a> {
    /// The fields of `object`, no problem found yet.
    pub fn new(object: &'a Map<String, Value>) -> Self {
        JsonFields {
            object,
            problems: Vec::new(),
        }
    }

    /// The value of `key`; `None` when it is absent or `null`.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|v| !v.is_null())
    }

    /// `key` as a number (`None` when absent or `null`; a problem when not a number).
    pub fn number(&mut self, key: &str) -> Option<f64> {
        match self.get(key)? {
            Value::Number(n) => n.as_f64(),
            other => {
                self.problems
                    .push(format!("`{key}` must be a number, found {other}"));
                None
            }
        }
    }

    /// `key` as a non-negative whole number (a problem when it is not one).
    pub fn whole(&mut self, key: &str) -> Option<u64> {
        let value = self.number(key)?;
        if value >= 0.0 && value.fract() == 0.0 && value <= 9.0e15 {
            Some(value as u64)
        } else {
            self.problems.push(format!(
                "`{key}` must be a non-negative whole number, found {value}"
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_are_problems_naming_the_field_and_null_is_absent() {
        let object = serde_json::json!({"a": 3, "b": "x", "c": 2.5, "d": null, "e": -1});
        let mut fields = JsonFields::new(object.as_object().expect("object"));
        assert_eq!(fields.whole("a"), Some(3));
        assert_eq!(fields.number("b"), None);
        assert_eq!(fields.whole("c"), None);
        assert_eq!(fields.number("d"), None);
        assert_eq!(fields.whole("e"), None);
        assert_eq!(fields.number("missing"), None);
        assert_eq!(fields.problems.len(), 3, "{:?}", fields.problems);
        assert!(fields.problems[0].contains("`b` must be a number"));
        assert!(fields.problems[1].contains("`c` must be a non-negative whole number"));
        assert!(fields.problems[2].contains("`e`"));
    }
}
