//! A checkpoint corrupted in every way a disk, a copy or a careless edit can corrupt it is
//! either refused with a message naming the corrupted file, or provably harmless: the run
//! resumed from it ends bit for bit where the uninterrupted run ends.
//!
//! For every file of a saved tag (`global_step4` of a 6-step run saving every 2 steps; ZeRO
//! stage 2 with fp16's dynamic loss scale, and stage 3 with bf16, 2 ranks each):
//!
//! * truncated to half, to nothing, and by one byte; one byte flipped at its start, middle
//!   and end; replaced by the same file of `global_step2`;
//! * a NaN written into the first element of every tensor (safetensors files), with and
//!   without the manifest's digest updated to match;
//! * every JSON field edited (JSON files: every leaf of `engine_state.json` and
//!   `manifest.json`; safetensors files: every metadata entry), each to several values, with
//!   and without the manifest updated: the updated cases exercise the range checks behind
//!   the digests.

use std::path::{Path, PathBuf};

use dsplan_executor::checkpoint::{MANIFEST, Manifest, file_digest, load_checkpoint};
use dsplan_executor::data::WindowOrder;
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use dsplan_executor::train::{
    CheckpointOptions, DataChoice, SavePolicy, TrainReport, TrainSettings, TrainSpec, compile_plan,
    resume_point, train_planned_with,
};
use serde_json::{Value, json};

const MODEL: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 16,
    n_embd: 16,
    n_layer: 1,
    n_head: 2,
    layer_norm_epsilon: 1e-5,
};

fn spec(stage: u8, precision: &Value, steps: u64) -> TrainSpec {
    let mut config = json!({
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000,
            "stage3_param_persistence_threshold": 100},
    });
    if let (Some(target), Some(extra)) = (config.as_object_mut(), precision.as_object()) {
        for (key, value) in extra {
            target.insert(key.clone(), value.clone());
        }
    }
    TrainSpec {
        settings: TrainSettings::from_config(&config, 2).expect("config"),
        model: MODEL.into(),
        initial_params: init_params(&MODEL, &ParamLayout::new(&MODEL), 5),
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 9 },
        },
        seq_len: 8,
        steps,
        world: 2,
    }
}

fn run(
    spec: &TrainSpec,
    save: Option<&Path>,
    resume: Option<&Path>,
) -> Result<TrainReport, String> {
    let plan = compile_plan(&spec.settings, &spec.model, spec.seq_len, spec.world).expect("plan");
    let resume = match resume {
        Some(path) => {
            let loaded = load_checkpoint(path).map_err(|e| e.to_string())?;
            Some(resume_point(spec, &plan, &loaded).map_err(|e| e.to_string())?)
        }
        None => None,
    };
    let options = CheckpointOptions {
        save: save.map(|dir| SavePolicy::new(dir, Some(2))),
        resume,
    };
    train_planned_with(spec, &plan, &options, &|_| {}).map_err(|e| e.to_string())
}

fn bits(report: &TrainReport) -> (Vec<u32>, Vec<u64>) {
    (
        report.final_params.iter().map(|x| x.to_bits()).collect(),
        report.steps.iter().map(|s| s.loss.to_bits()).collect(),
    )
}

/// One corruption: its name, what it does to the tag directory's file, and whether it
/// forges the manifest's digest to match (a deliberate edit rather than a corruption).
struct Case {
    name: String,
    forged: bool,
    apply: Box<dyn Fn(&Path)>,
}

fn case(name: String, apply: impl Fn(&Path) + 'static) -> Case {
    let forged = name.contains("manifest updated: true");
    Case {
        name,
        forged,
        apply: Box::new(apply),
    }
}

/// Rewrites the manifest of `tag` so that `file`'s digest matches its current bytes.
fn redigest(tag: &Path, file: &str) {
    let path = tag.join(MANIFEST);
    let mut manifest: Manifest =
        serde_json::from_slice(&std::fs::read(&path).expect("manifest")).expect("parsed");
    let bytes = std::fs::read(tag.join(file)).expect("file");
    if let Some(entry) = manifest.files.get_mut(file) {
        entry.bytes = bytes.len() as u64;
        entry.crc32 = file_digest(&bytes);
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).expect("json")).expect("written");
}

