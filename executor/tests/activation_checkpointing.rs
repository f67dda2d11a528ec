//! Activation checkpointing on the CPU is the same arithmetic as keeping every activation:
//! backward re-runs each block's forward from its saved input with the same parameters, so the
//! gradients are equal bit for bit.
//!
//! * the model alone: every gradient and the loss, with fp32 parameters and with parameters on
//!   the bf16 and fp16 grids (what the 16-bit runs compute with), over two accumulated
//!   micro-batches;
//! * whole runs, fp32, bf16 and fp16 at ZeRO stages 0-3 on two ranks: every step's loss and
//!   gradient norm, and the trained parameters, bit for bit; the activation arena is smaller;
//! * the same for the Llama family (`tiny-llama`: GQA, untied embeddings): the model alone
//!   with fp32 and bf16-grid parameters, and whole fp32 and bf16 runs at ZeRO stages 0-3.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::llama::Llama;
use dsplan_executor::model::{
    BatchShape, Gpt2, ModelConfig, ParamLayout, Recompute, init_params, next_token_targets,
};
use dsplan_executor::train::{
    DataChoice, TrainReport, TrainSettings, TrainSpec, choose_model, train,
};
use serde_json::{Value, json};

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Loss and gradients of two accumulated micro-batches, recomputing as `recompute` says.
fn gradients(params: &[f32], recompute: Recompute) -> (Vec<f32>, Vec<f32>, usize) {
    let config = *choose_model(None, 3)
        .expect("tiny-gpt2")
        .config
        .gpt2()
        .expect("a GPT-2");
    let shape = BatchShape {
        batch: 2,
        seq_len: 24,
    };
    let mut model =
        Gpt2::with_recompute(config, params.to_vec(), shape, recompute).expect("model builds");
    let vocab = config.vocab_size as u32;
    let mut losses = Vec::new();
    for micro in 0..2u32 {
        let tokens: Vec<u32> = (0..shape.tokens() as u32)
            .map(|i| (i * 31 + micro * 7 + i * i) % vocab)
            .collect();
        let targets = next_token_targets(&tokens, shape.seq_len);
        losses.push(
            model
                .forward_scaled(&tokens, &targets, 0.5)
                .expect("forward"),
        );
        model.backward().expect("backward");
    }
    let bytes = model.activation_layout().total_len() * 4;
    (losses, model.grads().to_vec(), bytes)
}

#[test]
fn recomputed_gradients_are_bit_identical() {
    let config = *choose_model(None, 3)
        .expect("tiny-gpt2")
        .config
        .gpt2()
        .expect("a GPT-2");
    let fp32 = init_params(&config, &ParamLayout::new(&config), 11);
    let bf16: Vec<f32> = fp32
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    let fp16: Vec<f32> = fp32
        .iter()
        .map(|&v| half::f16::from_f32(v).to_f32())
        .collect();
    for (name, params) in [("fp32", fp32), ("bf16", bf16), ("fp16", fp16)] {
        let (kept_loss, kept, kept_bytes) = gradients(&params, Recompute::Nothing);
        let (loss, recomputed, bytes) = gradients(&params, Recompute::EachLayer);
        assert_eq!(bits(&kept_loss), bits(&loss), "{name}: losses");
        assert!(kept.iter().any(|&g| g != 0.0), "{name}: gradients flow");
        assert!(
            bits(&kept) == bits(&recomputed),
            "{name}: gradients differ at {:?}",
            kept.iter()
                .zip(&recomputed)
                .position(|(a, b)| a.to_bits() != b.to_bits())
        );
        assert!(bytes < kept_bytes, "{name}: {bytes} < {kept_bytes}");
    }
}

fn run(stage: u8, precision: &Value, checkpointing: bool) -> TrainReport {
    let model = *choose_model(None, 5)
        .expect("tiny-gpt2")
        .config
        .gpt2()
        .expect("a GPT-2");
    let params = init_params(&model, &ParamLayout::new(&model), 5);
    run_model(model.into(), params, stage, precision, checkpointing)
}

fn run_model(
    model: ModelConfig,
    initial_params: Vec<f32>,
    stage: u8,
    precision: &Value,
    checkpointing: bool,
) -> TrainReport {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000,
            "stage3_param_persistence_threshold": 100},
    });
    if let (Some(target), Some(extra)) = (config.as_object_mut(), precision.as_object()) {
        target.extend(extra.clone());
    }
    if checkpointing {
        config["activation_checkpointing"] = json!({"partition_activations": true});
    }
    let settings = TrainSettings::from_config(&config, 2).expect("config");
    let expected = if checkpointing {
        Recompute::EachLayer
    } else {
        Recompute::Nothing
    };
    assert_eq!(settings.recompute, expected);
    let spec = TrainSpec {
        settings,
        model,
        initial_params,
        data: DataChoice::Bundled {
            order: WindowOrder::Sequential,
        },
        seq_len: 32,
        steps: 3,
        world: 2,
    };
    train(&spec, &|_| {}).expect("training runs")
}

