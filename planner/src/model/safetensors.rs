//! Exact parameter counts from safetensors checkpoints, reading only their headers.
//!
//! A safetensors file starts with an 8-byte little-endian header length, then that many bytes
//! of JSON mapping each tensor name to `{dtype, shape, data_offsets}` (plus an optional
//! `__metadata__`). The tensor data is never read. A sharded checkpoint names its files in
//! `model.safetensors.index.json` (`weight_map`: tensor name -> file).

use super::error::ModelError;
use super::tensors::TensorEntry;
use crate::user_file::{self, FileKind};
use serde_json::Value;
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Largest header dsplan reads (the safetensors format itself caps it at 100 MB).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The tensors of a checkpoint and the files they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The safetensors files read, in order.
    pub files: Vec<PathBuf>,
    /// Every tensor, in file order then header order.
    pub tensors: Vec<TensorEntry>,
}

/// The safetensors files that make up the checkpoint in `dir`: those the index names, else
/// `model.safetensors`, else every `*.safetensors` file (sorted). Empty when there are none.
pub fn checkpoint_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let index = dir.join(INDEX_FILE);
    // `exists`, not `is_file`: a FIFO or a directory named like the file is refused by what
    // it is when it is read, not skipped as if it were missing.
    if user_file::exists(&index) {
        return index_files(&index, dir);
    }
    let single = dir.join("model.safetensors");
    if user_file::exists(&single) {
        return Ok(vec![single]);
    }
    let entries = std::fs::read_dir(dir).map_err(|error| ModelError::Unreadable {
        path: dir.to_owned(),
        reason: error.to_string(),
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| ModelError::Unreadable {
            path: dir.to_owned(),
            reason: error.to_string(),
        })?;
        let path = entry.path();
        if path.is_file()
            && path
                .extension()
                .is_some_and(|extension| extension == "safetensors")
        {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The distinct files named in an index's `weight_map`, sorted.
fn index_files(index: &Path, dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let text = user_file::read_text(index, FileKind::WeightIndex).map_err(|error| {
        ModelError::Unreadable {
            path: index.to_owned(),
            reason: error.to_string(),
        }
    })?;
    let value: Value = serde_json::from_str(&text).map_err(|error| ModelError::NotJson {
        path: index.to_owned(),
        reason: error.to_string(),
    })?;
    let Some(map) = value.get("weight_map").and_then(Value::as_object) else {
        return Err(ModelError::NotJson {
            path: index.to_owned(),
            reason: "no `weight_map` object".into(),
        });
    };
    let mut files: Vec<PathBuf> = Vec::new();
    for file in map.values() {
        let Some(name) = file.as_str() else {
            return Err(ModelError::NotJson {
                path: index.to_owned(),
                reason: format!("`weight_map` value {file} is not a file name"),
            });
        };
        let path = dir.join(name);
        if !files.contains(&path) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads the headers of `files` as one checkpoint.
pub fn read_checkpoint(files: Vec<PathBuf>) -> Result<Checkpoint, ModelError> {
    let mut tensors = Vec::new();
    let mut seen = HashSet::new();
    for file in &files {
        for tensor in read_header(file)? {
            if !seen.insert(tensor.name.clone()) {
                return Err(ModelError::DuplicateTensor {
                    name: tensor.name,
                    path: file.clone(),
                });
            }
            tensors.push(tensor);
        }
    }
    Ok(Checkpoint { files, tensors })
}

/// The tensors listed in one file's header.
pub fn read_header(path: &Path) -> Result<Vec<TensorEntry>, ModelError> {
    let unreadable = |error: std::io::Error| ModelError::Unreadable {
        path: path.to_owned(),
        reason: error.to_string(),
    };
    let bad = |reason: String| ModelError::BadSafetensors {
        path: path.to_owned(),
        reason,
    };
    let opened = user_file::open(path, FileKind::Safetensors).map_err(unreadable)?;
    let (mut file, file_len) = (opened.file, opened.len);
    let mut length_bytes = [0u8; 8];
    file.read_exact(&mut length_bytes).map_err(|_| {
        bad(format!(
            "only {file_len} bytes, shorter than the 8-byte header length"
        ))
    })?;
    let header_len = u64::from_le_bytes(length_bytes);
    if header_len > MAX_HEADER_BYTES || header_len > file_len.saturating_sub(8) {
        return Err(bad(format!(
            "header length {header_len} does not fit in a {file_len}-byte file"
        )));
    }
    let mut header = Vec::new();
    file.take(header_len)
        .read_to_end(&mut header)
        .map_err(unreadable)?;
    parse_header(&header).map_err(bad)
}

/// Parses a header's JSON into tensors (the error is a reason, without the path).
pub fn parse_header(header: &[u8]) -> Result<Vec<TensorEntry>, String> {
    let value: Value =
        serde_json::from_slice(header).map_err(|error| format!("header is not JSON: {error}"))?;
    let Value::Object(entries) = value else {
        return Err("header is not a JSON object".into());
    };
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, info) in entries {
        if name == "__metadata__" {
            continue;
        }
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("tensor `{name}` has no `shape` list"))?;
        let mut numel: u64 = 1;
        for dim in shape {
            let dim = dim
                .as_u64()
                .ok_or_else(|| format!("tensor `{name}` has a non-integer dimension {dim}"))?;
            numel = numel
                .checked_mul(dim)
                .ok_or_else(|| format!("tensor `{name}` has more than 2^64 elements"))?;
        }
        tensors.push(TensorEntry::owned(name, numel));
    }
    Ok(tensors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_shapes_become_element_counts() {
        let header = br#"{"__metadata__": {"format": "pt"},
            "wte.weight": {"dtype": "F32", "shape": [256, 64], "data_offsets": [0, 65536]},
            "scale": {"dtype": "F32", "shape": [], "data_offsets": [65536, 65540]}}"#;
        let tensors = parse_header(header).expect("valid");
        assert_eq!(
            tensors,
            [
                TensorEntry::owned("wte.weight", 16_384),
                TensorEntry::owned("scale", 1)
            ]
        );
    }

    #[test]
    fn malformed_headers_are_explained() {
        assert!(parse_header(b"[1, 2]").is_err());
        let error =
            parse_header(br#"{"w": {"dtype": "F32", "shape": [2, -1]}}"#).expect_err("negative");
        assert!(error.contains("`w`"), "{error}");
    }
}
