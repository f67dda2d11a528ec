//! The weights of a Hugging Face directory, by tensor name, for any model family: read from
//! `model.safetensors` or from the shards a `model.safetensors.index.json` lists, written as
//! one file or, above a size limit, as shards with their index (what `save_pretrained` writes).
//!
//! Reading takes f32, f64, f16 and bf16 tensors (all become f32), ignores the rotary
//! `inv_freq` buffers older checkpoints store, and accepts a stored `lm_head.weight` of a tied
//! model only when it equals the embedding. Writing stores every parameter under its name in
//! the run's dtype, the tied `lm_head` omitted, metadata `{"format": "pt"}`.

use dsplan_planner::user_file::{self, FileKind};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use safetensors::tensor::{Dtype as StDtype, SafeTensors, TensorView};
use serde_json::{Value, json};

use super::LoadError;
use super::safetensors::{check_shape, io_error, read_as_f32};
use crate::io::output::write_output;
use crate::tensor::{Span, TensorTable};
use crate::zero::Dtype;

/// The single-file weights.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of sharded weights.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The name of a tied output embedding when a checkpoint stores it anyway.
const LM_HEAD: &str = "lm_head.weight";

/// A tied `lm_head`: stored copies must equal the embedding at `embed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiedHead {
    /// The embedding's span.
    pub embed: Span,
}

/// Reads the weights of `dir` into a buffer laid out as `table`.
pub fn read_weights(
    dir: &Path,
    table: &TensorTable,
    tied: Option<TiedHead>,
) -> Result<Vec<f32>, LoadError> {
    let index_path = dir.join(INDEX_FILE);
    let files: Vec<String> = if user_file::exists(&index_path) {
        let text = user_file::read_text(&index_path, FileKind::WeightIndex)
            .map_err(|e| io_error(&index_path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| LoadError::Json(format!("{}: {e}", index_path.display())))?;
        let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
            return Err(LoadError::Json(format!(
                "{}: no `weight_map` object",
                index_path.display()
            )));
        };
        let mut files: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        files.sort();
        files.dedup();
        files
    } else {
        vec![WEIGHTS_FILE.to_owned()]
    };
    let mut params = vec![0.0f32; table.total_len()];
    let mut filled = vec![false; table.entries().len()];
    let index: HashMap<&str, usize> = table
        .entries()
        .iter()
        .enumerate()
        .map(|(i, entry)| (entry.name.as_str(), i))
        .collect();
    let mut stored_head: Option<Vec<f32>> = None;
    for file in &files {
        let path = dir.join(file);
        let bytes =
            user_file::read(&path, FileKind::Safetensors).map_err(|e| io_error(&path, e))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| LoadError::Safetensors(format!("{}: {e}", path.display())))?;
        for (name, view) in st.iter() {
            if name.ends_with("rotary_emb.inv_freq") {
                continue;
            }
            if let (Some(tied), LM_HEAD) = (tied, name) {
                let mut head = vec![0.0f32; tied.embed.len];
                let shape = view.shape().to_vec();
                if shape.iter().product::<usize>() != head.len() {
                    return Err(LoadError::ShapeMismatch {
                        name: name.to_owned(),
                        expected: vec![tied.embed.len],
                        found: shape,
                    });
                }
                read_as_f32(name, &view, &mut head)?;
                stored_head = Some(head);
                continue;
            }
            let Some(&i) = index.get(name) else {
                return Err(LoadError::UnexpectedTensor {
                    name: format!("{name} (in {})", path.display()),
                });
            };
            if filled[i] {
                return Err(LoadError::DuplicateTensor {
                    name: name.to_owned(),
                });
            }
            let entry = &table.entries()[i];
            check_shape(name, &view, &entry.shape)?;
            read_as_f32(name, &view, entry.span.of_mut(&mut params))?;
            filled[i] = true;
        }
    }
    if let Some((entry, _)) = table
        .entries()
        .iter()
        .zip(&filled)
        .find(|(_, done)| !**done)
    {
        return Err(LoadError::MissingTensor {
            name: entry.name.clone(),
        });
    }
    if let (Some(tied), Some(head)) = (tied, stored_head)
        && head != tied.embed.of(&params)
    {
        return Err(LoadError::UntiedLmHead);
    }
    Ok(params)
}