/// Every leaf of `value` with its JSON pointer.
fn leaves(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                leaves(child, format!("{pointer}/{key}"), out);
            }
        }
        // Two entries of a list stand for the rest (the layout lists every tensor).
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate().take(2) {
                leaves(child, format!("{pointer}/{index}"), out);
            }
        }
        _ => out.push(pointer),
    }
}

/// The edits a leaf gets.
fn edits(value: &Value) -> Vec<Value> {
    match value {
        Value::Number(n) if n.is_u64() || n.is_i64() => {
            let n = n.as_i64().unwrap_or(i64::MAX);
            vec![
                json!(n + 1),
                json!(0),
                json!(-1),
                json!(n.saturating_mul(1000)),
            ]
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            vec![json!(-1.0), json!(0.0), json!(x * 2.0 + 1.0)]
        }
        Value::String(s) => vec![json!(format!("{s}x")), json!("")],
        Value::Bool(b) => vec![json!(!b)],
        Value::Null => vec![json!(1)],
        _ => vec![],
    }
}

/// The cases for `file` of the tag (its bytes `bytes`).
fn cases_for(file: &str, bytes: &[u8]) -> Vec<Case> {
    let mut cases = Vec::new();
    let len = bytes.len();
    for (what, keep) in [
        ("to half", len / 2),
        ("to nothing", 0),
        ("by a byte", len - 1),
    ] {
        let f = file.to_string();
        cases.push(case(format!("{file}: truncated {what}"), move |tag| {
            let bytes = std::fs::read(tag.join(&f)).expect("read");
            std::fs::write(tag.join(&f), &bytes[..keep]).expect("write");
        }));
    }
    for (what, at) in [("first", 0), ("middle", len / 2), ("last", len - 1)] {
        let f = file.to_string();
        cases.push(case(format!("{file}: {what} byte flipped"), move |tag| {
            let mut bytes = std::fs::read(tag.join(&f)).expect("read");
            bytes[at] ^= 0x5a;
            std::fs::write(tag.join(&f), &bytes).expect("write");
        }));
    }
    let f = file.to_string();
    cases.push(case(
        format!("{file}: swapped with global_step2's"),
        move |tag| {
            let other = tag.with_file_name("global_step2").join(&f);
            std::fs::copy(other, tag.join(&f)).expect("copied");
        },
    ));
    if file.ends_with(".safetensors") {
        let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
        let header_map = header.as_object().cloned().unwrap_or_default();
        for (name, info) in &header_map {
            if name == "__metadata__" {
                continue;
            }
            let start = info["data_offsets"][0].as_u64().expect("offset") as usize;
            let nan: Vec<u8> = match info["dtype"].as_str() {
                Some("F32") => f32::NAN.to_le_bytes().to_vec(),
                Some("BF16") => vec![0xc0, 0x7f],
                _ => vec![0x00, 0x7e],
            };
            for manifest_updated in [false, true] {
                let f = file.to_string();
                let nan = nan.clone();
                let at = 8 + header_len + start;
                cases.push(case(
                    format!("{file}: NaN in `{name}` (manifest updated: {manifest_updated})"),
                    move |tag| {
                        let mut bytes = std::fs::read(tag.join(&f)).expect("read");
                        bytes[at..at + nan.len()].copy_from_slice(&nan);
                        std::fs::write(tag.join(&f), &bytes).expect("write");
                        if manifest_updated {
                            redigest(tag, &f);
                        }
                    },
                ));
            }
        }
        if let Some(metadata) = header_map.get("__metadata__").and_then(Value::as_object) {
            for (key, value) in metadata {
                let Some(text) = value.as_str() else { continue };
                for replacement in [format!("{text}1"), "0".to_string(), "x".to_string()] {
                    for manifest_updated in [false, true] {
                        let f = file.to_string();
                        let (key, text, replacement) =
                            (key.clone(), text.to_string(), replacement.clone());
                        cases.push(case(
                            format!(
                                "{file}: metadata {key} `{text}` -> `{replacement}` (manifest \
                                 updated: {manifest_updated})"
                            ),
                            move |tag| {
                                let bytes = std::fs::read(tag.join(&f)).expect("read");
                                let n = u64::from_le_bytes(bytes[..8].try_into().expect("8"));
                                let mut header: Value =
                                    serde_json::from_slice(&bytes[8..8 + n as usize])
                                        .expect("header");
                                header["__metadata__"][&key] = json!(replacement);
                                let text = serde_json::to_vec(&header).expect("json");
                                let mut out = (text.len() as u64).to_le_bytes().to_vec();
                                out.extend_from_slice(&text);
                                out.extend_from_slice(&bytes[8 + n as usize..]);
                                std::fs::write(tag.join(&f), out).expect("write");
                                if manifest_updated {
                                    redigest(tag, &f);
                                }
                            },
                        ));
                    }
                }
            }
        }
    } else {
        let document: Value = serde_json::from_slice(bytes).expect("json");
        let mut pointers = Vec::new();
        leaves(&document, String::new(), &mut pointers);
        for pointer in pointers {
            let original = document.pointer(&pointer).cloned().unwrap_or(Value::Null);
            for edit in edits(&original) {
                let updates: &[bool] = if file == MANIFEST {
                    &[false]
                } else {
                    &[false, true]
                };
                for &manifest_updated in updates {
                    let f = file.to_string();
                    let (pointer, edit) = (pointer.clone(), edit.clone());
                    cases.push(case(
                        format!(
                            "{file}: {pointer} {original} -> {edit} (manifest updated: \
                             {manifest_updated})"
                        ),
                        move |tag| {
                            let mut document: Value =
                                serde_json::from_slice(&std::fs::read(tag.join(&f)).expect("read"))
                                    .expect("json");
                            if let Some(slot) = document.pointer_mut(&pointer) {
                                *slot = edit.clone();
                            }
                            std::fs::write(
                                tag.join(&f),
                                serde_json::to_vec_pretty(&document).expect("json"),
                            )
                            .expect("write");
                            if manifest_updated {
                                redigest(tag, &f);
                            }
                        },
                    ));
                }
            }
        }
    }
    cases
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("created");
    for entry in std::fs::read_dir(from).expect("listed") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copied");
        }
    }
}

