//! dsplan's verdicts on the 73 real configs of `../shared/corpus/ds_configs/`, compared with
//! DeepSpeed 0.19.8's own (`../shared/reference/config_parse.json`, world size 8).
//!
//! * A file DeepSpeed rejects for a reason other than an unresolved `"auto"` must get an error
//!   from dsplan at the same key.
//! * A file whose `"auto"` values made DeepSpeed fail is judged by what DeepSpeed said once the
//!   Hugging Face Trainer had filled them (`hf_auto.json`, scenario `ws8_bf16_h4096_ratio_warmup`).
//! * A file DeepSpeed accepts may get an error from dsplan only for a real defect DeepSpeed lets
//!   through; each such error is listed in [`DEFECTS_DEEPSPEED_LETS_THROUGH`] with the reason, and
//!   the list must stay exact (an entry that no longer fires fails the test too).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use dsplan_planner::diagnostics::Diagnostic;
use dsplan_planner::validate::{ValidateOptions, validate_source};
use serde_json::Value;

const HF_SCENARIO: &str = "ws8_bf16_h4096_ratio_warmup";

/// (file, pointer) of every error dsplan raises on a file DeepSpeed accepts, with why it is a
/// real defect.
const DEFECTS_DEEPSPEED_LETS_THROUGH: &[(&str, &str, &str)] = &[
    (
        "CarperAI__trlx__ds_config.json",
        "/zero_optimization/offload_param",
        "parameter offload to CPU at stage 2: DeepSpeed silently ignores it, so the parameters stay on the GPU",
    ),
    (
        "microsoft__DeepSpeed__tests__hybrid_engine__hybrid_engine_config.json",
        "/zero_optimization/offload_param",
        "parameter offload to CPU at stage 0: silently ignored",
    ),
    (
        "huggingface__transformers__tests__deepspeed__ds_config_zero2_bf16.json",
        "/bfloat16/enabled",
        "the Trainer fills `bf16.enabled`, never the old `bfloat16.enabled` (hf_auto.json shows it still \"auto\" after filling); DeepSpeed then drops the \"auto\" and trains without bf16 even under --bf16",
    ),
    (
        "huggingface__transformers__tests__deepspeed__ds_config_zero3_bf16.json",
        "/bfloat16/enabled",
        "as above",
    ),
    (
        "microsoft__DeepSpeedExamples__training__BingBertSquad__1-bit_adam__nccl__deepspeed_onebitadam_bsz96_config.json",
        "/optimizer/type",
        "OnebitAdam was removed from DeepSpeed: the config parses, deepspeed.initialize fails building the optimizer",
    ),
];

fn shared() -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    path.join("reference/config_parse.json")
        .exists()
        .then_some(path)
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("reference file readable");
    serde_json::from_str(&text).expect("reference file is JSON")
}

/// What DeepSpeed says of a file, reduced to what dsplan can be compared on.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Accepted,
    /// Rejected; dsplan must have an error at one of the pointers of each group.
    Rejected(Vec<Vec<String>>),
}

const BATCH_KEYS: [&str; 4] = [
    "",
    "/train_batch_size",
    "/train_micro_batch_size_per_gpu",
    "/gradient_accumulation_steps",
];

/// The pointers a DeepSpeed exception is about.
fn blamed_pointers(error: &Value) -> Vec<Vec<String>> {
    let message = error["message"].as_str().unwrap_or_default();
    match error["type"].as_str().unwrap_or_default() {
        "ValidationError" => {
            let section = match message.split_whitespace().nth(4).unwrap_or_default() {
                "DeepSpeedFP16Config" => "/fp16",
                "DeepSpeedBF16Config" => "/bf16",
                "CompileConfig" => "/compile",
                "DeepSpeedZeroConfig" => "/zero_optimization",
                other => panic!("unmapped pydantic model {other}"),
            };
            error["errors"]
                .as_array()
                .expect("pydantic errors listed")
                .iter()
                .map(|e| {
                    let loc: Vec<String> = e["loc"]
                        .as_array()
                        .expect("loc")
                        .iter()
                        .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string))
                        .collect();
                    vec![format!("{section}/{}", loc.join("/"))]
                })
                .collect()
        }
        "DeepSpeedConfigError" => {
            let key = message.split('\'').nth(1).expect("removed key quoted");
            vec![vec![format!("/{key}")]]
        }
        "AssertionError" => vec![BATCH_KEYS.iter().map(|s| s.to_string()).collect()],
        other => panic!("unmapped DeepSpeed error type {other}: {message}"),
    }
}

