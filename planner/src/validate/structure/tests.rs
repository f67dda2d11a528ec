//! The walker against a small hand-written schema.

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
