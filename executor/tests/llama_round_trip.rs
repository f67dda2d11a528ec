//! Hugging Face directories in and out: the Llama fixture loaded, trained 5 steps through the
//! training path, saved (sharded, with its index, and as one file), loaded again: the same
//! config, the same parameters bit for bit, the same logits. Then the same directories read by
//! transformers itself (`from_pretrained`), where a Python with torch and transformers is found:
//! its logits equal dsplan's. Skips without `../shared`, and the transformers half without such
//! a Python (set `DSPLAN_PYTHON`; `bench/cpu_vs_pytorch.sh` makes `bench/.venv`).

mod support;

use dsplan_executor::data::WindowOrder;
use dsplan_executor::io::hf_weights::INDEX_FILE;
use dsplan_executor::io::llama_pretrained::{load_llama_pretrained, save_llama_pretrained};
use dsplan_executor::model::llama::Llama;
use dsplan_executor::model::llama::LlamaConfig;
use dsplan_executor::model::{BatchShape, ModelConfig};
use dsplan_executor::train::{DataChoice, TrainSettings, TrainSpec, train};
use dsplan_executor::zero::Dtype;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use support::python::python_with_transformers;
use support::{diff, llama_reference, read_tensors};

/// The fixture's model trained 5 steps: its config, initial and trained parameters.
fn trained_fixture(reference: &Path) -> (LlamaConfig, Vec<f32>, Vec<f32>) {
    let (config, params) =
        load_llama_pretrained(&reference.join("forward_backward")).expect("fixture");
    let settings = TrainSettings::from_config(
        &json!({
            "train_batch_size": 4,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_clipping": 1.0,
            "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.1}},
        }),
        1,
    )
    .expect("config");
    let spec = TrainSpec {
        settings,
        model: ModelConfig::Llama(config),
        initial_params: params.clone(),
        data: DataChoice::File {
            path: reference.join("adamw_trajectory/batches.safetensors"),
            order: WindowOrder::Sequential,
        },
        seq_len: 31,
        steps: 5,
        world: 1,
    };
    let trained = train(&spec, &|_| {}).expect("training runs").final_params;
    (config, params, trained)
}

/// dsplan's logits of `params` on the fixture's inputs (B=4, T=32).
fn logits(reference: &Path, config: LlamaConfig, params: Vec<f32>) -> Vec<f32> {
    let inputs = read_tensors(&reference.join("forward_backward/inputs.safetensors"));
    let tokens: Vec<u32> = inputs["input_ids"]
        .ints
        .iter()
        .map(|&t| u32::try_from(t).expect("token"))
        .collect();
    let shape = BatchShape {
        batch: 4,
        seq_len: 32,
    };
    let mut model = Llama::new(config, params, shape).expect("model");
    model.forward_logits(&tokens).expect("forward").to_vec()
}

#[test]
fn load_train_save_load_gives_the_same_logits() {
    let Some(reference) = llama_reference("qwen2") else {
        return;
    };
    let (config, params, trained) = trained_fixture(&reference);
    assert_ne!(trained, params, "training moved the parameters");
    let expected = logits(&reference, config, trained.clone());

    let dir = tempfile::tempdir().expect("temp dir");
    for (name, shard_bytes, sharded) in [("sharded", 100_000, true), ("single", u64::MAX, false)] {
        let out = dir.path().join(name);
        let files =
            save_llama_pretrained(&out, &config, &trained, Dtype::F32, shard_bytes).expect("saved");
        assert_eq!(out.join(INDEX_FILE).is_file(), sharded, "{name}: {files:?}");
        assert_eq!(files.len() > 1, sharded, "{name}: {files:?}");
        let (reloaded_config, reloaded) = load_llama_pretrained(&out).expect("loads back");
        assert_eq!(reloaded_config, config, "{name}: config");
        assert_eq!(reloaded, trained, "{name}: parameters bit for bit");
        assert_eq!(
            logits(&reference, reloaded_config, reloaded),
            expected,
            "{name}: logits"
        );
    }
}

