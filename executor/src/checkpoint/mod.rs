//! Getting a trained model out and training on from where a run stopped.
//!
//! * [`consolidate`]: the full fp32 parameters from every rank's master shard, as DeepSpeed's
//!   `zero_to_fp32` does; [`save_model`] writes them as a Hugging Face safetensors file,
//!   through [`write_atomically`], so no half-written file is ever left behind;
//! * checkpoints in DeepSpeed's layout ([`layout`]: `DIR/latest`, `DIR/global_step{N}/`,
//!   `zero_pp_rank_{R}_mp_rank_00_optim_states`), in our own format: safetensors for tensors
//!   ([`tensors`](self)), JSON for the run state ([`EngineState`]), no pickles;
//! * [`save`](save_checkpoint): a staging directory renamed into place, then `latest`
//!   replaced atomically: a crash at any point leaves the previous checkpoint usable;
//! * [`load_checkpoint`] reads and checks one; [`prepare_resume`] checks it against the run
//!   resuming and cuts every rank's partition for that run's plan, resharding through
//!   [`SavedLayout`] when the world size or stage changed (DeepSpeed's universal checkpoint,
//!   done directly).
//!
//! Engine-level hooks (when to save, how ranks write their parts) are in
//! [`crate::train`]; a rank's state goes out and back through [`crate::zero::OwnedState`].

mod consolidate;
mod error;
pub mod layout;
mod load;
mod reshard;
mod resume;
mod save;
mod state;
mod tensors;

use std::io::Write;
use std::path::Path;

pub use consolidate::consolidate;
pub use error::CheckpointError;
pub use layout::CheckpointLocation;
pub use load::{LoadedCheckpoint, load_checkpoint, read_engine_state};
pub use reshard::{SavedLayout, SavedTensor};
pub use resume::{ResumePoint, prepare_resume};
pub use save::{
    SaveFault, SavedCheckpoint, abandon_on_error, begin_save, finish_save, save_checkpoint,
    write_rank_files,
};
pub use state::{DataDescription, EngineState, SavedDtypes, SavedModel, ScalerState, digest};

use crate::io::LoadError;
use crate::io::safetensors::params_to_safetensors;
use crate::model::ParamLayout;

/// A checkpoint in memory: the run state, the full model-dtype parameters and each rank's
/// optimizer partition.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Steps, scaler, layout, model, data.
    pub state: EngineState,
    /// The model-dtype parameters (widened to `f32`), flat, `state.layout.numel` elements.
    pub params: Vec<f32>,
    /// The optimizer partition of ranks `0..state.layout.partition_count()`.
    pub ranks: Vec<crate::zero::OwnedState>,
}

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
