//! Every file DeepSpeed 0.19.8 accepts in `reference/config_parse.json`, resolved by dsplan at
//! world sizes 1, 2 and 8 without training arguments (plain DeepSpeed): the batch triple, the
//! whole `zero_optimization` section (DeepSpeed's `model_dump`, by alias), `fp16`, `bf16`,
//! `gradient_clipping`, and the optimizer and scheduler DeepSpeed builds must equal DeepSpeed's
//! own resolved values. dsplan writes more than DeepSpeed's `optimizer_params` (the
//! constructor defaults); those extra values must be traced as DeepSpeed defaults.
//!
//! The reference lives in `../shared` next to the workspace (or where `DSPLAN_SHARED_DIR`
//! points); without it the test says so and passes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dsplan_planner::resolve::{Environment, Provenance, Resolved, resolve};
use dsplan_planner::source::SourceFile;
use serde_json::Value;

/// Files DeepSpeed accepts and dsplan refuses, with why dsplan is right to (the defects
/// `corpus_verdicts.rs` lists).
const DSPLAN_STRICTER: &[(&str, &str)] = &[
    (
        "microsoft__DeepSpeed__tests__hybrid_engine__hybrid_engine_config.json",
        "parameter offload at stage 0: DeepSpeed silently ignores it",
    ),
    (
        "microsoft__DeepSpeedExamples__training__BingBertSquad__1-bit_adam__nccl__deepspeed_onebitadam_bsz96_config.json",
        "OnebitAdam was removed from DeepSpeed: the config parses, deepspeed.initialize fails building the optimizer",
    ),
];

/// Deprecated `zero_optimization` keys: DeepSpeed's dump keeps them beside their replacement;
/// dsplan's resolved config holds only the replacement (compared there).
const DEPRECATED_ZERO_KEYS: &[&str] = &[
    "cpu_offload",
    "cpu_offload_param",
    "cpu_offload_use_pin_memory",
    "stage3_gather_fp16_weights_on_model_save",
];

/// DeepSpeed's `sys.maxsize`: `stage3_model_persistence_threshold` when not given, which dsplan
/// leaves absent (unlimited).
const SYS_MAXSIZE: u64 = 9_223_372_036_854_775_807;

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.join("reference/config_parse.json")
        .is_file()
        .then_some(dir)
}

fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

/// Every key of DeepSpeed's dump `theirs` compared with dsplan's section `ours` (absent in
/// ours ⇔ null in theirs); differences as `pointer: ours vs theirs`.
fn compare_section(pointer: &str, ours: Option<&Value>, theirs: &Value, out: &mut Findings) {
    match (ours, theirs) {
        (None | Some(Value::Null), Value::Null) => {}
        (Some(Value::Object(ours)), Value::Object(theirs)) => {
            for (key, their_value) in theirs {
                if pointer == "/zero_optimization" && DEPRECATED_ZERO_KEYS.contains(&key.as_str()) {
                    continue;
                }
                if key == "stage3_model_persistence_threshold"
                    && ours.get(key).is_none()
                    && their_value.as_u64() == Some(SYS_MAXSIZE)
                {
                    continue;
                }
                compare_section(&format!("{pointer}/{key}"), ours.get(key), their_value, out);
            }
            for key in ours.keys().filter(|k| !theirs.contains_key(*k)) {
                out.push(format!(
                    "{pointer}/{key}: dsplan has it, DeepSpeed's dump does not"
                ));
            }
        }
        (Some(ours), theirs) if same(ours, theirs) => out.compared += 1,
        (ours, theirs) => out.push(format!("{pointer}: dsplan {ours:?}, DeepSpeed {theirs}")),
    }
}

/// Differences found, and how many values were found equal.
#[derive(Default)]
struct Findings {
    differences: Vec<String>,
    compared: usize,
}

impl Findings {
    fn push(&mut self, difference: String) {
        self.differences.push(difference);
    }
}

/// DeepSpeed's raw `params` dict against dsplan's: every given value equal, every extra value a
/// materialised DeepSpeed default.
fn compare_params(section: &str, resolved: &Resolved, theirs: &Value, out: &mut Findings) {
    let pointer = format!("/{section}/params");
    let ours = resolved.config.pointer(&pointer);
    let empty = serde_json::Map::new();
    let theirs = theirs.as_object().unwrap_or(&empty);
    for (key, their_value) in theirs {
        let ours = ours.and_then(|o| o.get(key));
        if ours.is_some_and(|o| same(o, their_value)) {
            out.compared += 1;
        } else {
            out.push(format!(
                "{pointer}/{key}: dsplan {ours:?}, DeepSpeed {their_value}"
            ));
        }
    }
    for key in ours
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|o| o.keys())
        .filter(|k| !theirs.contains_key(*k))
    {
        let origin = resolved.provenance.get(&format!("{pointer}/{key}"));
        if !matches!(origin, Some(Provenance::DeepSpeedDefault { .. })) {
            out.push(format!(
                "{pointer}/{key}: extra value not traced to a default ({origin:?})"
            ));
        }
    }
}

