//! `dsplan run` on TRL 1.16 `SFTTrainer` + DeepSpeed fixtures (`../shared/reference/sft`):
//! the dataset, the model directory, the run's `ds_config_input` and `sft_config_explicit` as
//! they are, through the binary; every step's loss and the eval loss within 1e-5 relative of
//! `trajectory.json`, and the weights `--save-model` writes within 5e-5 absolute of
//! `final_model.safetensors`. A malformed JSONL line exits 1 naming FILE:LINE. Skips without
//! `../shared`. The saved directory then generates, in transformers, the greedy continuation
//! dsplan's forward generates (where a Python with torch and transformers is found).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use dsplan_executor::io::llama_pretrained::load_llama_pretrained;
use dsplan_executor::model::BatchShape;
use dsplan_executor::model::llama::Llama;
use dsplan_sft::{AddSpecial, HfTokenizer};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

#[path = "../executor/tests/support/python.rs"]
mod python;
use python::python_with_transformers;

const REL_TOL: f64 = 1e-5;

/// The fp32 final parameters, absolute.
const PARAM_TOL: f64 = 5e-5;

fn sft_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared")))
        .join("reference/sft");
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: ../shared/reference/sft not found");
        None
    }
}

fn json(path: &std::path::Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// What a fixture's run reads as `--data`.
enum DataArg {
    /// Its JSONL dataset (and its eval set), writing its micro-batches here when given.
    Dataset { save_batches: Option<PathBuf> },
    /// Recorded micro-batches (rank 0's file).
    Recorded(PathBuf),
}

/// `dsplan run` on fixture `name` (its ds_config, its model and data copied into `work` so the
/// token cache goes there) with `changes` made to its `sft_config_explicit`, at the fixture's
/// world size, saving the model to `work/saved`: the `--metrics` lines.
fn run_fixture(root: &Path, name: &str, changes: &Value, work: &Path) -> Vec<Value> {
    let data = DataArg::Dataset { save_batches: None };
    run_fixture_on(root, name, changes, work, &data, &[])
}

/// [`run_fixture`] with `data` as `--data` and `extra` arguments (checkpoint flags).
fn run_fixture_on(
    root: &Path,
    name: &str,
    changes: &Value,
    work: &Path,
    data: &DataArg,
    extra: &[&std::ffi::OsStr],
) -> Vec<Value> {
    let run = json(&root.join("runs").join(name).join("run.json"));
    let world = json(&root.join("runs").join(name).join("trajectory.json"))["world_size"]
        .as_u64()
        .expect("world_size");
    let mut sft_config = run["sft_config_explicit"].clone();
    for (key, value) in changes.as_object().expect("changes") {
        sft_config[key] = value.clone();
    }
    let write = |file: &str, value: &Value| {
        let path = work.join(file);
        std::fs::write(&path, value.to_string()).expect("write");
        path
    };
    let ds = write("ds_config.json", &run["ds_config_input"]);
    let args = write("sft_config.json", &sft_config);
    let copy = |key: &str| {
        let source = root.join(run[key].as_str().expect("file"));
        let target = work.join(source.file_name().expect("name"));
        std::fs::copy(&source, &target).expect("copy");
        target
    };
    let metrics = work.join("metrics.jsonl");
    let mut command = Command::cargo_bin("dsplan").expect("binary");
    command
        .arg("run")
        .arg(&ds)
        .arg("--model")
        .arg(root.join(run["model"].as_str().expect("model")));
    match data {
        DataArg::Dataset { save_batches } => {
            let (train, eval) = (copy("train_file"), copy("eval_file"));
            command
                .arg("--data")
                .arg(&train)
                .arg("--eval-data")
                .arg(&eval);
            if let Some(path) = save_batches {
                command.arg("--save-batches").arg(path);
            }
        }
        DataArg::Recorded(path) => {
            command.arg("--data").arg(path);
        }
    }
    let output = command
        .arg("--training-args")
        .arg(&args)
        .arg("--world-size")
        .arg(world.to_string())
        .arg("--device")
        .arg("cpu")
        .arg("--metrics")
        .arg(&metrics)
        .arg("--save-model")
        .arg(work.join("saved"))
        .args(extra)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{name}: {stderr}");
    std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// Runs fixture `name` through `dsplan run` and checks it against the reference; the temp
/// directory and the model `--save-model` wrote in it (`None` without the fixtures).
fn check(name: &str) -> Option<(tempfile::TempDir, PathBuf)> {
    let root = sft_dir()?;
    let run_dir = root.join("runs").join(name);
    let trajectory = json(&run_dir.join("trajectory.json"));
    let work = tempfile::tempdir().expect("temp dir");
    let lines = run_fixture(&root, name, &serde_json::json!({}), work.path());
    let saved = work.path().join("saved");
    let losses: Vec<f64> = lines.iter().filter_map(|l| l["loss"].as_f64()).collect();
    let reference: Vec<f64> = trajectory["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["loss"].as_f64().expect("loss"))
        .collect();
    assert_eq!(losses.len(), reference.len(), "{name}: one loss per step");
    let rel = |o: f64, r: f64| (o - r).abs() / r.abs();
    let worst = losses
        .iter()
        .zip(&reference)
        .map(|(&o, &r)| rel(o, r))
        .fold(0.0, f64::max);
    let eval_ours = lines
        .iter()
        .find_map(|l| l["eval_loss"].as_f64())
        .expect("an eval_loss line");
    let eval_ref = trajectory["eval"]["eval_loss"].as_f64().expect("eval_loss");
    let eval = rel(eval_ours, eval_ref);
    eprintln!(
        "{name:24} step loss max rel {worst:.2e} | eval loss rel {eval:.2e} ({eval_ours:.6} vs {eval_ref:.6})"
    );
    assert!(worst < REL_TOL, "{name}: step loss {worst:e}");
    assert!(eval < REL_TOL, "{name}: eval loss {eval:e}");
    let params = final_params_apart(&saved, &run_dir.join("final_model.safetensors"));
    eprintln!("{name:24} final parameters max abs {params:.2e}");
    assert!(
        params < PARAM_TOL,
        "{name}: final parameters {params:e} apart"
    );
    Some((work, saved))
}

/// The largest absolute difference between the saved model's fp32 weights and the reference's,
/// tensor by tensor under the same names (every reference tensor must be saved).
fn final_params_apart(saved: &Path, reference: &Path) -> f64 {
    let saved = std::fs::read(saved.join("model.safetensors")).expect("saved model");
    let saved = SafeTensors::deserialize(&saved).expect("saved safetensors");
    let reference = std::fs::read(reference).expect("reference weights");
    let reference = SafeTensors::deserialize(&reference).expect("reference safetensors");
    let floats = |view: &safetensors::tensor::TensorView<'_>| -> Vec<f32> {
        assert_eq!(view.dtype(), Dtype::F32);
        view.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let mut worst = 0.0f64;
    for (name, expected) in reference.tensors() {
        let ours = saved
            .tensor(&name)
            .unwrap_or_else(|e| panic!("{name} not saved: {e}"));
        assert_eq!(ours.shape(), expected.shape(), "{name}");
        for (a, b) in floats(&ours).iter().zip(floats(&expected)) {
            worst = worst.max(f64::from((a - b).abs()));
        }
    }
    worst
}

#[test]
fn text_run_matches_sft_trainer() {
    check("text");
}

#[test]
fn text_packed_run_matches_sft_trainer() {
    check("text_packed");
}

#[test]
fn prompt_completion_run_matches_sft_trainer() {
    check("prompt_completion");
}

#[test]
fn messages_assistant_only_run_matches_sft_trainer() {
    check("messages_assistant_only");
}

#[test]
fn text_shuffled_run_matches_sft_trainer() {
    check("text_shuffled");
}

#[test]
fn text_ws2_run_matches_sft_trainer() {
    check("text_ws2");
}

/// The `--metrics` lines of `dsplan run` on the `text` fixture with `changes` made to its
/// `sft_config_explicit` (`None` without the fixtures).
fn text_run_with(changes: &Value) -> Option<Vec<Value>> {
    let root = sft_dir()?;
    let work = tempfile::tempdir().expect("temp dir");
    Some(run_fixture(&root, "text", changes, work.path()))
}

/// `(step, eval_loss)` of every eval line.
fn evals(lines: &[Value]) -> Vec<(u64, f64)> {
    lines
        .iter()
        .filter_map(|l| Some((l["step"].as_u64()?, l["eval_loss"].as_f64()?)))
        .collect()
}

/// `eval_strategy: "steps"` scores the eval set after every `eval_steps` steps and after the
/// last: each equals the end-of-training eval of a run stopped there (the fixture's schedule
/// is constant after its warmup, so the shorter run's steps are the longer run's), and the
/// last equals the SFTTrainer's.
#[test]
fn eval_steps_score_the_eval_set_during_training() {
    let Some(every_3) =
        text_run_with(&serde_json::json!({"eval_strategy": "steps", "eval_steps": 3}))
    else {
        return;
    };
    let scored = evals(&every_3);
    let steps: Vec<u64> = scored.iter().map(|&(step, _)| step).collect();
    // Steps from 0: after steps 3, 6, 9 and the last, the 10th.
    assert_eq!(steps, vec![2, 5, 8, 9], "{scored:?}");
    let six = text_run_with(&serde_json::json!({"max_steps": 6})).expect("fixtures");
    assert_eq!(
        evals(&six),
        vec![scored[1]],
        "the 6-step run's eval is the 10-step run's at 6"
    );
    let root = sft_dir().expect("fixtures");
    let reference = json(&root.join("runs/text/trajectory.json"))["eval"]["eval_loss"]
        .as_f64()
        .expect("eval_loss");
    let last = scored[3].1;
    assert!(
        (last - reference).abs() / reference < REL_TOL,
        "{last} vs {reference}"
    );
    eprintln!("eval every 3 steps: {scored:?}; the SFTTrainer's at 10: {reference}");
}

/// The data position is part of a checkpoint: a shuffled fine-tuning run stopped after 4 steps
/// and resumed from its checkpoint trains on the batches the uninterrupted 10-step run trains
/// on from step 5, and ends with the same weights, byte for byte.
#[test]
fn a_fine_tuning_run_resumed_from_its_checkpoint_ends_bit_for_bit() {
    let Some(root) = sft_dir() else {
        return;
    };
    let name = "text_shuffled";
    let whole_dir = tempfile::tempdir().expect("temp dir");
    let whole = run_fixture(&root, name, &serde_json::json!({}), whole_dir.path());
    let split_dir = tempfile::tempdir().expect("temp dir");
    let checkpoint = split_dir.path().join("ckpt");
    let save = [
        std::ffi::OsStr::new("--save-checkpoint"),
        checkpoint.as_os_str(),
    ];
    let data = DataArg::Dataset { save_batches: None };
    let first = serde_json::json!({"max_steps": 4});
    run_fixture_on(&root, name, &first, split_dir.path(), &data, &save);
    assert!(
        checkpoint.join("global_step4").is_dir(),
        "no checkpoint at step 4"
    );
    let resume = [std::ffi::OsStr::new("--resume"), checkpoint.as_os_str()];
    let rest = run_fixture_on(
        &root,
        name,
        &serde_json::json!({}),
        split_dir.path(),
        &data,
        &resume,
    );
    let losses = |lines: &[Value]| -> Vec<(u64, f64)> {
        lines
            .iter()
            .filter_map(|l| Some((l["step"].as_u64()?, l["loss"].as_f64()?)))
            .collect()
    };
    let (whole_losses, rest_losses) = (losses(&whole), losses(&rest));
    assert_eq!(rest_losses.len(), 6, "{rest_losses:?}");
    assert_eq!(
        rest_losses[..],
        whole_losses[4..],
        "the resumed steps' losses"
    );
    let weights = |dir: &Path| std::fs::read(dir.join("saved/model.safetensors")).expect("saved");
    assert!(
        weights(whole_dir.path()) == weights(split_dir.path()),
        "the resumed model differs from the uninterrupted one"
    );

    // A resume on other data is refused, with the fix.
    let work = split_dir.path();
    let refused = |sft_config: &Value| -> String {
        std::fs::write(work.join("sft_config.json"), sft_config.to_string()).expect("write");
        let output = Command::cargo_bin("dsplan")
            .expect("binary")
            .arg("run")
            .arg(work.join("ds_config.json"))
            .arg("--model")
            .arg(root.join("models/llama_bpe"))
            .arg("--data")
            .arg(work.join("text.jsonl"))
            .arg("--training-args")
            .arg(work.join("sft_config.json"))
            .arg("--device")
            .arg("cpu")
            .arg("--resume")
            .arg(&checkpoint)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        stderr
    };
    let config = json(&work.join("sft_config.json"));
    // Rows cut shorter: the micro-batches are shorter than the checkpoint's.
    let mut shorter = config.clone();
    shorter["max_length"] = serde_json::json!(32);
    let stderr = refused(&shorter);
    assert!(
        stderr.contains("`seq_len` is 96, this run has 32")
            && stderr.contains("the data and max_length"),
        "{stderr}"
    );
    // The same name and lengths, one row fewer: the prepared tokens differ.
    let train = work.join("text.jsonl");
    let text = std::fs::read_to_string(&train).expect("train data");
    let rows: Vec<&str> = text.lines().collect();
    std::fs::write(&train, rows[..rows.len() - 1].join("\n") + "\n").expect("write");
    let stderr = refused(&config);
    assert!(
        stderr.contains("`data`") && stderr.contains("labelled"),
        "names the data: {stderr}"
    );
}

/// `--eval-split 0.1` holds the last tenth of the records out of training and scores them:
/// the same steps and eval loss, bit for bit, as `--data` of the first nine tenths with
/// `--eval-data` of the last tenth; and it is refused beside `--eval-data` or out of (0, 1).
#[test]
fn an_eval_split_trains_and_scores_as_two_files_do() {
    let Some(root) = sft_dir() else {
        return;
    };
    let run = json(&root.join("runs/text/run.json"));
    let work = tempfile::tempdir().expect("temp dir");
    let path = |file: &str| work.path().join(file);
    std::fs::write(path("ds_config.json"), run["ds_config_input"].to_string()).expect("write");
    std::fs::write(path("sft.json"), run["sft_config_explicit"].to_string()).expect("write");
    let text = std::fs::read_to_string(root.join(run["train_file"].as_str().expect("file")))
        .expect("data");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let boundary = lines.len() - (0.1 * lines.len() as f64).ceil() as usize;
    let write = |file: &str, part: &[&str]| {
        std::fs::write(path(file), part.join("\n") + "\n").expect("write");
        path(file)
    };
    let (all, first, last) = (
        write("all.jsonl", &lines),
        write("first.jsonl", &lines[..boundary]),
        write("last.jsonl", &lines[boundary..]),
    );
    let dsplan = |data: &[&std::ffi::OsStr], metrics: &str| {
        let output = Command::cargo_bin("dsplan")
            .expect("binary")
            .arg("run")
            .arg(path("ds_config.json"))
            .arg("--model")
            .arg(root.join(run["model"].as_str().expect("model")))
            .args(data)
            .arg("--training-args")
            .arg(path("sft.json"))
            .arg("--device")
            .arg("cpu")
            .arg("--metrics")
            .arg(path(metrics))
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        (output.status.code(), stderr)
    };
    let os = std::ffi::OsStr::new;
    let (code, stderr) = dsplan(
        &[os("--data"), all.as_os_str(), os("--eval-split"), os("0.1")],
        "split.jsonl",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = dsplan(
        &[
            os("--data"),
            first.as_os_str(),
            os("--eval-data"),
            last.as_os_str(),
        ],
        "files.jsonl",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let metrics = |file: &str| std::fs::read_to_string(path(file)).expect("metrics");
    let scores = |text: &str| -> Vec<(Option<f64>, Option<f64>)> {
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
            .map(|v| (v["loss"].as_f64(), v["eval_loss"].as_f64()))
            .collect()
    };
    let (split, files) = (
        scores(&metrics("split.jsonl")),
        scores(&metrics("files.jsonl")),
    );
    assert!(
        split.iter().any(|(_, eval)| eval.is_some()),
        "an eval loss: {split:?}"
    );
    assert_eq!(
        split, files,
        "the split trains and scores as the two files do"
    );

    let (code, stderr) = dsplan(
        &[os("--data"), all.as_os_str(), os("--eval-split"), os("1.5")],
        "bad.jsonl",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--eval-split 1.5 is not a fraction"),
        "{stderr}"
    );
    let (code, stderr) = dsplan(
        &[
            os("--data"),
            all.as_os_str(),
            os("--eval-data"),
            last.as_os_str(),
            os("--eval-split"),
            os("0.1"),
        ],
        "bad.jsonl",
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

/// The integer tensors of a safetensors file whose names start with `train.`, as i64.
fn train_tensors(path: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<i64>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = SafeTensors::deserialize(&bytes).expect("safetensors");
    file.tensors()
        .into_iter()
        .filter(|(name, _)| name.starts_with("train."))
        .map(|(name, view)| {
            let values = match view.dtype() {
                Dtype::I64 => view
                    .data()
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                    .collect(),
                Dtype::I32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|b| i64::from(i32::from_le_bytes(b.try_into().expect("4 bytes"))))
                    .collect(),
                other => panic!("{name}: dtype {other:?}"),
            };
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// `--save-batches` writes the micro-batches of the run, tensor for tensor the ones TRL's
/// collator made for the SFTTrainer (padded, packed and assistant-masked, one rank and two),
/// and `--data` of those files replays the run: every step's loss and grad norm equal to the
/// JSONL run's, bit for bit.
#[test]
fn saved_batches_are_the_collators_and_replay_the_run() {
    let Some(root) = sft_dir() else {
        return;
    };
    for name in ["text", "text_packed", "messages_assistant_only", "text_ws2"] {
        let work = tempfile::tempdir().expect("temp dir");
        let saved = work.path().join("batches.safetensors");
        let data = DataArg::Dataset {
            save_batches: Some(saved.clone()),
        };
        let from_jsonl =
            run_fixture_on(&root, name, &serde_json::json!({}), work.path(), &data, &[]);
        let run_dir = root.join("runs").join(name);
        let pairs: Vec<(PathBuf, PathBuf)> = if run_dir.join("batches.safetensors").is_file() {
            vec![(saved.clone(), run_dir.join("batches.safetensors"))]
        } else {
            (0..2)
                .map(|rank| {
                    let file = format!("batches_rank{rank}.safetensors");
                    (work.path().join(&file), run_dir.join(&file))
                })
                .collect()
        };
        for (ours, theirs) in &pairs {
            let (ours, theirs) = (train_tensors(ours), train_tensors(theirs));
            assert!(!ours.is_empty(), "{name}: nothing saved");
            for (tensor, value) in &ours {
                assert_eq!(Some(value), theirs.get(tensor), "{name}: {tensor}");
            }
            let keys = |t: &std::collections::BTreeMap<String, _>| -> usize {
                t.keys()
                    .filter(|k| {
                        ["input_ids", "labels", "attention_mask", "position_ids"]
                            .iter()
                            .any(|key| k.ends_with(&format!(".{key}")))
                    })
                    .count()
            };
            assert_eq!(keys(&ours), keys(&theirs), "{name}: the same tensors");
        }
        let replay_dir = tempfile::tempdir().expect("temp dir");
        let recorded = DataArg::Recorded(pairs[0].0.clone());
        let replayed = run_fixture_on(
            &root,
            name,
            &serde_json::json!({}),
            replay_dir.path(),
            &recorded,
            &[],
        );
        let steps = |lines: &[Value]| -> Vec<(f64, f64)> {
            lines
                .iter()
                .filter_map(|l| Some((l["loss"].as_f64()?, l["grad_norm"].as_f64()?)))
                .collect()
        };
        assert!(!steps(&from_jsonl).is_empty(), "{name}: no step");
        assert_eq!(steps(&replayed), steps(&from_jsonl), "{name}: replayed run");
        eprintln!(
            "{name:24} {} saved file(s) equal the collator's; {} replayed steps equal",
            pairs.len(),
            steps(&replayed).len()
        );
    }
}

/// Tokens generated past the prompt in the round trip.
const NEW_TOKENS: usize = 12;

/// The saved directory loads in transformers with its tokenizer and generates, greedily, the
/// same continuation as dsplan's forward on the same weights: the chat-template fixture's
/// model (SentencePiece-style tokenizer) after its run. Skips without a Python with torch and
/// transformers.
#[test]
fn transformers_generates_what_dsplan_generates_from_the_saved_directory() {
    let Some((_work, saved)) = check("messages_assistant_only") else {
        return;
    };
    let Some(python) = python_with_transformers(Path::new(env!("CARGO_MANIFEST_DIR"))) else {
        return;
    };
    let prompt = "Return a new list containing all items from the iterable";
    let (config, params) = load_llama_pretrained(&saved).expect("the saved model loads");
    let tokenizer = HfTokenizer::from_dir(&saved).expect("the saved tokenizer loads");
    let mut ids = tokenizer.encode(prompt, AddSpecial::Yes).expect("encodes");
    let prompt_ids = ids.clone();
    for _ in 0..NEW_TOKENS {
        let shape = BatchShape {
            batch: 1,
            seq_len: ids.len(),
        };
        let mut model = Llama::new(config, params.clone(), shape).expect("model");
        let logits = model.forward_logits(&ids).expect("forward");
        let last = &logits[logits.len() - config.vocab_size..];
        let next = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .expect("a vocabulary");
        ids.push(u32::try_from(next).expect("id"));
    }
    let script = r#"
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, prompt, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
model.generation_config.eos_token_id = None
prompt_ids = tok(prompt)["input_ids"]
out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new, do_sample=False,
                     pad_token_id=0)
ids = out[0].tolist()
print(json.dumps({"prompt_ids": prompt_ids, "ids": ids,
                  "text": tok.decode(ids[len(prompt_ids):])}))
"#;
    let output = std::process::Command::new(&python)
        .args(["-c", script])
        .arg(&saved)
        .arg(prompt)
        .arg(NEW_TOKENS.to_string())
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let theirs: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let as_ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| u32::try_from(x.as_u64().expect("id")).expect("id"))
            .collect()
    };
    assert_eq!(
        as_ids(&theirs["prompt_ids"]),
        prompt_ids,
        "the prompt's ids"
    );
    assert_eq!(as_ids(&theirs["ids"]), ids, "the greedy continuation");
    let text = tokenizer.decode(&ids[prompt_ids.len()..]).expect("decodes");
    assert_eq!(theirs["text"].as_str(), Some(text.as_str()));
    eprintln!("greedy continuation, equal in transformers: {text:?}");
}

#[test]
fn a_malformed_jsonl_line_is_refused_naming_file_and_line() {
    let Some(root) = sft_dir() else { return };
    let work = tempfile::tempdir().expect("temp dir");
    let data = work.path().join("bad.jsonl");
    std::fs::write(&data, "{\"text\": \"fine\"}\n{\"text\": oops}\n").expect("write");
    let args = work.path().join("args.json");
    std::fs::write(
        &args,
        r#"{"lr_scheduler_type": "constant", "max_steps": 1}"#,
    )
    .expect("write");
    let ds = work.path().join("ds.json");
    std::fs::write(&ds, r#"{"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}"#).expect("write");
    let output = Command::cargo_bin("dsplan")
        .expect("binary")
        .arg("run")
        .arg(&ds)
        .arg("--model")
        .arg(root.join("models/llama_bpe"))
        .arg("--data")
        .arg(&data)
        .arg("--training-args")
        .arg(&args)
        .arg("--device")
        .arg("cpu")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad.jsonl:2"), "{stderr}");
}
