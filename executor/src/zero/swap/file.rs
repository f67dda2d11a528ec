//! [`SwapFile`]: one swap file of little-endian elements, read and written at element offsets.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use half::{bf16, f16};

use super::{SwapError, SwapTraffic};
use crate::zero::precision::Dtype;

/// Bytes per I/O request: elements are converted through a buffer of this size on the stack.
const REQUEST_BYTES: usize = 64 * 1024;

/// A file of `dtype` elements (little-endian), created empty, counting the bytes it moves.
#[derive(Debug)]
pub struct SwapFile {
    file: File,
    path: PathBuf,
    dtype: Dtype,
    pointer: &'static str,
    traffic: Cell<SwapTraffic>,
}

impl SwapFile {
    /// Creates (or truncates) the file at `path`; `pointer` names the config value in errors.
    pub fn create(path: &Path, dtype: Dtype, pointer: &'static str) -> Result<Self, SwapError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| SwapError::io(pointer, path, "create the swap file", &e))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            dtype,
            pointer,
            traffic: Cell::new(SwapTraffic::default()),
        })
    }

    /// The element type stored.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Bytes moved so far.
    pub fn traffic(&self) -> SwapTraffic {
        self.traffic.get()
    }

    fn count(&self, read: usize, written: usize) {
        let mut traffic = self.traffic.get();
        traffic.read_bytes += read as u64;
        traffic.written_bytes += written as u64;
        self.traffic.set(traffic);
    }

    /// The file's size on disk now (its metadata).
    pub fn size(&self) -> Result<u64, SwapError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| SwapError::io(self.pointer, &self.path, "inspect", &e))
    }

    /// Stores `values` (rounded to the file's dtype) at elements `at..at + values.len()`.
    pub fn write(&self, at: usize, values: &[f32]) -> Result<(), SwapError> {
        let width = self.dtype.bytes();
        let mut request = [0u8; REQUEST_BYTES];
        let per_request = REQUEST_BYTES / width;
        for (i, chunk) in values.chunks(per_request).enumerate() {
            let bytes = &mut request[..chunk.len() * width];
            encode(self.dtype, chunk, bytes);
            let offset = ((at + i * per_request) * width) as u64;
            self.file
                .write_all_at(bytes, offset)
                .map_err(|e| SwapError::io(self.pointer, &self.path, "write", &e))?;
            self.count(0, bytes.len());
        }
        Ok(())
    }

    /// Writes `bytes` (already in the file's encoding) at element `at`.
    pub fn write_raw(&self, at: usize, bytes: &[u8]) -> Result<(), SwapError> {
        let offset = (at * self.dtype.bytes()) as u64;
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| SwapError::io(self.pointer, &self.path, "write", &e))?;
        self.count(0, bytes.len());
        Ok(())
    }

    /// Reads elements `at..at + out.len()`, widened to `f32`.
    pub fn read(&self, at: usize, out: &mut [f32]) -> Result<(), SwapError> {
        let width = self.dtype.bytes();
        let mut request = [0u8; REQUEST_BYTES];
        let per_request = REQUEST_BYTES / width;
        for (i, chunk) in out.chunks_mut(per_request).enumerate() {
            let bytes = &mut request[..chunk.len() * width];
            let offset = ((at + i * per_request) * width) as u64;
            self.file
                .read_exact_at(bytes, offset)
                .map_err(|e| SwapError::io(self.pointer, &self.path, "read", &e))?;
            self.count(bytes.len(), 0);
            decode(self.dtype, bytes, chunk);
        }
        Ok(())
    }

    /// Reads `bytes.len()` bytes (the file's encoding) from element `at`.
    pub fn read_raw(&self, at: usize, bytes: &mut [u8]) -> Result<(), SwapError> {
        let offset = (at * self.dtype.bytes()) as u64;
        self.file
            .read_exact_at(bytes, offset)
            .map_err(|e| SwapError::io(self.pointer, &self.path, "read", &e))?;
        self.count(bytes.len(), 0);
        Ok(())
    }
}

/// `values` in `dtype`'s little-endian encoding (`bytes.len() == values.len() × width`).
pub fn encode(dtype: Dtype, values: &[f32], bytes: &mut [u8]) {
    match dtype {
        Dtype::F32 => {
            for (out, v) in bytes.chunks_exact_mut(4).zip(values) {
                out.copy_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::Bf16 => {
            for (out, v) in bytes.chunks_exact_mut(2).zip(values) {
                out.copy_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        Dtype::F16 => {
            for (out, v) in bytes.chunks_exact_mut(2).zip(values) {
                out.copy_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
    }
}

/// The inverse of [`encode`], widened to `f32`.
pub fn decode(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        Dtype::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Dtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        Dtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_as_written_and_bytes_are_counted() {
        let dir = tempfile::tempdir().expect("temp dir");
        for dtype in [Dtype::F32, Dtype::Bf16, Dtype::F16] {
            let file =
                SwapFile::create(&dir.path().join(dtype.name()), dtype, "/p").expect("created");
            let values: Vec<f32> = (0..40_000).map(|i| (i as f32 * 0.37).sin()).collect();
            file.write(10, &values).expect("written");
            let mut back = vec![0.0f32; values.len()];
            file.read(10, &mut back).expect("read");
            let expected: Vec<f32> = values.iter().map(|&v| dtype.round(v)).collect();
            assert_eq!(back, expected);
            let bytes = (values.len() * dtype.bytes()) as u64;
            assert_eq!(file.traffic().written_bytes, bytes);
            assert_eq!(file.traffic().read_bytes, bytes);
            assert_eq!(
                file.size().expect("size"),
                bytes + 10 * dtype.bytes() as u64
            );
        }
    }
}
