//! Saving and loading the flat parameter buffer as Hugging Face safetensors: a round trip,
//! the names and layout `save_pretrained` uses, the name variants of other checkpoints, and
//! errors that name the offending tensor.

use std::collections::HashMap;

use dsplan_executor::io::LoadError;
use dsplan_executor::io::safetensors::{
    load_params, params_from_safetensors, params_to_safetensors, save_params,
};
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype, TensorView};

const CONFIG: Gpt2Config = Gpt2Config {
    vocab_size: 50,
    n_positions: 16,
    n_embd: 12,
    n_layer: 2,
    n_head: 3,
    layer_norm_epsilon: 1e-5,
};

fn model() -> (ParamLayout, Vec<f32>) {
    let layout = ParamLayout::new(&CONFIG);
    let params = init_params(&CONFIG, &layout, 42);
    (layout, params)
}

/// Serialises `(name, dtype, shape, bytes)` tensors.
fn file_of(tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).expect("view"),
            )
        })
        .collect();
    safetensors::serialize(views, None).expect("serialize")
}

/// The model's tensors as `(name, F32, shape, bytes)`, renamed by `rename`.
fn tensors_of(
    layout: &ParamLayout,
    params: &[f32],
    rename: impl Fn(&str) -> String,
) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    layout
        .table()
        .entries()
        .iter()
        .map(|e| {
            let bytes = e
                .span
                .of(params)
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            (rename(&e.name), Dtype::F32, e.shape.clone(), bytes)
        })
        .collect()
}

#[test]
fn save_then_load_round_trips_exactly_with_hf_names() {
    let (layout, params) = model();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.safetensors");
    save_params(&path, &params, &layout).expect("save");
    assert_eq!(load_params(&path, &layout).expect("load"), params);

    let bytes = std::fs::read(&path).expect("read back");
    let file = SafeTensors::deserialize(&bytes).expect("valid file");
    assert_eq!(
        file.len(),
        2 + 12 * CONFIG.n_layer + 2,
        "no lm_head.weight: it is tied"
    );
    let c_attn = file
        .tensor("transformer.h.1.attn.c_attn.weight")
        .expect("HF name");
    assert_eq!(c_attn.shape(), &[12, 36], "Conv1D weights are [in, out]");
    assert_eq!(c_attn.dtype(), Dtype::F32);
    let (_, metadata) = SafeTensors::read_metadata(&bytes).expect("header");
    let expected: HashMap<String, String> = HashMap::from([("format".into(), "pt".into())]);
    assert_eq!(metadata.metadata(), &Some(expected));
}

#[test]
fn loads_unprefixed_names_mask_buffers_tied_head_and_f64() {
    let (layout, params) = model();
    // openai-community/gpt2 style: no `transformer.` prefix, causal-mask buffers, f64 values.
    let mut tensors: Vec<_> = tensors_of(&layout, &params, |n| {
        n.trim_start_matches("transformer.").to_string()
    })
    .into_iter()
    .map(|(name, _, shape, bytes)| {
        let wide: Vec<u8> = bytes
            .chunks_exact(4)
            .flat_map(|b| {
                f64::from(f32::from_le_bytes(b.try_into().expect("4 bytes"))).to_le_bytes()
            })
            .collect();
        (name, Dtype::F64, shape, wide)
    })
    .collect();
    tensors.push((
        "h.0.attn.bias".into(),
        Dtype::F32,
        vec![1, 1, 2, 2],
        vec![0; 16],
    ));
    let wte = layout
        .wte
        .of(&params)
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    tensors.push(("lm_head.weight".into(), Dtype::F32, vec![50, 12], wte));
    let loaded = params_from_safetensors(&file_of(tensors), &layout).expect("loads");
    assert_eq!(loaded, params);
}

#[test]
fn errors_name_the_tensor() {
    let (layout, params) = model();
    let full = tensors_of(&layout, &params, str::to_string);

    let missing: Vec<_> = full
        .iter()
        .filter(|t| t.0 != "transformer.h.1.ln_2.bias")
        .cloned()
        .collect();
    assert_eq!(
        params_from_safetensors(&file_of(missing), &layout),
        Err(LoadError::MissingTensor {
            name: "transformer.h.1.ln_2.bias".into()
        })
    );

    let mut reshaped = full.clone();
    let wpe = reshaped
        .iter_mut()
        .find(|t| t.0 == "transformer.wpe.weight")
        .expect("wpe");
    wpe.2 = vec![12, 16];
    assert_eq!(
        params_from_safetensors(&file_of(reshaped), &layout),
        Err(LoadError::ShapeMismatch {
            name: "transformer.wpe.weight".into(),
            expected: vec![16, 12],
            found: vec![12, 16],
        })
    );

    let mut extra = full.clone();
    extra.push((
        "transformer.h.2.ln_1.weight".into(),
        Dtype::F32,
        vec![12],
        vec![0; 48],
    ));
    assert_eq!(
        params_from_safetensors(&file_of(extra), &layout),
        Err(LoadError::UnexpectedTensor {
            name: "transformer.h.2.ln_1.weight".into()
        })
    );

    let mut untied = full.clone();
    untied.push((
        "lm_head.weight".into(),
        Dtype::F32,
        vec![50, 12],
        vec![0; 50 * 12 * 4],
    ));
    assert_eq!(
        params_from_safetensors(&file_of(untied), &layout),
        Err(LoadError::UntiedLmHead)
    );

    let mut ints = full;
    let ln = ints
        .iter_mut()
        .find(|t| t.0 == "transformer.ln_f.bias")
        .expect("ln_f");
    ln.1 = Dtype::I32;
    assert!(matches!(
        params_from_safetensors(&file_of(ints), &layout),
        Err(LoadError::UnsupportedDtype { name, .. }) if name == "transformer.ln_f.bias"
    ));

    assert!(matches!(
        params_from_safetensors(b"not a safetensors file", &layout),
        Err(LoadError::Safetensors(_))
    ));
    assert!(matches!(
        params_to_safetensors(&params[1..], &layout),
        Err(LoadError::Safetensors(_))
    ));
}