/// Saving into a directory an earlier save wrote replaces its weights whichever way each was
/// written: a single file over shards leaves no index or shard behind (the index would be read
/// first), shards over a single file leave no `model.safetensors`; the directory loads back the
/// latest parameters. A file that only looks like a shard's name stays.
#[test]
fn a_save_over_an_earlier_one_leaves_only_its_own_weights() {
    let Some(reference) = llama_reference("qwen2") else {
        return;
    };
    let (config, params, trained) = trained_fixture(&reference);
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("saved");
    std::fs::create_dir_all(&out).expect("dir");
    std::fs::write(out.join("model-notes.safetensors"), b"kept").expect("write");
    let names = |out: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(out)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("model"))
            .collect();
        names.sort();
        names
    };
    for (weights, shard_bytes) in [(&params, 100_000), (&trained, u64::MAX), (&params, 100_000)] {
        let files =
            save_llama_pretrained(&out, &config, weights, Dtype::F32, shard_bytes).expect("saved");
        let mut expected = files.clone();
        if files.len() > 1 {
            expected.push(INDEX_FILE.to_string());
        }
        expected.push("model-notes.safetensors".to_string());
        expected.sort();
        assert_eq!(names(&out), expected, "after writing {files:?}");
        let (_, reloaded) = load_llama_pretrained(&out).expect("loads back");
        assert!(reloaded == *weights, "the latest save's parameters");
    }
}

/// Round trip through transformers itself: every fixture family (Llama untied, Qwen2 tied with
/// q/k/v biases, Llama 3 RoPE scaling) trained 5 steps, saved as float32 (sharded, with its
/// index) and as bfloat16 (one file), loaded by `AutoModelForCausalLM.from_pretrained`: its
/// logits equal dsplan's on the same weights. The tolerance is float32 arithmetic in another
/// order: the fixtures' READMEs give 2.5e-7 to 4.2e-7 between transformers' float32 and float64
/// logits, so 1e-5 absolute leaves a wide margin while any misplaced, transposed or wrongly
/// rounded tensor moves logits by far more.
#[test]
fn transformers_loads_what_dsplan_saves() {
    const TOLERANCE: f64 = 1e-5;
    let Some(shared) = llama_reference("llama") else {
        return;
    };
    let Some(python) = python_with_transformers(&Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
    else {
        return;
    };
    let llama = shared.parent().expect("llama fixtures").to_path_buf();
    // One set of token ids for every model (all have a vocabulary of 256).
    let inputs_from = llama.join("qwen2");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut saved = Vec::new();
    for fixture in ["llama", "qwen2", "llama3_rope"] {
        let reference = llama.join(fixture);
        let (config, _, trained) = trained_fixture(&reference);
        for (dtype, shard_bytes) in [(Dtype::F32, 100_000), (Dtype::Bf16, u64::MAX)] {
            let name = format!("{fixture}_{dtype:?}").to_lowercase();
            let out = dir.path().join(&name);
            save_llama_pretrained(&out, &config, &trained, dtype, shard_bytes).expect("saved");
            // dsplan's logits of exactly what was written (bf16 rounds the weights).
            let (reloaded_config, reloaded) = load_llama_pretrained(&out).expect("loads back");
            saved.push((name, out, logits(&inputs_from, reloaded_config, reloaded)));
        }
    }

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/hf_logits.py");
    let out = dir.path().join("transformers_logits.safetensors");
    let inputs = inputs_from.join("forward_backward/inputs.safetensors");
    let status = Command::new(&python)
        .arg(&script)
        .arg(&inputs)
        .arg(&out)
        .args(
            saved
                .iter()
                .map(|(name, path, _)| format!("{name}={}", path.display())),
        )
        .env("OMP_NUM_THREADS", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .status()
        .expect("python runs");
    assert!(status.success(), "{script:?} failed: {status}");
    let theirs = read_tensors(&out);
    for (name, _, ours) in &saved {
        let reference = &theirs[name.as_str()];
        assert_eq!(reference.floats.len(), ours.len(), "{name}: logits shape");
        let d = diff(ours, &reference.floats);
        eprintln!(
            "{name}: transformers vs dsplan logits max abs {:.3e}",
            d.max_abs
        );
        assert!(d.max_abs <= TOLERANCE, "{name}: max abs {:.3e}", d.max_abs);
    }
}
