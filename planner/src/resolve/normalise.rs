//! Quoted numbers where the Trainer compares numbers.
//!
//! `"train_micro_batch_size_per_gpu": "8"` with `--per_device_train_batch_size 8` makes the
//! Trainer report `ds train_micro_batch_size_per_gpu=8 vs hf per_device_train_batch_size=8`
//! (Python's `"8" != 8`), and DeepSpeed's batch arithmetic fails on the string. dsplan reads
//! such a string as the number it spells, with a warning that says why the quotes must go.

use serde_json::{Number, Value};

use crate::config::registry::AUTO_KEYS;
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;

/// The `"auto"` keys that hold booleans (everything else in [`AUTO_KEYS`] is numeric).
const BOOLEAN_KEYS: &[&str] = &[
    "/fp16/enabled",
    "/bf16/enabled",
    "/zero_optimization/stage3_gather_16bit_weights_on_model_save",
];

/// Replaces numeric strings at the Trainer's numeric keys (and inside `betas`) by numbers;
/// one warning per replacement.
pub fn numeric_strings(document: &mut Value) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for pointer in AUTO_KEYS.iter().filter(|p| !BOOLEAN_KEYS.contains(p)) {
        let Some(value) = document.pointer_mut(pointer) else {
            continue;
        };
        match value {
            Value::Array(items) => {
                for (at, item) in items.iter_mut().enumerate() {
                    normalise(item, &json_pointer::index(pointer, at), &mut found);
                }
            }
            other => normalise(other, pointer, &mut found),
        }
    }
    found
}

/// The warnings [`numeric_strings`] gives, without changing the document: `validate` gives
/// the same verdict on a quoted number as `resolve` and `run`.
pub fn quoted_numbers(document: &Value) -> Vec<Diagnostic> {
    let mut found = Vec::new();
    for pointer in AUTO_KEYS.iter().filter(|p| !BOOLEAN_KEYS.contains(p)) {
        match document.pointer(pointer) {
            Some(Value::Array(items)) => {
                for (at, item) in items.iter().enumerate() {
                    if let Some((_, warning)) = quoted(item, &json_pointer::index(pointer, at)) {
                        found.push(warning);
                    }
                }
            }
            Some(value) => found.extend(quoted(value, pointer).map(|(_, warning)| warning)),
            None => {}
        }
    }
    found
}

fn normalise(value: &mut Value, pointer: &str, found: &mut Vec<Diagnostic>) {
    if let Some((number, warning)) = quoted(value, pointer) {
        found.push(warning);
        *value = number;
    }
}

/// The number a quoted number spells, and the warning that says so.
fn quoted(value: &Value, pointer: &str) -> Option<(Value, Diagnostic)> {
    let Value::String(text) = value else {
        return None;
    };
    let number = Value::Number(serde_json::from_str::<Number>(text.trim()).ok()?);
    let key = pointer.trim_start_matches('/').replace('/', ".");
    let warning = Diagnostic::warning(
            Code::NormalisedString,
            pointer,
            format!("`{key}` is the string \"{text}\"; dsplan reads it as the number {number}"),
        )
        .with_help(format!(
            "write {number} without quotes: the Hugging Face Trainer compares the string with its own number and reports `ds {key}={number} vs hf ...={number}`, and DeepSpeed's arithmetic fails on a string"
        ));
    Some((number, warning))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn quoted_numbers_become_numbers_with_a_warning() {
        let mut document = json!({
            "train_micro_batch_size_per_gpu": "8",
            "gradient_accumulation_steps": "auto",
            "optimizer": {"params": {"lr": " 3e-5", "betas": ["0.9", 0.999]}},
            "fp16": {"enabled": "true"},
            "steps_per_print": "10"
        });
        let found = numeric_strings(&mut document);
        assert_eq!(document["train_micro_batch_size_per_gpu"], json!(8));
        assert_eq!(document["gradient_accumulation_steps"], json!("auto"));
        assert_eq!(document["optimizer"]["params"]["lr"], json!(3e-5));
        assert_eq!(
            document["optimizer"]["params"]["betas"],
            json!([0.9, 0.999])
        );
        assert_eq!(
            document["fp16"]["enabled"],
            json!("true"),
            "not a numeric key"
        );
        assert_eq!(
            document["steps_per_print"],
            json!("10"),
            "not a Trainer key"
        );
        let pointers: Vec<&str> = found.iter().map(|d| d.pointer.as_str()).collect();
        assert_eq!(
            pointers,
            [
                "/train_micro_batch_size_per_gpu",
                "/optimizer/params/lr",
                "/optimizer/params/betas/0"
            ]
        );
        assert!(found.iter().all(|d| d.code == Code::NormalisedString));
    }
}
