//! The committed `schemas/ds_config.schema.json` must be exactly what the config types generate,
//! the schema must be a valid draft 2020-12 schema, and it must agree with DeepSpeed 0.19.8 on
//! the corpus configs (`../shared`, when present).

use std::path::{Path, PathBuf};

use dsplan_planner::config::registry::known_top_level_keys;
use dsplan_planner::config::{from_value, schema, schema_text};
use dsplan_planner::validate::structure::SUPPORTED_KEYWORDS;
use serde_json::Value;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the planner crate lives inside the workspace")
        .to_path_buf()
}

const UPDATE_COMMAND: &str =
    "DSPLAN_UPDATE_SCHEMA=1 cargo test -p dsplan-planner --test schema_current";

#[test]
fn committed_schema_is_current() {
    let path = workspace_root().join("schemas/ds_config.schema.json");
    let generated = schema_text();
    if std::env::var_os("DSPLAN_UPDATE_SCHEMA").is_some() {
        std::fs::create_dir_all(path.parent().expect("schemas/ has a parent"))
            .expect("create schemas/");
        std::fs::write(&path, &generated).expect("write the schema");
        eprintln!("rewrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale (or missing): the config types changed. Regenerate it with\n    {UPDATE_COMMAND}\nand commit the result.",
        path.display()
    );
}

#[test]
fn schema_is_valid_draft_2020_12() {
    let generated = schema();
    jsonschema::meta::validate(&generated).expect("the schema conforms to its meta-schema");
    assert_eq!(
        generated["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    jsonschema::validator_for(&generated).expect("the schema compiles");
}

#[test]
fn schema_uses_only_keywords_the_validator_walks() {
    fn visit(node: &Value, out: &mut Vec<String>) {
        let Some(fields) = node.as_object() else {
            return;
        };
        for (key, value) in fields {
            if !SUPPORTED_KEYWORDS.contains(&key.as_str()) {
                out.push(key.clone());
            }
            match key.as_str() {
                "properties" | "$defs" => {
                    for child in value.as_object().into_iter().flat_map(|m| m.values()) {
                        visit(child, out);
                    }
                }
                "anyOf" | "oneOf" | "allOf" | "prefixItems" => {
                    for child in value.as_array().into_iter().flatten() {
                        visit(child, out);
                    }
                }
                "items" | "additionalProperties" => visit(value, out),
                _ => {}
            }
        }
    }
    let mut unknown = Vec::new();
    visit(&schema(), &mut unknown);
    assert!(
        unknown.is_empty(),
        "keywords outside the walker's set: {unknown:?}"
    );
}

/// `../shared` next to the workspace (or `$DSPLAN_SHARED`), or `None` (with a notice) when
/// this checkout has none.
fn shared() -> Option<PathBuf> {
    let path = std::env::var_os("DSPLAN_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("../shared"));
    if path.join("reference/config_parse.json").is_file() {
        Some(path)
    } else {
        eprintln!("skipping: ../shared not found");
        None
    }
}

/// A corpus file with DeepSpeed 0.19.8's verdict at world size 1.
struct CorpusFile {
    name: String,
    document: Value,
    accepted: bool,
    /// DeepSpeed's error (first line) when it refused the file.
    error: String,
    /// Whether the refusal came from pydantic (a section's keys or values).
    pydantic: bool,
}

/// The strict-JSON corpus files and DeepSpeed's verdict on each.
fn corpus(shared: &Path) -> Vec<CorpusFile> {
    let reference: Value = serde_json::from_str(
        &std::fs::read_to_string(shared.join("reference/config_parse.json"))
            .expect("read config_parse.json"),
    )
    .expect("config_parse.json is JSON");
    let mut files = Vec::new();
    for entry in reference["files"].as_array().expect("files") {
        if entry["strict_json"]["ok"] != Value::Bool(true) {
            continue;
        }
        let name = entry["file"].as_str().expect("file name").to_string();
        let text = std::fs::read_to_string(shared.join("corpus/ds_configs").join(&name))
            .expect("read a corpus file");
        let verdict = &entry["world_sizes"]["1"];
        files.push(CorpusFile {
            name,
            document: serde_json::from_str(&text).expect("strict JSON per the reference"),
            accepted: verdict["accepted"] == Value::Bool(true),
            error: verdict["error"]["first_line"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            pydantic: verdict["error"]["type"] == "ValidationError",
        });
    }
    files
}

/// Schema errors in `document`, except unknown top-level keys that are no DeepSpeed key at all
/// (DeepSpeed ignores them; the validator reports them as warnings).
fn schema_errors(validator: &jsonschema::Validator, document: &Value) -> Vec<String> {
    let known = known_top_level_keys();
    validator
        .iter_errors(document)
        .filter(|error| {
            let at_root = error.instance_path().to_string().is_empty();
            let unrelated_top_level = match error.kind() {
                jsonschema::error::ValidationErrorKind::AdditionalProperties { unexpected } => {
                    at_root && unexpected.iter().all(|key| !known.contains(key))
                }
                _ => false,
            };
            !unrelated_top_level
        })
        .map(|error| format!("{}: {}", error.instance_path(), error))
        .collect()
}

#[test]
fn schema_agrees_with_deepspeed_on_the_corpus() {
    let Some(shared) = shared() else { return };
    let validator = jsonschema::validator_for(&schema()).expect("the schema compiles");
    let files = corpus(&shared);
    let mut accepted = 0;
    for file in &files {
        let errors = schema_errors(&validator, &file.document);
        if file.accepted {
            accepted += 1;
            assert!(
                errors.is_empty(),
                "{}: DeepSpeed accepts it, the schema says {errors:?}",
                file.name
            );
        } else if file.pydantic || file.error.contains("has been removed") {
            assert!(
                !errors.is_empty(),
                "{}: DeepSpeed refuses it ({}), the schema accepts it",
                file.name,
                file.error
            );
        }
    }
    assert!(
        accepted >= 15,
        "only {accepted} accepted corpus files found"
    );
}

#[test]
fn schema_flags_the_known_bad_corpus_values() {
    let Some(shared) = shared() else { return };
    let validator = jsonschema::validator_for(&schema()).expect("the schema compiles");
    let files = corpus(&shared);
    let flagged = |name_part: &str, needle: &str| {
        let file = files
            .iter()
            .find(|f| f.name.contains(name_part))
            .unwrap_or_else(|| panic!("corpus file {name_part} missing"));
        let errors = schema_errors(&validator, &file.document);
        assert!(
            errors.iter().any(|e| e.contains(needle)),
            "{}: expected an error about {needle}, got {errors:?}",
            file.name
        );
    };
    flagged("summarize_rlhf__sft__ds_config_gptj", "opt_level");
    flagged("zero1_torch_compile", "disable");
    flagged("zero2_torch_compile", "backend");
    flagged(
        "KULLM__scripts__training__ds_zero2_no_offload",
        "/fp16/min_loss_scale",
    );
    flagged("ds_config_trlx_gptj_summarize", "/fp16/min_loss_scale");
    flagged("torch_compile__ds_config_z3", "loss_scale_window");
    flagged("bsz4k_progressive_layer_drop", "/progressive_layer_drop");
}

#[test]
fn typed_parse_agrees_with_deepspeed_on_the_corpus() {
    let Some(shared) = shared() else { return };
    for file in corpus(&shared) {
        let parsed = from_value(&file.document);
        if file.accepted {
            if let Err(error) = parsed {
                panic!(
                    "{}: DeepSpeed accepts it, from_value says {error}",
                    file.name
                );
            }
        } else if file.pydantic || file.error.contains("has been removed") {
            assert!(
                parsed.is_err(),
                "{}: DeepSpeed refuses it ({}), from_value accepts it",
                file.name,
                file.error
            );
        }
    }
}
