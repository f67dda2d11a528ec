//! Hugging Face directories in and out: the Llama fixture loaded, trained 5 steps through the
//! training path, saved (sharded, with its index, and as one file), loaded again: the same
//! config, the same parameters bit for bit, the same logits. Skips without `../shared`.

mod support;

use dsplan_executor::data::WindowOrder;
use dsplan_executor::io::hf_weights::INDEX_FILE;
use dsplan_executor::io::llama_pretrained::{load_llama_pretrained, save_llama_pretrained};
use dsplan_executor::model::llama::Llama;
use dsplan_executor::model::{BatchShape, ModelConfig};
use dsplan_executor::train::{DataChoice, TrainSettings, TrainSpec, train};
use dsplan_executor::zero::Dtype;
use serde_json::json;
use support::{llama_reference, read_tensors};

#[test]
fn load_train_save_load_gives_the_same_logits() {
    let Some(reference) = llama_reference("qwen2") else {
        return;
    };
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
    assert_ne!(trained, params, "training moved the parameters");

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
    let logits = |config, params| {
        let mut model = Llama::new(config, params, shape).expect("model");
        model.forward_logits(&tokens).expect("forward").to_vec()
    };
    let expected = logits(config, trained.clone());

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
            logits(reloaded_config, reloaded),
            expected,
            "{name}: logits"
        );
    }
}