fn compare(resolved: &Resolved, theirs: &Value) -> Findings {
    let mut out = Findings::default();
    let batch = resolved.batch;
    for (key, ours) in [
        ("train_batch_size", batch.train_batch_size),
        (
            "train_micro_batch_size_per_gpu",
            batch.train_micro_batch_size_per_gpu,
        ),
        (
            "gradient_accumulation_steps",
            batch.gradient_accumulation_steps,
        ),
    ] {
        if theirs[key].as_u64() == Some(ours) {
            out.compared += 1;
        } else {
            out.push(format!("{key}: dsplan {ours}, DeepSpeed {}", theirs[key]));
        }
    }
    let config = &resolved.config;
    compare_section(
        "/zero_optimization",
        config.get("zero_optimization"),
        &theirs["zero_optimization_by_alias"],
        &mut out,
    );
    compare_section(
        "/fp16",
        config.get("fp16"),
        &theirs["fp16"]["model_dump"],
        &mut out,
    );
    compare_section(
        "/bf16",
        config.get("bf16"),
        &theirs["bf16"]["model_dump"],
        &mut out,
    );
    compare_section(
        "/gradient_clipping",
        config.get("gradient_clipping"),
        &theirs["gradient_clipping"],
        &mut out,
    );
    for section in ["optimizer", "scheduler"] {
        let their_name = &theirs[format!("{section}_name")];
        let our_name = config.pointer(&format!("/{section}/type"));
        let names_agree = match (our_name.and_then(Value::as_str), their_name.as_str()) {
            (None, None) => true,
            (Some(ours), Some(theirs)) => ours.eq_ignore_ascii_case(theirs),
            _ => false,
        };
        if names_agree {
            out.compared += 1;
        } else {
            out.push(format!(
                "/{section}/type: dsplan {our_name:?}, DeepSpeed {their_name}"
            ));
        }
        if their_name.is_string() {
            compare_params(
                section,
                resolved,
                &theirs[format!("{section}_params")],
                &mut out,
            );
        }
    }
    out
}

#[test]
fn accepted_files_resolve_to_deepspeeds_values() {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return;
    };
    let text =
        std::fs::read_to_string(shared.join("reference/config_parse.json")).expect("readable");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    let mut tally: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut values = 0;
    for file in doc["files"].as_array().expect("files") {
        let name = file["file"].as_str().expect("file name");
        let bytes =
            std::fs::read(shared.join("corpus/ds_configs").join(name)).expect("corpus file");
        let Ok((source, _)) = SourceFile::parse(name, &bytes) else {
            continue;
        };
        for (ws, verdict) in file["world_sizes"].as_object().expect("world sizes") {
            if verdict["accepted"] != Value::Bool(true) {
                continue;
            }
            let counts = tally.entry(ws.clone()).or_default();
            counts.0 += 1;
            let env = Environment {
                world_size: ws.parse().ok(),
                ..Environment::default()
            };
            let stricter = DSPLAN_STRICTER.iter().any(|(f, _)| *f == name);
            match resolve(source.value(), &env) {
                Err(_) if stricter => counts.2 += 1,
                Err(errors) => {
                    failures.push(format!("{name} ws {ws}: dsplan refuses: {errors:#?}"))
                }
                Ok(_) if stricter => {
                    failures.push(format!("{name} ws {ws}: listed as stricter but resolves"))
                }
                Ok(resolved) => {
                    let findings = compare(&resolved, &verdict["resolved"]);
                    values += findings.compared;
                    if findings.differences.is_empty() {
                        counts.1 += 1;
                    } else {
                        failures.push(format!("{name} ws {ws}: {:#?}", findings.differences));
                    }
                }
            }
        }
    }
    for (ws, (accepted, matched, stricter)) in &tally {
        eprintln!(
            "config_parse world size {ws}: {matched}/{accepted} accepted files resolve to DeepSpeed's values ({stricter} refused by dsplan, listed)"
        );
    }
    eprintln!("config_parse: {values} values compared equal");
    assert!(values > 1000, "the comparison must cover the sections");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