#[test]
fn zero_runs_with_checkpointing_train_bit_identically() {
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
        (
            "fp16",
            json!({"fp16": {"enabled": true, "initial_scale_power": 8}}),
        ),
    ] {
        for stage in 0..=3u8 {
            let label = format!("{name} stage {stage}");
            let kept = run(stage, &precision, false);
            let recomputed = run(stage, &precision, true);
            same_training(&label, &kept, &recomputed);
        }
    }
}

/// Two runs, without and with recomputation, trained bit for bit alike, the second with a
/// smaller activation arena.
fn same_training(label: &str, kept: &TrainReport, recomputed: &TrainReport) {
    assert!(kept.applied_steps > 0, "{label}");
    assert_eq!(kept.steps.len(), recomputed.steps.len(), "{label}");
    for (a, b) in kept.steps.iter().zip(&recomputed.steps) {
        assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "{label}: loss");
        assert_eq!(
            a.grad_norm.map(f64::to_bits),
            b.grad_norm.map(f64::to_bits),
            "{label}: gradient norm"
        );
        assert_eq!(a.skipped, b.skipped, "{label}");
    }
    assert!(
        bits(&kept.final_params) == bits(&recomputed.final_params),
        "{label}: trained parameters"
    );
    let activations = |r: &TrainReport| r.memory[0].peak.get(Category::Activations);
    assert!(
        activations(recomputed) < activations(kept),
        "{label}: {} < {}",
        activations(recomputed),
        activations(kept)
    );
}

/// Loss and gradients of two accumulated micro-batches of `tiny-llama`.
fn llama_gradients(params: &[f32], recompute: Recompute) -> (Vec<f32>, Vec<f32>, usize) {
    let ModelConfig::Llama(config) = choose_model(Some("tiny-llama"), 3)
        .expect("tiny-llama")
        .config
    else {
        panic!("tiny-llama is a Llama-family model");
    };
    let shape = BatchShape {
        batch: 2,
        seq_len: 24,
    };
    let mut model =
        Llama::with_recompute(config, params.to_vec(), shape, recompute).expect("model builds");
    assert_eq!(model.core().recompute(), recompute);
    let vocab = config.vocab_size as u32;
    let mut losses = Vec::new();
    for micro in 0..2u32 {
        let tokens: Vec<u32> = (0..shape.tokens() as u32)
            .map(|i| (i * 31 + micro * 7 + i * i) % vocab)
            .collect();
        let targets = next_token_targets(&tokens, shape.seq_len);
        losses.push(
            model
                .forward_scaled(&tokens, &targets, 0.5)
                .expect("forward"),
        );
        model.backward().expect("backward");
    }
    let bytes = model.core().activation_bytes();
    (losses, model.grads().to_vec(), bytes)
}

#[test]
fn llama_recomputed_gradients_are_bit_identical() {
    let fp32 = choose_model(Some("tiny-llama"), 11)
        .expect("tiny-llama")
        .params;
    let bf16: Vec<f32> = fp32
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    for (name, params) in [("fp32", fp32), ("bf16", bf16)] {
        let (kept_loss, kept, kept_bytes) = llama_gradients(&params, Recompute::Nothing);
        let (loss, recomputed, bytes) = llama_gradients(&params, Recompute::EachLayer);
        assert_eq!(bits(&kept_loss), bits(&loss), "{name}: losses");
        assert!(kept.iter().any(|&g| g != 0.0), "{name}: gradients flow");
        assert!(
            bits(&kept) == bits(&recomputed),
            "{name}: gradients differ at {:?}",
            kept.iter()
                .zip(&recomputed)
                .position(|(a, b)| a.to_bits() != b.to_bits())
        );
        assert!(bytes < kept_bytes, "{name}: {bytes} < {kept_bytes}");
        eprintln!(
            "{name}: arena {kept_bytes} B kept, {bytes} B recomputed; gradients bit-identical"
        );
    }
}

#[test]
fn llama_zero_runs_with_checkpointing_train_bit_identically() {
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        for stage in 0..=3u8 {
            let label = format!("tiny-llama {name} stage {stage}");
            let model = choose_model(Some("tiny-llama"), 5).expect("tiny-llama");
            let kept = run_model(model.config, model.params.clone(), stage, &precision, false);
            let recomputed = run_model(model.config, model.params, stage, &precision, true);
            same_training(&label, &kept, &recomputed);
        }
    }
}
