//! Every file × scenario of `reference/hf_auto.json` (transformers 5.23's Trainer filling
//! `"auto"`, then DeepSpeed 0.19.8 judging the result), replayed through dsplan's resolution:
//!
//! * a file the Trainer cannot load (not strict JSON) is flagged `non-strict-json`;
//! * a mismatch error lists exactly the Trainer's mismatch lines, in its order;
//! * a missing hidden size names exactly the Trainer's `"auto"` bucket keys;
//! * a successful fill gives the same filled document (numbers compared as numbers), and
//!   `resolve` then succeeds with DeepSpeed's batch sizes where DeepSpeed accepts the result,
//!   and fails where DeepSpeed refuses it.
//!
//! The scenario's training arguments are given the way `--training-args` gives them, so
//! defaults stay defaults. The reference lives in `../shared` next to the workspace (or where
//! `DSPLAN_SHARED_DIR` points); without it the test says so and passes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dsplan_planner::diagnostics::{Code, Diagnostic};
use dsplan_planner::resolve::hidden_size::from_config;
use dsplan_planner::resolve::{
    Arg, ArgOrigin, Environment, HiddenSize, HiddenSizeLookup, HiddenSizeSource,
    MISMATCH_SEPARATOR, TrainingArgs, fill_auto, resolve,
};
use dsplan_planner::source::SourceFile;
use serde_json::Value;

/// Files where DeepSpeed accepts the Trainer's output and dsplan refuses it, with why dsplan is
/// right to (the same defects `corpus_verdicts.rs` lists).
const DSPLAN_STRICTER: &[(&str, &str)] = &[
    (
        "huggingface__transformers__tests__deepspeed__ds_config_zero2_bf16.json",
        "`bfloat16.enabled: \"auto\"`: the Trainer fills only `bf16.enabled`, DeepSpeed drops the \"auto\" and trains without bf16",
    ),
    (
        "huggingface__transformers__tests__deepspeed__ds_config_zero3_bf16.json",
        "as above",
    ),
    (
        "CarperAI__trlx__ds_config.json",
        "parameter offload at stage 2: DeepSpeed silently ignores it, so the parameters stay on the GPU",
    ),
];

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.join("reference/hf_auto.json").is_file().then_some(dir)
}

fn environment(scenario: &Value) -> Environment {
    let mut training_args =
        TrainingArgs::from_json(&scenario["training_args"]).expect("scenario arguments");
    training_args.num_training_steps = Some(Arg::given(
        scenario["num_training_steps"].as_u64().expect("steps"),
        ArgOrigin::Flag,
    ));
    let model = &scenario["model_config"];
    let hidden_size = match from_config(model).expect("stand-in config") {
        Some((value, key)) => HiddenSizeLookup::Known(HiddenSize {
            value,
            source: HiddenSizeSource::Config {
                path: "model_config".into(),
                key,
            },
        }),
        None => HiddenSizeLookup::NotInModel {
            model: "stand-in".into(),
        },
    };
    Environment {
        world_size: scenario["world_size"].as_u64(),
        training_args,
        hidden_size,
    }
}

/// Equal as Python compares JSON-loaded values after normalising int/float.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, p)| y.get(k).is_some_and(|q| same(p, q)))
        }
        _ => a == b,
    }
}

/// Every leaf (arrays count as one) with its pointer.
fn walk(value: &Value, pointer: &str, visit: &mut impl FnMut(&str, &Value)) {
    match value {
        Value::Object(map) => {
            for (key, member) in map {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                walk(member, &format!("{pointer}/{escaped}"), visit);
            }
        }
        leaf => visit(pointer, leaf),
    }
}

fn mismatch_lines(diagnostics: &[Diagnostic]) -> Vec<String> {
    diagnostics
        .iter()
        .filter(|d| d.code == Code::AutoMismatch)
        .map(|d| {
            let line = d.message.split(MISMATCH_SEPARATOR).next().unwrap_or("");
            format!("- {line}")
        })
        .collect()
}

