//! Reading a checkpoint back ([`load_checkpoint`]): `latest` (or the tag given), the run state,
//! the model-dtype parameters (consolidated from the stage 3 shards when sharded) and every
//! rank's optimizer partition, each file and field checked, every problem an error naming the
//! file and the field.

use std::path::Path;

use super::layout::{self, CheckpointLocation, ENGINE_STATE, MODEL_STATES};
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
/// directory.
pub fn load_checkpoint(path: &Path) -> Result<LoadedCheckpoint, CheckpointError> {
    let location = CheckpointLocation::resolve(path)?;
    let tag_dir = location.path();
    let state = read_engine_state(&tag_dir.join(ENGINE_STATE))?;
    let state_path = tag_dir.join(ENGINE_STATE);
    let model_dtype = dtype_named(&state.dtypes.model).ok_or_else(|| {
        CheckpointError::corrupt(
            &state_path,
            "dtypes.model",
            format!("`{}` is not fp32, bf16 or fp16", state.dtypes.model),
        )
    })?;
    let layout = &state.layout;
    let params = if layout.is_sharded() {
        let shards = (0..layout.world)
            .map(|rank| {
                let file = StoredFile::read(&tag_dir.join(layout::zero_model_states(rank)))?;
                file.vector("shard", model_dtype, layout.owned_len)
            })
            .collect::<Result<Vec<_>, _>>()?;
        layout
            .consolidate(&shards)
            .map_err(|message| CheckpointError::corrupt(&state_path, "layout", message))?
    } else {
        read_flat_params(&tag_dir.join(MODEL_STATES), &state, model_dtype)?
    };
    let bf16 = model_dtype == Dtype::Bf16;
    let ranks = (0..layout.partition_count())
        .map(|rank| {
            let file = StoredFile::read(&tag_dir.join(layout::optim_states(rank, bf16)))?;
            let stored_rank: usize = file.meta("rank")?;
            if stored_rank != rank {
                return Err(CheckpointError::corrupt(
                    file.path(),
                    "rank",
                    format!("{stored_rank}, the file name says {rank}"),
                ));
            }
            let len = layout.owned_len;
            Ok(OwnedState {
                master: file.vector("fp32_master", Dtype::F32, len)?,
                exp_avg: file.vector("exp_avg", Dtype::F32, len)?,
                exp_avg_sq: file.vector("exp_avg_sq", Dtype::F32, len)?,
                adam_step: file.meta("step")?,
            })
        })
        .collect::<Result<Vec<_>, CheckpointError>>()?;
    if let Some(rank) = ranks
        .iter()
        .position(|r| r.adam_step != state.lr_scheduler_step)
    {
        return Err(CheckpointError::corrupt(
            tag_dir.join(layout::optim_states(rank, bf16)),
            "step",
            format!(
                "{}, but engine_state.json's lr_scheduler_step is {}",
                ranks[rank].adam_step, state.lr_scheduler_step
            ),
        ));
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

/// Reads and checks `engine_state.json`.
pub fn read_engine_state(path: &Path) -> Result<EngineState, CheckpointError> {
    if !path.is_file() {
        return Err(CheckpointError::Missing {
            path: path.to_path_buf(),
            what: "engine_state.json",
        });
    }
    let bytes = std::fs::read(path).map_err(|e| CheckpointError::io(path, &e))?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
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
    let layout = &state.layout;
    if layout.world != state.world_size || layout.owned.len() != layout.world {
        return Err(CheckpointError::corrupt(
            path,
            "layout.world",
            format!(
                "{} rank(s) with {} owned range(s), world_size is {}",
                layout.world,
                layout.owned.len(),
                state.world_size
            ),
        ));
    }
    if layout.tensors.iter().map(|t| t.numel).sum::<usize>() != layout.numel {
        return Err(CheckpointError::corrupt(
            path,
            "layout.tensors",
            format!("their sizes do not add up to numel {}", layout.numel),
        ));
    }
    Ok(state)
}

fn read_flat_params(
    path: &Path,
    state: &EngineState,
    dtype: Dtype,
) -> Result<Vec<f32>, CheckpointError> {
    let file = StoredFile::read(path)?;
    let mut params = vec![0.0f32; state.layout.numel];
    for tensor in &state.layout.tensors {
        let values = file.vector(&tensor.name, dtype, tensor.numel)?;
        let Some(to) = params.get_mut(tensor.offset..tensor.offset + tensor.numel) else {
            return Err(CheckpointError::corrupt(
                path,
                &tensor.name,
                "lies outside the layout's numel",
            ));
        };
        to.copy_from_slice(&values);
    }
    Ok(params)
}
