//! Getting a trained model out and training on from where a run stopped.
//!
//! * [`consolidate`]: the full fp32 parameters from every rank's master shard, as DeepSpeed's
//!   `zero_to_fp32` does; [`save_model`] writes them as a Hugging Face safetensors file,
//!   through [`crate::io::write_output`], so no half-written file is ever left behind (and no
//!   FIFO or device replaced);
//! * checkpoints in DeepSpeed's layout ([`layout`]: `DIR/latest`, `DIR/global_step{N}/`,
//!   `zero_pp_rank_{R}_mp_rank_00_optim_states`), in our own format: safetensors for tensors
//!   ([`tensors`](self)), JSON for the run state ([`EngineState`]), no pickles;
//! * [`save`](save_checkpoint): a staging directory renamed into place, then `latest`
//!   replaced atomically by a rename (a `latest` that is a symlink is replaced, never written
//!   through): a crash at any point leaves the previous checkpoint usable;
//! * [`DirLock`]: one writer per checkpoint directory, its pid and host in `DIR/.dsplan.lock`;
//! * every tag carries a [`Manifest`] (each file's CRC-32, the step), verified as the files
//!   are read back; every file records its step; [`load_checkpoint`] reads and checks one
//!   (range checks on every field, non-finite tensors refused unless [`NonFinite::Allow`]); [`prepare_resume`] checks it against the run
//!   resuming and cuts every rank's partition for that run's plan, resharding through
//!   [`SavedLayout`] when the world size or stage changed (DeepSpeed's universal checkpoint,
//!   done directly).
//!
//! Engine-level hooks (when to save, how ranks write their parts) are in
//! [`crate::train`]; a rank's state goes out and back through [`crate::zero::OwnedState`].

mod checks;
mod consolidate;
mod error;
pub mod layout;
mod load;
mod lock;
mod manifest;
mod reshard;
mod resume;
mod save;
mod state;
mod tensors;

use std::path::Path;

pub use checks::NonFinite;
pub use consolidate::consolidate;
pub use error::CheckpointError;
pub use layout::CheckpointLocation;
pub use load::{LoadedCheckpoint, load_checkpoint, load_checkpoint_with, read_engine_state};
pub use lock::{DirLock, LOCK_FILE, LockError, Owner, host_name};
pub use manifest::{FileDigest, MANIFEST, Manifest, file_digest};
pub use reshard::{SavedLayout, SavedTensor};
pub use resume::{ResumePoint, prepare_resume};
pub use save::{
    SaveFault, SavedCheckpoint, abandon_on_error, begin_save, finish_save, save_checkpoint,
    sweep_stale, write_rank_files,
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

/// Saves full fp32 parameters under Hugging Face names (the tied `lm_head` omitted, as
/// `save_pretrained` does), atomically.
pub fn save_model(path: &Path, params: &[f32], layout: &ParamLayout) -> Result<(), LoadError> {
    let bytes = params_to_safetensors(params, layout)?;
    crate::io::write_output(path, &bytes).map_err(|error| LoadError::Io {
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}
