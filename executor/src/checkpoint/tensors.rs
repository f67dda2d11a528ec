//! Checkpoint tensors in safetensors files: `f32` values written in their dtype (exact, as
//! they hold values of it) and read back widened, with string metadata for the scalars.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::SafeTensors;
use safetensors::tensor::{Dtype as StDtype, TensorView};

use super::CheckpointError;
use crate::zero::Dtype;

/// One tensor to write.
pub(super) struct Tensor<'a> {
    /// Its name.
    pub name: String,
    /// The dtype it is stored in.
    pub dtype: Dtype,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values (of `dtype`, widened).
    pub values: &'a [f32],
}

fn encode_values(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.bytes());
    match dtype {
        Dtype::F32 => values
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        Dtype::Bf16 => values
            .iter()
            .for_each(|&x| out.extend_from_slice(&bf16::from_f32(x).to_le_bytes())),
        Dtype::F16 => values
            .iter()
            .for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
    }
    out
}

fn st_dtype(dtype: Dtype) -> StDtype {
    match dtype {
        Dtype::F32 => StDtype::F32,
        Dtype::Bf16 => StDtype::BF16,
        Dtype::F16 => StDtype::F16,
    }
}

/// Writes a safetensors file holding `tensors` and `metadata` to `path` (straight to the
/// file, then synced); returns its size.
pub(super) fn write(
    path: &Path,
    tensors: &[Tensor<'_>],
    metadata: HashMap<String, String>,
) -> Result<u64, CheckpointError> {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| encode_values(t.dtype, t.values))
        .collect();
    let views = tensors
        .iter()
        .zip(&data)
        .map(|(t, bytes)| {
            TensorView::new(st_dtype(t.dtype), t.shape.clone(), bytes)
                .map(|view| (t.name.clone(), view))
                .map_err(|e| CheckpointError::corrupt(path, &t.name, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| CheckpointError::corrupt(path, "tensors", e.to_string()))?;
    let file = std::fs::File::open(path).map_err(|e| CheckpointError::io(path, &e))?;
    file.sync_all().map_err(|e| CheckpointError::io(path, &e))?;
    file.metadata()
        .map(|m| m.len())
        .map_err(|e| CheckpointError::io(path, &e))
}

/// A safetensors file read whole.
pub(super) struct StoredFile {
    path: PathBuf,
    bytes: Vec<u8>,
    metadata: HashMap<String, String>,
}

impl StoredFile {
    /// Checks the safetensors file `bytes` (read from `path`, already verified against the
    /// tag's manifest).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Self, CheckpointError> {
        let (_, header) = SafeTensors::read_metadata(&bytes)
            .map_err(|e| CheckpointError::corrupt(path, "header", e.to_string()))?;
        let metadata = header.metadata().clone().unwrap_or_default();
        SafeTensors::deserialize(&bytes)
            .map_err(|e| CheckpointError::corrupt(path, "header", e.to_string()))?;
        Ok(Self {
            path: path.to_path_buf(),
            bytes,
            metadata,
        })
    }

    /// The metadata entry `key`, parsed.
    pub fn meta<T: std::str::FromStr>(&self, key: &str) -> Result<T, CheckpointError> {
        let text = self.metadata.get(key).ok_or_else(|| {
            CheckpointError::corrupt(&self.path, key, "missing from the metadata")
        })?;
        text.parse().map_err(|_| {
            CheckpointError::corrupt(&self.path, key, format!("`{text}` cannot be read"))
        })
    }

    /// Tensor `name` widened to `f32`, and its dtype and shape.
    pub fn tensor(&self, name: &str) -> Result<(Dtype, Vec<usize>, Vec<f32>), CheckpointError> {
        let file = SafeTensors::deserialize(&self.bytes)
            .map_err(|e| CheckpointError::corrupt(&self.path, "header", e.to_string()))?;
        let view = file
            .tensor(name)
            .map_err(|_| CheckpointError::corrupt(&self.path, name, "the tensor is missing"))?;
        let data = view.data();
        let (dtype, values) = match view.dtype() {
            StDtype::F32 => (
                Dtype::F32,
                data.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            StDtype::BF16 => (
                Dtype::Bf16,
                data.chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            StDtype::F16 => (
                Dtype::F16,
                data.chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            ),
            other => {
                return Err(CheckpointError::corrupt(
                    &self.path,
                    name,
                    format!("dtype {other:?} is not a floating dtype dsplan writes"),
                ));
            }
        };
        Ok((dtype, view.shape().to_vec(), values))
    }

    /// Tensor `name`, which must be stored in `dtype` with `len` elements.
    pub fn vector(
        &self,
        name: &str,
        dtype: Dtype,
        len: usize,
    ) -> Result<Vec<f32>, CheckpointError> {
        let (found, _, values) = self.tensor(name)?;
        if found != dtype {
            return Err(CheckpointError::corrupt(
                &self.path,
                name,
                format!("stored as {}, expected {}", found.name(), dtype.name()),
            ));
        }
        if values.len() != len {
            return Err(CheckpointError::corrupt(
                &self.path,
                name,
                format!("{} elements, the layout needs {len}", values.len()),
            ));
        }
        Ok(values)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
