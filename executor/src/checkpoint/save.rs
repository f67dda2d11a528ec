//! Writing a checkpoint so that a crash at any point leaves the previous one usable:
//!
//! 1. [`begin_save`]: a staging directory `DIR/.{tag}.partial-{pid}` is created (a stale one
//!    removed);
//! 2. [`write_rank_files`]: each rank writes its optimizer partition (and under stage 3 its
//!    parameter shard) into it, as DeepSpeed's ranks write their own files;
//! 3. [`finish_save`]: the model states and `engine_state.json` are written, every file is
//!    synced, the staging directory is renamed to `DIR/{tag}` and `latest` is replaced
//!    atomically by a rename ([`crate::io::replace_entry`]: a symlink there is replaced, its
//!    target never written).
//!
//! Until the rename nothing a reader looks at has changed; between the rename and `latest`, the
//! new tag is complete but `latest` still names the previous one. [`SaveFault`] stops a save
//! at those points on purpose, for tests. [`save_checkpoint`] runs the three steps for a
//! checkpoint held in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::layout::{self, CheckpointLocation, ENGINE_STATE, LATEST, MODEL_STATES};
use super::manifest::Manifest;
use super::state::{EngineState, FORMAT, dtype_named};
use super::tensors::{Tensor, write};
use super::{Checkpoint, CheckpointError};
use crate::zero::{Dtype, OwnedState};

/// Where a save stops on purpose (tests of atomicity); [`SaveFault::Never`] in real runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveFault {
    /// Saves complete.
    #[default]
    Never,
    /// After the ranks wrote their files, before the model and engine states.
    AfterRankFiles,
    /// With every file written, before the staging directory is renamed into place.
    BeforeRename,
    /// After the rename, before `latest` is replaced.
    BeforeLatest,
}

impl SaveFault {
    fn check(self, here: SaveFault, at: &'static str) -> Result<(), CheckpointError> {
        if self == here {
            Err(CheckpointError::Injected { at })
        } else {
            Ok(())
        }
    }
}

/// A checkpoint written.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedCheckpoint {
    /// Where.
    pub location: CheckpointLocation,
    /// Bytes of all its files.
    pub bytes: u64,
    /// Seconds the save took (rank 0's view, all steps).
    pub seconds: f64,
}

/// Creates `dir` if needed and a fresh staging directory for `tag` in it; returns it. What
/// killed saves left in `dir` ([`sweep_stale`]) is removed first.
pub fn begin_save(dir: &Path, tag: &str) -> Result<PathBuf, CheckpointError> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::io(dir, &e))?;
    sweep_stale(dir);
    let staging = dir.join(layout::staging_name(tag));
    if staging.exists() {
        std::fs::remove_dir_all(&staging).map_err(|e| CheckpointError::io(&staging, &e))?;
    }
    std::fs::create_dir(&staging).map_err(|e| CheckpointError::io(&staging, &e))?;
    Ok(staging)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<u64, CheckpointError> {
    use std::io::Write;
    // A fresh file in the fresh staging directory: never opened through something already
    // there (a symlink planted in between is an error, not followed).
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| CheckpointError::io(path, &e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| CheckpointError::io(path, &e))?;
    Ok(bytes.len() as u64)
}

fn model_dtype(state: &EngineState) -> Dtype {
    dtype_named(&state.dtypes.model).unwrap_or(Dtype::F32)
}

/// Writes rank `rank`'s files into `staging`: its optimizer partition `owned` (ranks below
/// the layout's partition count) and, under stage 3, its parameter `shard` (model dtype,
/// widened). Returns the bytes written.
pub fn write_rank_files(
    staging: &Path,
    state: &EngineState,
    rank: usize,
    owned: &OwnedState,
    shard: Option<&[f32]>,
) -> Result<u64, CheckpointError> {
    let mut bytes = 0;
    let dtype = model_dtype(state);
    let bf16 = dtype == Dtype::Bf16;
    if rank < state.layout.partition_count() {
        let path = staging.join(layout::optim_states(rank, bf16));
        let len = owned.master.len();
        let tensors = [
            ("fp32_master", &owned.master),
            ("exp_avg", &owned.exp_avg),
            ("exp_avg_sq", &owned.exp_avg_sq),
        ]
        .map(|(name, values)| Tensor {
            name: name.to_string(),
            dtype: Dtype::F32,
            shape: vec![len],
            values,
        });
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("rank".to_string(), rank.to_string()),
            (
                "zero_stage".to_string(),
                state.layout.engine_stage.to_string(),
            ),
            (
                "partition_count".to_string(),
                state.layout.partition_count().to_string(),
            ),
            ("step".to_string(), owned.adam_step.to_string()),
            ("global_step".to_string(), state.global_step.to_string()),
        ]);
        bytes += write(&path, &tensors, metadata)?;
    }
    if let Some(shard) = shard {
        let path = staging.join(layout::zero_model_states(rank));
        let tensors = [Tensor {
            name: "shard".to_string(),
            dtype,
            shape: vec![shard.len()],
            values: shard,
        }];
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("rank".to_string(), rank.to_string()),
            ("global_step".to_string(), state.global_step.to_string()),
        ]);
        bytes += write(&path, &tensors, metadata)?;
    }
    Ok(bytes)
}

