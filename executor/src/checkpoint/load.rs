//! Reading a checkpoint back ([`load_checkpoint`]): `latest` (or the tag given), its
//! `manifest.json`, the run state, the model-dtype parameters (consolidated from the stage 3
//! shards when sharded) and every rank's optimizer partition. Every file is checked against the
//! manifest's digest as it is read ([`super::manifest`]), every file's recorded step against the
//! tag's, every field against the values a save writes ([`super::checks`]) and every tensor
//! for non-finite values; every problem is an error naming the file and the field.

use dsplan_planner::user_file::{self, FileKind};
use std::path::Path;

use super::checks::{NonFinite, check_engine_state, check_finite};
use super::layout::{self, CheckpointLocation, ENGINE_STATE, MODEL_STATES};
use super::manifest::Manifest;
use super::state::{EngineState, FORMAT, dtype_named};
use super::tensors::StoredFile;
use super::{Checkpoint, CheckpointError};
use crate::zero::{Dtype, OwnedState};

/// A checkpoint read from disk, and where it was.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedCheckpoint {
    /// Its directory and tag.
    pub location: CheckpointLocation,
    /// Its contents.
    pub checkpoint: Checkpoint,
}

/// Reads the checkpoint `path` names: a checkpoint directory (its `latest` tag) or a tag
/// directory; non-finite tensors are refused.
pub fn load_checkpoint(path: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    load_checkpoint_with(path, NonFinite::Refuse)
}

/// [`load_checkpoint`], with non-finite tensors refused or allowed as `non_finite` says.
pub fn load_checkpoint_with(
    path: &Path,
    non_finite: NonFinite,
) -> Result<LoadedCheckpoint, CheckpointError> {
    let location = CheckpointLocation::resolve(path)?;
    let tag_dir = location.path();
    let manifest = Manifest::read(&tag_dir, &location.tag)?;
    let step = manifest.global_step;
    let read = |name: &str| -> Result<StoredFile, CheckpointError> {
        let bytes = manifest.verified_bytes(&tag_dir, name)?;
        let file = StoredFile::from_bytes(&tag_dir.join(name), bytes)?;
        let recorded: u64 = file.meta("global_step")?;
        if recorded != step {
            return Err(CheckpointError::corrupt(
                file.path(),
                "global_step",
                format!("{recorded}, but the tag is {}", manifest.tag),
            ));
        }
        Ok(file)
    };
    let state_path = tag_dir.join(ENGINE_STATE);
    let state = engine_state_from_bytes(
        &state_path,
        &manifest.verified_bytes(&tag_dir, ENGINE_STATE)?,
    )?;
    if state.global_step != step {
        return Err(CheckpointError::corrupt(
            &state_path,
            "global_step",
            format!("{}, but the tag is {}", state.global_step, manifest.tag),
        ));
    }
    let model_dtype = dtype_named(&state.dtypes.model).unwrap_or(Dtype::F32);
    let layout = &state.layout;
    let params = if layout.is_sharded() {
        let mut shards = Vec::with_capacity(layout.world);
        for rank in 0..layout.world {
            let file = read(&layout::zero_model_states(rank))?;
            let shard = file.vector("shard", model_dtype, layout.owned_len)?;
            check_finite(file.path(), "shard", &shard, non_finite)?;
            shards.push(shard);
        }
        layout
            .consolidate(&shards)
            .map_err(|message| CheckpointError::corrupt(&state_path, "layout", message))?
    } else {
        let file = read(MODEL_STATES)?;
        let params = read_flat_params(&file, &state, model_dtype)?;
        check_finite(file.path(), "parameters", &params, non_finite)?;
        params
    };
    let bf16 = model_dtype == Dtype::Bf16;
    let mut ranks = Vec::with_capacity(layout.partition_count());
    for rank in 0..layout.partition_count() {
        let file = read(&layout::optim_states(rank, bf16))?;
        let stored_rank: usize = file.meta("rank")?;
        if stored_rank != rank {
            return Err(CheckpointError::corrupt(
                file.path(),
                "rank",
                format!("{stored_rank}, the file name says {rank}"),
            ));
        }
        let len = layout.owned_len;
        let owned = OwnedState {
            master: file.vector("fp32_master", Dtype::F32, len)?,
            exp_avg: file.vector("exp_avg", Dtype::F32, len)?,
            exp_avg_sq: file.vector("exp_avg_sq", Dtype::F32, len)?,
            adam_step: file.meta("step")?,
        };
        check_finite(file.path(), "fp32_master", &owned.master, non_finite)?;
        check_finite(file.path(), "exp_avg", &owned.exp_avg, non_finite)?;
        check_finite(file.path(), "exp_avg_sq", &owned.exp_avg_sq, non_finite)?;
        if owned.adam_step != state.lr_scheduler_step {
            return Err(CheckpointError::corrupt(
                file.path(),
                "step",
                format!(
                    "{}, but engine_state.json's lr_scheduler_step is {}",
                    owned.adam_step, state.lr_scheduler_step
                ),
            ));
        }
        ranks.push(owned);
    }
    Ok(LoadedCheckpoint {
        location,
        checkpoint: Checkpoint {
            state,
            params,
            ranks,
        },
    })
}

/// Reads and checks `engine_state.json` (without the manifest: to look at a tag, not to resume
/// from it).
pub fn read_engine_state(path: &Path) -> Result<EngineState, CheckpointError> {
    if !user_file::exists(path) {
        return Err(CheckpointError::Missing {
            path: path.to_path_buf(),
            what: "engine_state.json",
        });
    }
    let bytes = user_file::read(path, FileKind::CheckpointJson)
        .map_err(|e| CheckpointError::io(path, &e))?;
    engine_state_from_bytes(path, &bytes)
}

/// Parses and checks the bytes of `engine_state.json` (at `path`).
fn engine_state_from_bytes(path: &Path, bytes: &[u8]) -> Result<EngineState, CheckpointError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| CheckpointError::corrupt(path, "(document)", e.to_string()))?;
    let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
    if format != FORMAT {
        return Err(CheckpointError::corrupt(
            path,
            "format",
            format!("`{format}`, this dsplan reads `{FORMAT}`"),
        ));
    }
    let state: EngineState = serde_json::from_value(value)
        .map_err(|e| CheckpointError::corrupt(path, "(document)", e.to_string()))?;
    check_engine_state(path, &state)?;
    Ok(state)
}

fn read_flat_params(
    file: &StoredFile,
    state: &EngineState,
    dtype: Dtype,
) -> Result<Vec<f32>, CheckpointError> {
    let mut params = vec![0.0f32; state.layout.numel];
    for tensor in &state.layout.tensors {
        let values = file.vector(&tensor.name, dtype, tensor.numel)?;
        let Some(to) = params.get_mut(tensor.offset..tensor.offset + tensor.numel) else {
            return Err(CheckpointError::corrupt(
                file.path(),
                &tensor.name,
                "lies outside the layout's numel",
            ));
        };
        to.copy_from_slice(&values);
    }
    Ok(params)
}