/// Writes `params` (laid out as `table`) into `dir` in `dtype`: one `model.safetensors` when
/// they fit in `shard_bytes`, otherwise `model-0000i-of-0000n.safetensors` shards (whole
/// tensors, in order) and their index. Each file is written atomically.
pub fn write_weights(
    dir: &Path,
    table: &TensorTable,
    params: &[f32],
    dtype: Dtype,
    shard_bytes: u64,
) -> Result<Vec<String>, LoadError> {
    if params.len() != table.total_len() {
        return Err(LoadError::Safetensors(format!(
            "parameter buffer has {} elements, the layout needs {}",
            params.len(),
            table.total_len()
        )));
    }
    let (st_dtype, encoded) = encode(params, dtype);
    let width = dtype.bytes();
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut current = 0u64;
    for (i, entry) in table.entries().iter().enumerate() {
        let size = (entry.span.len * width) as u64;
        if current > 0 && current + size > shard_bytes {
            shards.push(Vec::new());
            current = 0;
        }
        if let Some(last) = shards.last_mut() {
            last.push(i);
        }
        current += size;
    }
    let count = shards.len();
    let names: Vec<String> = if count == 1 {
        vec![WEIGHTS_FILE.to_owned()]
    } else {
        (1..=count)
            .map(|k| format!("model-{k:05}-of-{count:05}.safetensors"))
            .collect()
    };
    let mut weight_map = BTreeMap::new();
    for (shard, file) in shards.iter().zip(&names) {
        let views = shard
            .iter()
            .map(|&i| {
                let entry = &table.entries()[i];
                weight_map.insert(entry.name.clone(), file.clone());
                let data = &encoded[entry.span.offset * width..entry.span.end() * width];
                TensorView::new(st_dtype, entry.shape.clone(), data)
                    .map(|view| (entry.name.clone(), view))
                    .map_err(|e| LoadError::Safetensors(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = safetensors::serialize(views, Some(metadata))
            .map_err(|e| LoadError::Safetensors(e.to_string()))?;
        let path = dir.join(file);
        write_output(&path, &bytes).map_err(|e| io_error(&path, e))?;
    }
    if count > 1 {
        let index = json!({
            "metadata": {"total_size": encoded.len()},
            "weight_map": weight_map,
        });
        let path = dir.join(INDEX_FILE);
        let text =
            serde_json::to_string_pretty(&index).map_err(|e| LoadError::Json(e.to_string()))?;
        write_output(&path, text.as_bytes()).map_err(|e| io_error(&path, e))?;
    }
    remove_earlier_weights(dir, &names, count > 1)?;
    Ok(names)
}

/// Removes the weight files an earlier save left in `dir` that this one did not write (it
/// wrote `written`, and an index when `indexed`): `model.safetensors`, `model-K-of-N` shards
/// and their index. A single file left beside a new index, or an index beside a new single
/// file, would be read in place of the new weights (`save_pretrained` removes them too).
fn remove_earlier_weights(dir: &Path, written: &[String], indexed: bool) -> Result<(), LoadError> {
    let entries = std::fs::read_dir(dir).map_err(|e| io_error(dir, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let earlier = (name == INDEX_FILE && !indexed)
            || ((name == WEIGHTS_FILE || is_shard_name(name))
                && !written.iter().any(|w| w == name));
        if earlier {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
        }
    }
    Ok(())
}

/// Whether `name` is a shard `save_pretrained` writes: `model-00001-of-00003.safetensors`.
fn is_shard_name(name: &str) -> bool {
    let Some(rest) = name
        .strip_prefix("model-")
        .and_then(|r| r.strip_suffix(".safetensors"))
    else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    matches!(rest.split_once("-of-"), Some((k, n)) if digits(k) && digits(n))
}

/// The little-endian bytes of `params` in `dtype`.
fn encode(params: &[f32], dtype: Dtype) -> (StDtype, Vec<u8>) {
    match dtype {
        Dtype::F32 => (
            StDtype::F32,
            params.iter().flat_map(|x| x.to_le_bytes()).collect(),
        ),
        Dtype::Bf16 => (
            StDtype::BF16,
            params
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
        ),
        Dtype::F16 => (
            StDtype::F16,
            params
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
        ),
    }
}