/// Completes a save begun by [`begin_save`]: writes the model-dtype parameters `flat_params`
/// (stages 0-2: the flat buffer, widened, under Hugging Face names) and `state`, renames the
/// staging directory to `dir/{state.tag}` and replaces `latest`. Returns the bytes written.
pub fn finish_save(
    dir: &Path,
    staging: &Path,
    state: &EngineState,
    flat_params: Option<&[f32]>,
    fault: SaveFault,
) -> Result<u64, CheckpointError> {
    fault.check(SaveFault::AfterRankFiles, "after the ranks' files")?;
    let mut bytes = 0;
    if let Some(params) = flat_params {
        let path = staging.join(MODEL_STATES);
        let dtype = model_dtype(state);
        let tensors = state
            .layout
            .tensors
            .iter()
            .map(|t| {
                let values = params.get(t.offset..t.offset + t.numel).ok_or_else(|| {
                    CheckpointError::corrupt(&path, &t.name, "outside the parameter buffer")
                })?;
                Ok(Tensor {
                    name: t.name.clone(),
                    dtype,
                    shape: t.shape.clone(),
                    values,
                })
            })
            .collect::<Result<Vec<_>, CheckpointError>>()?;
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT.to_string()),
            ("global_step".to_string(), state.global_step.to_string()),
        ]);
        bytes += write(&path, &tensors, metadata)?;
    }
    let path = staging.join(ENGINE_STATE);
    let json = serde_json::to_vec_pretty(state)
        .map_err(|e| CheckpointError::corrupt(&path, "engine state", e.to_string()))?;
    bytes += write_file(&path, &json)?;
    bytes += Manifest::of_directory(staging, state.global_step)?.write(staging)?;
    sync_dir(staging);
    fault.check(SaveFault::BeforeRename, "before the rename")?;

    let target = dir.join(&state.tag);
    if target.exists() {
        // Overwriting a tag: move the old one aside first (a directory cannot be renamed
        // onto a non-empty one), then drop it once the new one is in place.
        let aside = dir.join(layout::aside_name(&state.tag));
        std::fs::rename(&target, &aside).map_err(|e| CheckpointError::io(&target, &e))?;
        std::fs::rename(staging, &target).map_err(|e| CheckpointError::io(&target, &e))?;
        let _ = std::fs::remove_dir_all(&aside);
    } else {
        std::fs::rename(staging, &target).map_err(|e| CheckpointError::io(&target, &e))?;
    }
    sync_dir(dir);
    fault.check(SaveFault::BeforeLatest, "before `latest` was replaced")?;
    let latest = dir.join(LATEST);
    crate::io::replace_entry(&latest, state.tag.as_bytes())
        .map_err(|e| CheckpointError::io(&latest, &e))?;
    Ok(bytes)
}

/// Removes the staging (`.TAG.partial-PID`) and set-aside (`.TAG.old-PID`) directories in
/// `dir` whose process no longer runs: what a save killed part-way leaves. Those of running
/// processes (another run saving into the same directory) are left alone.
pub fn sweep_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(layout::stale_pid) else {
            continue;
        };
        if !crate::io::process_alive(pid) && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Makes a directory's entries durable (best effort: not every platform syncs directories).
fn sync_dir(dir: &Path) {
    if let Ok(handle) = std::fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// Writes `checkpoint` under `dir` (its tag from `checkpoint.state.tag`), atomically.
pub fn save_checkpoint(
    dir: &Path,
    checkpoint: &Checkpoint,
    fault: SaveFault,
) -> Result<SavedCheckpoint, CheckpointError> {
    let started = Instant::now();
    let state = &checkpoint.state;
    let layout = &state.layout;
    let staging = begin_save(dir, &state.tag)?;
    let result = (|| {
        let shards = if layout.is_sharded() {
            (0..layout.world)
                .map(|r| layout.slice(r, &checkpoint.params))
                .map(Some)
                .collect()
        } else {
            vec![None; layout.world]
        };
        let mut bytes = 0;
        for (rank, shard) in shards.iter().enumerate() {
            let owned = checkpoint
                .ranks
                .get(rank.min(checkpoint.ranks.len().saturating_sub(1)))
                .ok_or(CheckpointError::Missing {
                    path: staging.clone(),
                    what: "rank state to save",
                })?;
            bytes += write_rank_files(&staging, state, rank, owned, shard.as_deref())?;
        }
        let flat = (!layout.is_sharded()).then_some(checkpoint.params.as_slice());
        bytes += finish_save(dir, &staging, state, flat, fault)?;
        Ok(bytes)
    })();
    let bytes = abandon_on_error(&staging, result)?;
    Ok(SavedCheckpoint {
        location: CheckpointLocation {
            dir: dir.to_path_buf(),
            tag: state.tag.clone(),
        },
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Removes the staging directory of a failed save (injected faults leave it, as a crash
/// would).
pub fn abandon_on_error<T>(
    staging: &Path,
    result: Result<T, CheckpointError>,
) -> Result<T, CheckpointError> {
    if let Err(error) = &result
        && !matches!(error, CheckpointError::Injected { .. })
    {
        let _ = std::fs::remove_dir_all(staging);
    }
    result
}
