//! `model.safetensors` to and from the flat parameter buffer, by Hugging Face tensor name.
//!
//! Loading accepts what Hugging Face checkpoints contain: names with the `transformer.` prefix
//! (`save_pretrained` of a `GPT2LMHeadModel`) or without it (`openai-community/gpt2`), the old
//! causal-mask buffers `h.{l}.attn.bias` / `attn.masked_bias` (ignored), and an `lm_head.weight`
//! equal to `wte` (checked, then ignored). Tensors may be f32, f64, f16 or bf16; all become f32.
//! Saving writes what `save_pretrained` writes for a tied GPT-2: every parameter under its
//! `transformer.` name, no `lm_head.weight`, metadata `{"format": "pt"}`, f32.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use super::LoadError;
use super::hf_config::read_gpt2_config;
use crate::model::{Gpt2Config, ParamLayout};

/// The name under which `save_pretrained` stores the tied output embedding (when it does).
const LM_HEAD: &str = "lm_head.weight";

/// Fills a parameter buffer for `layout` from the bytes of a safetensors file.
pub fn params_from_safetensors(bytes: &[u8], layout: &ParamLayout) -> Result<Vec<f32>, LoadError> {
    let file =
        SafeTensors::deserialize(bytes).map_err(|e| LoadError::Safetensors(e.to_string()))?;
    let mut params = vec![0.0f32; layout.num_params()];
    let mut filled = vec![false; layout.table().entries().len()];
    let index: HashMap<&str, usize> = layout
        .table()
        .entries()
        .iter()
        .enumerate()
        .map(|(i, entry)| (entry.name.as_str(), i))
        .collect();
    let mut lm_head = None;

    for (stored_name, view) in file.iter() {
        if stored_name == LM_HEAD {
            lm_head = Some(view);
            continue;
        }
        if is_attention_mask_buffer(stored_name) {
            continue;
        }
        let canonical = canonical_name(stored_name);
        let Some(&i) = index.get(canonical.as_str()) else {
            return Err(LoadError::UnexpectedTensor {
                name: stored_name.to_string(),
            });
        };
        if filled[i] {
            return Err(LoadError::DuplicateTensor { name: canonical });
        }
        let entry = &layout.table().entries()[i];
        check_shape(stored_name, &view, &entry.shape)?;
        read_as_f32(stored_name, &view, entry.span.of_mut(&mut params))?;
        filled[i] = true;
    }
    if let Some((entry, _)) = layout
        .table()
        .entries()
        .iter()
        .zip(&filled)
        .find(|(_, done)| !**done)
    {
        return Err(LoadError::MissingTensor {
            name: entry.name.clone(),
        });
    }
    if let Some(view) = lm_head {
        let wte = layout.wte.of(&params);
        let wte_shape = [wte.len() / layout.ln_f_weight.len, layout.ln_f_weight.len];
        check_shape(LM_HEAD, &view, &wte_shape)?;
        let mut head = vec![0.0f32; wte.len()];
        read_as_f32(LM_HEAD, &view, &mut head)?;
        if head != wte {
            return Err(LoadError::UntiedLmHead);
        }
    }
    Ok(params)
}

/// The bytes of a safetensors file holding `params` under Hugging Face names.
pub fn params_to_safetensors(params: &[f32], layout: &ParamLayout) -> Result<Vec<u8>, LoadError> {
    if params.len() != layout.num_params() {
        return Err(LoadError::Safetensors(format!(
            "parameter buffer has {} elements, the layout needs {}",
            params.len(),
            layout.num_params()
        )));
    }
    let bytes: Vec<u8> = params.iter().flat_map(|x| x.to_le_bytes()).collect();
    let views = layout
        .table()
        .entries()
        .iter()
        .map(|entry| {
            let data = &bytes[entry.span.offset * 4..entry.span.end() * 4];
            TensorView::new(Dtype::F32, entry.shape.clone(), data)
                .map(|view| (entry.name.clone(), view))
                .map_err(|e| LoadError::Safetensors(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(metadata)).map_err(|e| LoadError::Safetensors(e.to_string()))
}

/// Reads a safetensors file into a parameter buffer for `layout`.
pub fn load_params(path: &Path, layout: &ParamLayout) -> Result<Vec<f32>, LoadError> {
    use dsplan_planner::user_file::{FileKind, read};
    let bytes = read(path, FileKind::Safetensors).map_err(|e| io_error(path, e))?;
    params_from_safetensors(&bytes, layout)
}

/// Writes `params` to a safetensors file under Hugging Face names.
pub fn save_params(path: &Path, params: &[f32], layout: &ParamLayout) -> Result<(), LoadError> {
    let bytes = params_to_safetensors(params, layout)?;
    std::fs::write(path, bytes).map_err(|e| io_error(path, e))
}

/// Loads a `save_pretrained` directory: `config.json` and `model.safetensors`.
pub fn load_pretrained(dir: &Path) -> Result<(Gpt2Config, Vec<f32>), LoadError> {
    let config = read_gpt2_config(&dir.join("config.json"))?;
    let layout = ParamLayout::new(&config);
    let params = load_params(&dir.join("model.safetensors"), &layout)?;
    Ok((config, params))
}

pub(super) fn io_error(path: &Path, error: std::io::Error) -> LoadError {
    LoadError::Io {
        path: path.to_path_buf(),
        message: error.to_string(),
    }
}

/// `h.0.attn.bias` and `h.0.attn.masked_bias`: constant causal masks older checkpoints store.
fn is_attention_mask_buffer(name: &str) -> bool {
    name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

/// The `transformer.`-prefixed name of a stored tensor.
fn canonical_name(stored: &str) -> String {
    if stored.starts_with("transformer.") {
        stored.to_string()
    } else {
        format!("transformer.{stored}")
    }
}

pub(super) fn check_shape(
    name: &str,
    view: &TensorView<'_>,
    expected: &[usize],
) -> Result<(), LoadError> {
    if view.shape() == expected {
        Ok(())
    } else {
        Err(LoadError::ShapeMismatch {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: view.shape().to_vec(),
        })
    }
}

/// Converts a little-endian tensor to f32 into `out` (whose length the shape check fixed).
pub(super) fn read_as_f32(
    name: &str,
    view: &TensorView<'_>,
    out: &mut [f32],
) -> Result<(), LoadError> {
    let data = view.data();
    match view.dtype() {
        Dtype::F32 => convert::<4>(data, out, f32::from_le_bytes),
        Dtype::F64 => convert::<8>(data, out, |b| f64::from_le_bytes(b) as f32),
        Dtype::F16 => convert::<2>(data, out, |b| half::f16::from_le_bytes(b).to_f32()),
        Dtype::BF16 => convert::<2>(data, out, |b| half::bf16::from_le_bytes(b).to_f32()),
        other => {
            return Err(LoadError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    }
    Ok(())
}

fn convert<const N: usize>(data: &[u8], out: &mut [f32], decode: impl Fn([u8; N]) -> f32) {
    for (o, chunk) in out.iter_mut().zip(data.chunks_exact(N)) {
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(chunk);
        *o = decode(bytes);
    }
}
