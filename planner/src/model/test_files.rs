//! Test helpers: throw-away directories and hand-written safetensors files.

use std::path::{Path, PathBuf};

/// A fresh directory under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `dsplan-<test name>-<pid>`, emptying any leftover of an earlier run.
    pub fn new(name: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("dsplan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temp dir can be created");
        TempDir(path)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a valid F32 safetensors file holding zero-filled tensors of the given shapes.
pub fn write_safetensors(path: &Path, tensors: &[(&str, Vec<u64>)]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut offset = 0u64;
    for (name, shape) in tensors {
        let bytes = 4 * shape.iter().product::<u64>();
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + bytes]}),
        );
        offset += bytes;
    }
    let header = serde_json::Value::Object(header).to_string().into_bytes();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&header);
    file.resize(file.len() + offset as usize, 0);
    std::fs::write(path, file).expect("test file can be written");
}
