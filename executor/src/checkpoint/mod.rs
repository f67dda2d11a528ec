//! Getting a trained model out: the fp32 master weights, consolidated from every rank's
//! shard as DeepSpeed's `zero_to_fp32` does ([`consolidate`]), and written as a Hugging Face
//! safetensors file without ever leaving a half-written file behind ([`write_atomically`]).
//!
//! DeepSpeed's own checkpoint layout (`global_stepN/*_optim_states.pt`, `latest`,
//! resumption) is not implemented yet.

mod consolidate;

use std::io::Write;
use std::path::Path;

pub use consolidate::consolidate;

use crate::io::LoadError;
use crate::io::safetensors::params_to_safetensors;
use crate::model::ParamLayout;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename, so
/// `path` holds either its old content or all of the new.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Saves full fp32 parameters under Hugging Face names (the tied `lm_head` omitted, as
/// `save_pretrained` does), atomically.
pub fn save_model(path: &Path, params: &[f32], layout: &ParamLayout) -> Result<(), LoadError> {
    let bytes = params_to_safetensors(params, layout)?;
    write_atomically(path, &bytes).map_err(|error| LoadError::Io {
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_replace_the_whole_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("out.txt");
        write_atomically(&path, b"first").expect("write");
        write_atomically(&path, b"second").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        let leftovers = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(leftovers, 1);
    }
}
