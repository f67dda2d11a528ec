//! The CPU GPT-2 against Hugging Face `transformers` (fixture `reference/gpt2/forward_backward`):
//! logits, loss and every parameter gradient of one forward/backward on the tiny model, against
//! both the f32 and the f64 reference. Prints the measured errors. Skips without `../shared`.

mod support;

use dsplan_executor::io::safetensors::load_pretrained;
use dsplan_executor::model::{BatchShape, Gpt2, next_token_targets};
use dsplan_executor::optim::global_norm;
use support::{Diff, diff, diff_where, gpt2_reference, is_key_bias, read_tensors, worst};

/// Per-tensor `||ours - ref|| / ||ref||` allowed for gradients and logits.
const NORM_REL_TOL: f64 = 1e-5;
/// Absolute tolerance for the key-bias gradient entries (exactly 0 in exact arithmetic).
const KEY_BIAS_ABS_TOL: f64 = 1e-9;

#[test]
fn forward_backward_matches_transformers() {
    let Some(reference) = gpt2_reference() else {
        return;
    };
    let dir = reference.join("forward_backward");
    let (config, params) = load_pretrained(&dir).expect("fixture model loads");
    let inputs = read_tensors(&dir.join("inputs.safetensors"));
    let input_ids = &inputs["input_ids"];
    let (batch, seq_len) = (input_ids.shape[0], input_ids.shape[1]);
    let tokens: Vec<u32> = input_ids
        .ints
        .iter()
        .map(|&t| u32::try_from(t).expect("token id"))
        .collect();
    let targets = next_token_targets(&tokens, seq_len);
    let hf_targets: Vec<Option<u32>> = inputs["shift_labels"]
        .ints
        .iter()
        .map(|&t| u32::try_from(t).ok())
        .collect();
    assert_eq!(
        targets, hf_targets,
        "next_token_targets must equal HF's shift_labels"
    );

    let mut model = Gpt2::new(config, params, BatchShape { batch, seq_len }).expect("model builds");
    let outputs = read_tensors(&dir.join("outputs.safetensors"));
    let outputs64 = read_tensors(&dir.join("outputs_f64.safetensors"));

    let logits = model.forward_logits(&tokens).expect("forward").to_vec();
    let logits32 = diff(&logits, &outputs["logits"].floats);
    let logits64 = diff(&logits, &outputs64["logits"].floats);
    eprintln!("logits vs f32: {logits32:?}");
    eprintln!("logits vs f64: {logits64:?}");

    let loss = model.forward(&tokens, &targets).expect("training forward");
    model.backward().expect("backward");
    let (loss32, loss64) = (outputs["loss"].floats[0], outputs64["loss"].floats[0]);
    eprintln!(
        "loss {loss:.9} | f32 ref {loss32:.9} (rel {:.2e}) | f64 ref {loss64:.9} (rel {:.2e})",
        (f64::from(loss) - loss32).abs() / loss32,
        (f64::from(loss) - loss64).abs() / loss64
    );

    let grads32 = read_tensors(&dir.join("grads.safetensors"));
    let grads64 = read_tensors(&dir.join("grads_f64.safetensors"));
    let layout = model.param_layout().clone();
    assert_eq!(
        grads32.len(),
        layout.table().entries().len(),
        "one gradient per parameter"
    );
    let (mut all32, mut all64, mut key_bias_max) = (Diff::default(), Diff::default(), 0.0f64);
    for entry in layout.table().entries() {
        let ours = entry.span.of(model.grads());
        let name = entry.name.as_str();
        let keep = |i: usize| !is_key_bias(name, i, config.n_embd);
        let d32 = diff_where(ours, &grads32[name].floats, keep);
        let d64 = diff_where(ours, &grads64[name].floats, keep);
        eprintln!(
            "grad {name:42} vs f32: norm_rel {:.2e} max_abs {:.2e} | vs f64: norm_rel {:.2e} max_abs {:.2e} max_rel {:.2e}",
            d32.norm_rel, d32.max_abs, d64.norm_rel, d64.max_abs, d64.max_rel
        );
        assert!(d32.norm_rel < NORM_REL_TOL, "{name} vs f32: {d32:?}");
        assert!(d64.norm_rel < NORM_REL_TOL, "{name} vs f64: {d64:?}");
        for (i, &g) in ours.iter().enumerate() {
            if !keep(i) {
                key_bias_max = key_bias_max.max(f64::from(g).abs());
            }
        }
        all32 = worst(all32, d32);
        all64 = worst(all64, d64);
    }
    eprintln!("all grads (excl. key bias) worst vs f32: {all32:?}");
    eprintln!("all grads (excl. key bias) worst vs f64: {all64:?}");
    eprintln!("max |key-bias grad| = {key_bias_max:.3e} (true value 0)");
    let norm = global_norm(model.grads());
    eprintln!("global grad norm {norm:.9} (f32 ref 1.810935616493225, f64 ref 1.81093575429565)");

    assert!(logits32.norm_rel < NORM_REL_TOL && logits64.norm_rel < NORM_REL_TOL);
    assert!(logits64.max_abs < 2e-6, "logits vs f64: {logits64:?}");
    assert!((f64::from(loss) - loss64).abs() / loss64 < 1e-6);
    assert!((f64::from(loss) - loss32).abs() / loss32 < 1e-6);
    assert!(key_bias_max < KEY_BIAS_ABS_TOL);
    assert!((f64::from(norm) - 1.81093575429565).abs() < 1e-5);
}

#[test]
fn saving_the_loaded_fixture_reproduces_save_pretrained_bytes() {
    let Some(reference) = gpt2_reference() else {
        return;
    };
    let path = reference.join("forward_backward/model.safetensors");
    let (config, params) =
        load_pretrained(path.parent().expect("dir")).expect("fixture model loads");
    let layout = dsplan_executor::model::ParamLayout::new(&config);
    let ours = dsplan_executor::io::safetensors::params_to_safetensors(&params, &layout)
        .expect("serialise");
    let theirs = std::fs::read(&path).expect("fixture bytes");
    eprintln!(
        "our file {} bytes, save_pretrained's {} bytes, identical: {}",
        ours.len(),
        theirs.len(),
        ours == theirs
    );
    assert!(
        ours == theirs,
        "saved file differs from transformers' save_pretrained output"
    );
}