fn unresolvable(diagnostics: &[Diagnostic]) -> Vec<String> {
    diagnostics
        .iter()
        .filter(|d| d.code == Code::UnresolvableAuto)
        .map(|d| d.pointer.clone())
        .collect()
}

/// The Trainer's dotted keys in its hidden-size error, as pointers.
fn hidden_size_keys(message: &str) -> Vec<String> {
    let list = message
        .split_once('[')
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(inside, _)| inside)
        .expect("a list of keys");
    list.split(", ")
        .map(|key| format!("/{}", key.trim_matches('\'').replace('.', "/")))
        .collect()
}

#[derive(Default)]
struct Tally {
    runs: usize,
    matched: usize,
}

#[test]
fn every_hf_auto_run_matches_the_trainer() {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return;
    };
    let text = std::fs::read_to_string(shared.join("reference/hf_auto.json")).expect("readable");
    let doc: Value = serde_json::from_str(&text).expect("JSON");
    let scenarios: BTreeMap<String, Environment> = doc["scenarios"]
        .as_array()
        .expect("scenarios")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().expect("name").to_string(),
                environment(s),
            )
        })
        .collect();
    let mut tallies: BTreeMap<(String, String), Tally> = BTreeMap::new();
    let mut stricter = 0;
    let mut defaults_only = 0;
    let mut failures = Vec::new();
    for file in doc["files"].as_array().expect("files") {
        let name = file["file"].as_str().expect("file name");
        let bytes =
            std::fs::read(shared.join("corpus/ds_configs").join(name)).expect("corpus file");
        let parsed = SourceFile::parse(name, &bytes);
        for run in file["runs"].as_array().expect("runs") {
            let scenario = run["scenario"].as_str().expect("scenario");
            let stage = run["stage"].as_str().expect("stage");
            let env = &scenarios[scenario];
            let tally = tallies
                .entry((scenario.to_string(), stage.to_string()))
                .or_default();
            tally.runs += 1;
            let problem = check_run(
                name,
                stage,
                run,
                env,
                &parsed,
                &mut stricter,
                &mut defaults_only,
            );
            match problem {
                None => tally.matched += 1,
                Some(problem) => failures.push(format!("{name} [{scenario}, {stage}]: {problem}")),
            }
        }
    }
    for ((scenario, stage), tally) in &tallies {
        eprintln!(
            "hf_auto {scenario:<30} {stage:<9} {}/{} match",
            tally.matched, tally.runs
        );
    }
    eprintln!(
        "({stricter} runs refused by dsplan for a reason listed in DSPLAN_STRICTER; \
         {defaults_only} Trainer refusals that dsplan reports as warnings because only \
         TrainingArguments defaults disagree)"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_run(
    name: &str,
    stage: &str,
    run: &Value,
    env: &Environment,
    parsed: &Result<(SourceFile, Vec<Diagnostic>), Vec<Diagnostic>>,
    stricter: &mut usize,
    defaults_only: &mut usize,
) -> Option<String> {
    let (file, parse_diagnostics) = match parsed {
        Ok(ok) => ok,
        Err(fatal) => return Some(format!("dsplan cannot read the file: {fatal:?}")),
    };
    if stage == "load" {
        let flagged = parse_diagnostics
            .iter()
            .any(|d| d.code == Code::NonStrictJson);
        return (!flagged).then(|| "not flagged as non-strict JSON".to_string());
    }
    let filled = fill_auto(file.value(), env);
    let lines = mismatch_lines(&filled.diagnostics);
    let missing = unresolvable(&filled.diagnostics);
    let error = &run["error"];
    let message = error["message"].as_str().unwrap_or("");
    match stage {
        "finalize" if message.starts_with("Please correct") => {
            let expected: Vec<String> = message
                .lines()
                .filter(|l| l.starts_with("- "))
                .map(str::to_string)
                .collect();
            if lines != expected {
                return Some(format!("mismatches {lines:#?}, Trainer {expected:#?}"));
            }
            if !missing.is_empty() {
                return Some(format!("unexpected unresolvable {missing:?}"));
            }
            match resolve(file.value(), env) {
                Err(_) => None,
                // Only TrainingArguments' defaults disagree: a warning, since the arguments
                // were not given (plain DeepSpeed would train with the file's values).
                Ok(resolved) => {
                    let warned = resolved
                        .diagnostics
                        .iter()
                        .filter(|d| d.code == Code::AutoMismatch && !d.is_error())
                        .count();
                    *defaults_only += 1;
                    (warned != expected.len())
                        .then(|| "resolve accepted a mismatch with a given argument".to_string())
                }
            }
        }
        "finalize" => {
            let expected = hidden_size_keys(message);
            if missing != expected {
                return Some(format!("unresolvable {missing:?}, Trainer {expected:?}"));
            }
            let before: Vec<String> = run["mismatches_after_process"]
                .as_array()
                .expect("stage A mismatches")
                .iter()
                .map(|l| l.as_str().expect("line").to_string())
                .collect();
            let stage_b = |l: &String| {
                l.contains("scheduler.params.total_num_steps=")
                    || l.contains("scheduler.params.warmup_num_steps=")
            };
            let stage_a: Vec<String> = lines.iter().filter(|l| !stage_b(l)).cloned().collect();
            (stage_a != before)
                .then(|| format!("stage A mismatches {stage_a:?}, Trainer {before:?}"))
        }
        "ok" => check_ok(
            name,
            run,
            env,
            file.value(),
            &filled.document,
            &lines,
            &missing,
            stricter,
        ),
        other => Some(format!("unknown stage {other}")),
    }
}

#[allow(clippy::too_many_arguments)]
fn check_ok(
    name: &str,
    run: &Value,
    env: &Environment,
    raw: &Value,
    filled: &Value,
    lines: &[String],
    missing: &[String],
    stricter: &mut usize,
) -> Option<String> {
    if !lines.is_empty() || !missing.is_empty() {
        return Some(format!("mismatches {lines:?}, unresolvable {missing:?}"));
    }
    if !same(filled, &run["filled_config"]) {
        return Some(format!(
            "filled config differs:\n dsplan {filled}\n Trainer {}",
            run["filled_config"]
        ));
    }
    let deepspeed = &run["deepspeed"];
    let resolved = resolve(raw, env);
    if DSPLAN_STRICTER.iter().any(|(file, _)| *file == name) {
        *stricter += 1;
        return resolved
            .is_ok()
            .then(|| "listed in DSPLAN_STRICTER but resolves".to_string());
    }
    match (deepspeed["accepted"].as_bool(), resolved) {
        (Some(true), Ok(resolved)) => {
            let batch = resolved.batch;
            let ours = [
                batch.train_batch_size,
                batch.train_micro_batch_size_per_gpu,
                batch.gradient_accumulation_steps,
            ];
            let theirs = [
                "train_batch_size",
                "train_micro_batch_size_per_gpu",
                "gradient_accumulation_steps",
            ]
            .map(|k| deepspeed[k].as_u64().unwrap_or(0));
            if ours != theirs {
                return Some(format!("batch {ours:?}, DeepSpeed {theirs:?}"));
            }
            // The resolved config keeps every value the Trainer wrote (under the same key).
            let mut differing = Vec::new();
            walk(filled, "", &mut |pointer, value| {
                if let Some(resolved_value) = resolved.config.pointer(pointer)
                    && value.as_str() != Some("auto")
                    && !same(value, resolved_value)
                {
                    differing.push(format!("{pointer}: {value} vs {resolved_value}"));
                }
            });
            (!differing.is_empty()).then(|| format!("resolved config differs: {differing:?}"))
        }
        (Some(true), Err(errors)) => {
            Some(format!("DeepSpeed accepts, dsplan refuses: {errors:#?}"))
        }
        (_, Ok(_)) => Some(format!(
            "DeepSpeed refuses ({}), dsplan resolves",
            deepspeed["error"]["first_line"]
        )),
        (_, Err(_)) => None,
    }
}
