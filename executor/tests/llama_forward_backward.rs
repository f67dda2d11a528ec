//! The CPU Llama-family decoder against Hugging Face `transformers` 5.23
//! (`reference/llama/{llama,qwen2,llama3_rope}/forward_backward`): the RoPE table, logits, loss
//! and every parameter gradient of one forward/backward, against the true-f64 reference.
//!
//! Tolerances are calibrated on the READMEs' f32-vs-f64 gaps (logits 2.5e-7 to 4.2e-7 abs,
//! gradients 6.5e-7 to 8.3e-7 of each tensor's max): 10x those; the smallest deliberate bug the
//! READMEs list moves the logits by 9.7e-4 and a gradient by 4.3e-3 of its scale. Prints the
//! measured errors. Skips without `../shared`.

mod support;

use dsplan_executor::io::llama_pretrained::load_llama_pretrained;
use dsplan_executor::model::llama::Llama;
use dsplan_executor::model::{BatchShape, next_token_targets};
use support::{diff, llama_reference, read_tensors};

/// Logits, absolute, vs the f64 reference (10x the worst f32-vs-f64 gap, 4.2e-7).
const LOGITS_ABS_TOL: f64 = 5e-6;
/// Each gradient tensor's max error over its max |g|, vs f64 (10x the worst gap, 8.3e-7).
const GRAD_SCALED_TOL: f64 = 1e-5;
/// Loss, absolute, vs f64.
const LOSS_ABS_TOL: f64 = 5e-6;

fn check(model_name: &str) {
    let Some(reference) = llama_reference(model_name) else {
        return;
    };
    let dir = reference.join("forward_backward");
    let (config, params) = load_llama_pretrained(&dir).expect("fixture model loads");
    // The legacy config layout (`rope_theta` + `rope_scaling`) reads identically.
    let legacy = dsplan_executor::io::llama_config::read_llama_config(
        &dir.join("config_legacy_format.json"),
    )
    .expect("legacy config");
    assert_eq!(
        legacy, config,
        "{model_name}: both config layouts read the same"
    );

    let inputs = read_tensors(&dir.join("inputs.safetensors"));
    let input_ids = &inputs["input_ids"];
    let (batch, seq_len) = (input_ids.shape[0], input_ids.shape[1]);
    let tokens: Vec<u32> = input_ids
        .ints
        .iter()
        .map(|&t| u32::try_from(t).expect("token id"))
        .collect();
    let targets = next_token_targets(&tokens, seq_len);
    let mut model =
        Llama::new(config, params, BatchShape { batch, seq_len }).expect("model builds");

    // RoPE: inv_freq (after any scaling) and the cos/sin table HF returns.
    let rope = read_tensors(&dir.join("rope.safetensors"));
    let inv_freq = config.rope.inv_freq(config.head_dim, seq_len);
    let inv = diff(&inv_freq, &rope["inv_freq_f64"].floats);
    let table = model.core().rope_table();
    let half = config.head_dim / 2;
    let cos_ref: Vec<f64> = rope["cos_f64"]
        .floats
        .chunks(2 * half)
        .flat_map(|row| row[..half].to_vec())
        .collect();
    let cos = diff(table.cos(), &cos_ref);
    eprintln!("{model_name}: inv_freq vs f64 {inv:?}; cos vs f64 {cos:?}");
    assert!(inv.max_rel < 1e-6, "{model_name}: inv_freq {inv:?}");
    assert!(cos.max_abs < 2e-6, "{model_name}: cos {cos:?}");

    let outputs64 = read_tensors(&dir.join("outputs_f64.safetensors"));
    let logits = model.forward_logits(&tokens).expect("forward").to_vec();
    let logits64 = diff(&logits, &outputs64["logits"].floats);
    eprintln!("{model_name}: logits vs f64 {logits64:?}");
    assert!(
        logits64.max_abs < LOGITS_ABS_TOL,
        "{model_name}: logits {logits64:?}"
    );

    let loss = model.forward(&tokens, &targets).expect("training forward");
    model.backward().expect("backward");
    let loss64 = outputs64["loss"].floats[0];
    eprintln!(
        "{model_name}: loss {loss:.9} vs f64 {loss64:.9} (abs {:.2e})",
        (f64::from(loss) - loss64).abs()
    );
    assert!((f64::from(loss) - loss64).abs() < LOSS_ABS_TOL);

    let grads64 = read_tensors(&dir.join("grads_f64.safetensors"));
    let layout = model.core().param_layout();
    assert_eq!(
        grads64.len(),
        layout.table().entries().len(),
        "{model_name}: one reference gradient per parameter"
    );
    let mut worst = (0.0f64, String::new());
    for entry in layout.table().entries() {
        let reference = grads64
            .get(&entry.name)
            .unwrap_or_else(|| panic!("{model_name}: no reference gradient for {}", entry.name));
        assert_eq!(reference.shape, entry.shape, "{}", entry.name);
        let d = diff(entry.span.of(model.grads()), &reference.floats);
        if d.max_abs_over_scale > worst.0 {
            worst = (d.max_abs_over_scale, entry.name.clone());
        }
        assert!(
            d.max_abs_over_scale < GRAD_SCALED_TOL,
            "{model_name}: gradient of {} {d:?}",
            entry.name
        );
    }
    eprintln!(
        "{model_name}: worst gradient vs f64, max |diff| / max |g|: {:.3e} ({})",
        worst.0, worst.1
    );
}

#[test]
fn llama_with_gqa_matches_transformers() {
    check("llama");
}

#[test]
fn qwen2_with_biases_and_tied_embeddings_matches_transformers() {
    check("qwen2");
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    check("llama3_rope");
}