/// What one setup's fuzzing found.
#[derive(Debug, Default)]
struct Counts {
    /// Corruptions (digest left as saved).
    corrupted: usize,
    /// Of those, refused naming the corrupted file.
    refused: usize,
    /// Of those, resumed bit-identically.
    harmless: usize,
    /// Edits with the manifest forged to match.
    forged: usize,
    /// Of those, refused naming a file of the tag.
    forged_refused: usize,
    /// Of those, resumed bit-identically.
    forged_harmless: usize,
    /// Of those, accepted as a valid state (a different loss scale, step count, ...).
    forged_accepted: usize,
}

fn fuzz(stage: u8, precision: &Value) -> Counts {
    let whole = run(&spec(stage, precision, 6), None, None).expect("whole run");
    let saved = tempfile::tempdir().expect("temp dir");
    run(&spec(stage, precision, 6), Some(saved.path()), None).expect("saving run");
    let pristine = saved.path().join("global_step4");
    let intact = run(&spec(stage, precision, 6), None, Some(&pristine)).expect("intact resume");
    assert_eq!(
        bits(&intact),
        bits(&whole.clone_tail(4)),
        "the intact tag resumes"
    );

    let mut files: Vec<String> = std::fs::read_dir(&pristine)
        .expect("listed")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut counts = Counts::default();
    let mut failures = Vec::new();
    let mut cases: Vec<(String, Case)> = Vec::new();
    for file in &files {
        let bytes = std::fs::read(pristine.join(file)).expect("read");
        cases.extend(
            cases_for(file, &bytes)
                .into_iter()
                .map(|c| (file.clone(), c)),
        );
    }
    // The range checks' own cases: the loss scale, and `layout.owned` reversed.
    cases.push((
        "engine_state.json".to_string(),
        case(
            "engine_state.json: layout.owned[1] reversed (manifest updated: true)".to_string(),
            |tag| {
                let path = tag.join("engine_state.json");
                let mut state: Value =
                    serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
                if let Some(range) = state
                    .pointer_mut("/layout/owned/1")
                    .and_then(Value::as_array_mut)
                {
                    range.reverse();
                }
                std::fs::write(&path, serde_json::to_vec_pretty(&state).expect("json"))
                    .expect("write");
                redigest(tag, "engine_state.json");
            },
        ),
    ));
    for (file, case) in cases {
        let work = tempfile::tempdir().expect("temp dir");
        copy_dir(saved.path(), work.path());
        let tag: PathBuf = work.path().join("global_step4");
        (case.apply)(&tag);
        let outcome = run(&spec(stage, precision, 6), None, Some(&tag));
        let identical = matches!(&outcome, Ok(r) if bits(r) == bits(&whole.clone_tail(4)));
        if case.forged {
            counts.forged += 1;
            // What the issue found resuming silently is refused even with the digest forged.
            let name = &case.name;
            let must_refuse = name.contains("NaN in")
                || name.contains("layout.owned[1] reversed")
                || (name.contains("/loss_scaler/scale ")
                    && (name.contains("-> -1") || name.contains("-> 0")));
            if must_refuse && outcome.is_ok() {
                failures.push(format!("{name}: resumed, it must be refused"));
            }
            match &outcome {
                Err(message) if message.contains("global_step4/") => counts.forged_refused += 1,
                Err(message) => failures.push(format!(
                    "{}: refused without naming a file of the tag: {message}",
                    case.name
                )),
                Ok(_) if identical => counts.forged_harmless += 1,
                Ok(_) => counts.forged_accepted += 1,
            }
            continue;
        }
        counts.corrupted += 1;
        match &outcome {
            Err(message) if message.contains(file.as_str()) => counts.refused += 1,
            Err(message) => failures.push(format!(
                "{}: refused without naming {file}: {message}",
                case.name
            )),
            Ok(_) if identical => counts.harmless += 1,
            Ok(_) => failures.push(format!(
                "{}: resumed, and the run differs from the intact one",
                case.name
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    counts
}

/// The steps from `first` on of a report (what a run resumed at `first` reports).
trait Tail {
    fn clone_tail(&self, first: usize) -> TrainReport;
}

impl Tail for TrainReport {
    fn clone_tail(&self, first: usize) -> TrainReport {
        let mut tail = self.clone();
        tail.steps = self.steps[first..].to_vec();
        tail
    }
}

#[test]
fn every_corruption_of_every_file_is_refused_by_name_or_harmless() {
    let fp16 = json!({"fp16": {"enabled": true, "initial_scale_power": 12,
        "loss_scale_window": 2, "hysteresis": 2}});
    let bf16 = json!({"bf16": {"enabled": true}});
    for (what, stage, precision) in [("stage 2 fp16", 2u8, &fp16), ("stage 3 bf16", 3, &bf16)] {
        let c = fuzz(stage, precision);
        eprintln!(
            "{what}: {} corruptions: {} refused naming the file, {} harmless (bit-identical \
             resume); {} edits with the manifest forged to match: {} refused, {} harmless, {} \
             accepted as valid states",
            c.corrupted,
            c.refused,
            c.harmless,
            c.forged,
            c.forged_refused,
            c.forged_harmless,
            c.forged_accepted
        );
        assert_eq!(c.corrupted, c.refused + c.harmless);
        assert!(c.corrupted > 100, "{c:?}");
    }
}