/// DeepSpeed's verdict on a file, looking through unresolved `"auto"` to the Trainer's result.
fn deepspeed_verdict(entry: &Value, hf: &Value) -> (Verdict, &'static str) {
    let ws8 = &entry["world_sizes"]["8"];
    if ws8["accepted"].as_bool() == Some(true) {
        return (Verdict::Accepted, "accepted");
    }
    let error = &ws8["error"];
    let caused_by_auto = error["type"] == "TypeError";
    if !caused_by_auto {
        return (Verdict::Rejected(blamed_pointers(error)), "rejected");
    }
    let run = hf["runs"]
        .as_array()
        .and_then(|runs| runs.iter().find(|r| r["scenario"] == HF_SCENARIO))
        .expect("hf_auto run for the scenario");
    match (
        run["stage"].as_str(),
        run["deepspeed"]["accepted"].as_bool(),
    ) {
        (Some("ok"), Some(false)) => (
            Verdict::Rejected(blamed_pointers(&run["deepspeed"]["error"])),
            "auto, then rejected",
        ),
        (Some("ok"), _) => (Verdict::Accepted, "auto, then accepted"),
        // The Trainer's mismatch check compares explicit values with this scenario's own
        // training arguments: a property of the scenario, not a defect of the file.
        _ => (Verdict::Accepted, "auto, scenario mismatch"),
    }
}

#[test]
fn dsplan_agrees_with_deepspeed_on_the_corpus() {
    let Some(shared) = shared() else {
        eprintln!(
            "skipping: ../shared not found (DeepSpeed's reference verdicts are not available)"
        );
        return;
    };
    let reference = load(&shared.join("reference/config_parse.json"));
    let hf_auto = load(&shared.join("reference/hf_auto.json"));
    let corpus = shared.join("corpus/ds_configs");
    let options = ValidateOptions {
        world_size: Some(8),
    };

    let mut failures = Vec::new();
    let mut unexpected_defects = BTreeSet::new();
    let mut table: std::collections::BTreeMap<(&str, &str), usize> = Default::default();
    for entry in reference["files"].as_array().expect("files") {
        let name = entry["file"].as_str().expect("file name");
        let hf = hf_auto["files"]
            .as_array()
            .and_then(|files| files.iter().find(|f| f["file"] == name))
            .expect("hf_auto entry");
        let (verdict, how) = deepspeed_verdict(entry, hf);
        let bytes = std::fs::read(corpus.join(name)).expect("corpus file");
        let diagnostics = match validate_source(name, &bytes, options) {
            Ok((_, diagnostics)) => diagnostics,
            Err(fatal) => fatal,
        };
        let errors: Vec<&Diagnostic> = diagnostics.iter().filter(|d| d.is_error()).collect();
        let ours = if errors.is_empty() {
            "valid"
        } else {
            "invalid"
        };
        *table.entry((how, ours)).or_default() += 1;
        match verdict {
            Verdict::Rejected(groups) => {
                for group in groups {
                    if !errors.iter().any(|e| group.contains(&e.pointer)) {
                        failures.push(format!(
                            "{name}: DeepSpeed rejects at {group:?}; dsplan errors: {:?}",
                            errors
                                .iter()
                                .map(|e| (&e.pointer, e.code.as_str()))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
            }
            Verdict::Accepted => {
                for error in errors {
                    unexpected_defects.insert((
                        name.to_string(),
                        error.pointer.clone(),
                        error.message.clone(),
                    ));
                }
            }
        }
    }

    eprintln!("\n| DeepSpeed (ws=8) | dsplan valid | dsplan invalid |\n|---|---|---|");
    let kinds: BTreeSet<&str> = table.keys().map(|(how, _)| *how).collect();
    for how in kinds {
        let count = |ours| table.get(&(how, ours)).copied().unwrap_or(0);
        eprintln!("| {how} | {} | {} |", count("valid"), count("invalid"));
    }

    let listed: BTreeSet<(String, String)> = DEFECTS_DEEPSPEED_LETS_THROUGH
        .iter()
        .map(|(file, pointer, _)| (file.to_string(), pointer.to_string()))
        .collect();
    let found: BTreeSet<(String, String)> = unexpected_defects
        .iter()
        .map(|(f, p, _)| (f.clone(), p.clone()))
        .collect();
    for (file, pointer, message) in &unexpected_defects {
        if !listed.contains(&(file.clone(), pointer.clone())) {
            failures.push(format!(
                "{file}: DeepSpeed accepts, dsplan errors at {pointer}: {message}"
            ));
        }
    }
    for (file, pointer) in listed.difference(&found) {
        failures.push(format!(
            "{file}: listed defect at {pointer} no longer reported"
        ));
    }
    assert!(
        failures.is_empty(),
        "{} disagreements:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
