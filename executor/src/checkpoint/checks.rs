//! Range checks on what a checkpoint holds, run on load after the digests
//! ([`super::manifest`]) matched: every field of `engine_state.json` within the values a save
//! can write ([`check_engine_state`]), and optimizer state finite ([`check_finite`], unless
//! the run asks for [`NonFinite::Allow`]). A digest proves a file is the one saved; these
//! prove what was saved can be trained on.

use std::path::Path;

use super::CheckpointError;
use super::layout::tag_of_step;
use super::reshard::SavedLayout;
use super::state::{EngineState, ScalerState, dtype_named};

/// What to do with non-finite values (NaN, ±Inf) in a checkpoint's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonFinite {
    /// Refuse the checkpoint, naming the file, tensor and first element.
    #[default]
    Refuse,
    /// Load it anyway (`--allow-non-finite-checkpoint`).
    Allow,
}

/// Checks that the tensor `name` of `path` holds only finite values (and, for Adam's second
/// moment, no negative ones) unless `policy` allows them.
pub fn check_finite(
    path: &Path,
    name: &str,
    values: &[f32],
    policy: NonFinite,
) -> Result<(), CheckpointError> {
    if policy == NonFinite::Allow {
        return Ok(());
    }
    let must_be_positive = name == "exp_avg_sq";
    let bad = values
        .iter()
        .position(|v| !v.is_finite() || (must_be_positive && *v < 0.0));
    match bad {
        None => Ok(()),
        Some(index) => Err(CheckpointError::corrupt(
            path,
            name,
            format!(
                "element {index} is {}; a run cannot continue from it (pass \
                 --allow-non-finite-checkpoint to load it anyway)",
                values[index]
            ),
        )),
    }
}

/// Checks every field of `state` (read from `path`) against what a save writes.
pub fn check_engine_state(path: &Path, state: &EngineState) -> Result<(), CheckpointError> {
    let bad = |field: &str, message: String| Err(CheckpointError::corrupt(path, field, message));
    if state.tag != tag_of_step(state.global_step) {
        return bad(
            "tag",
            format!(
                "`{}` is not the tag of global_step {}",
                state.tag, state.global_step
            ),
        );
    }
    if state.skipped_steps.checked_add(state.lr_scheduler_step) != Some(state.global_step) {
        return bad(
            "lr_scheduler_step",
            format!(
                "{} applied and {} skipped steps do not add up to global_step {}",
                state.lr_scheduler_step, state.skipped_steps, state.global_step
            ),
        );
    }
    if state.world_size == 0 || state.train_batch == 0 || state.seq_len == 0 {
        return bad(
            "world_size",
            format!(
                "world_size {}, train_batch {} and seq_len {} must all be at least 1",
                state.world_size, state.train_batch, state.seq_len
            ),
        );
    }
    if state.stage > 3 {
        return bad(
            "stage",
            format!("{} is not a ZeRO stage (0-3)", state.stage),
        );
    }
    for (field, name) in [
        ("dtypes.model", &state.dtypes.model),
        ("dtypes.accum", &state.dtypes.accum),
        ("dtypes.comm", &state.dtypes.comm),
    ] {
        if dtype_named(name).is_none() {
            return bad(field, format!("`{name}` is not fp32, bf16 or fp16"));
        }
    }
    check_scaler(path, &state.loss_scaler)?;
    let m = &state.model;
    if m.vocab_size == 0
        || m.n_positions == 0
        || m.n_embd == 0
        || m.n_layer == 0
        || m.n_head == 0
        || !m.n_embd.is_multiple_of(m.n_head)
    {
        return bad(
            "model",
            format!(
                "vocab_size {}, n_positions {}, n_embd {}, n_layer {}, n_head {}: every size \
                 must be positive and n_embd a multiple of n_head",
                m.vocab_size, m.n_positions, m.n_embd, m.n_layer, m.n_head
            ),
        );
    }
    if !(m.layer_norm_epsilon.is_finite() && m.layer_norm_epsilon > 0.0) {
        return bad(
            "model.layer_norm_epsilon",
            format!("{} must be positive and finite", m.layer_norm_epsilon),
        );
    }
    // Packed rows may be longer than the positions: their position ids restart.
    if state.seq_len > m.n_positions && !state.data.kind.packs_rows() {
        return bad(
            "seq_len",
            format!("{} exceeds n_positions {}", state.seq_len, m.n_positions),
        );
    }
    let order = &state.data.order;
    let known_order = order == "sequential"
        || order
            .strip_prefix("shuffled:")
            .is_some_and(|seed| seed.parse::<u64>().is_ok());
    if !known_order {
        return bad(
            "data.order",
            format!("`{order}` is neither `sequential` nor `shuffled:SEED`"),
        );
    }
    check_layout(path, &state.layout, state.world_size)
}

fn check_scaler(path: &Path, scaler: &ScalerState) -> Result<(), CheckpointError> {
    let bad = |field: &str, message: String| Err(CheckpointError::corrupt(path, field, message));
    let scale = match *scaler {
        ScalerState::Dynamic {
            scale,
            cur_hysteresis,
            cur_iter,
            last_overflow_iter,
        } => {
            if cur_hysteresis < 0 {
                return bad(
                    "loss_scaler.cur_hysteresis",
                    format!("{cur_hysteresis} is negative"),
                );
            }
            if cur_iter < 0 || !(-1..cur_iter).contains(&last_overflow_iter) {
                return bad(
                    "loss_scaler.last_overflow_iter",
                    format!(
                        "{last_overflow_iter} with cur_iter {cur_iter}: the last overflow \
                         must be -1 (none) or an earlier iteration"
                    ),
                );
            }
            scale
        }
        ScalerState::Fixed { scale } => scale,
    };
    if !(scale.is_finite() && scale > 0.0) {
        return bad(
            "loss_scaler.scale",
            format!("{scale}: a loss scale must be positive and finite"),
        );
    }
    Ok(())
}

/// The layout must describe the buffers the saved files hold: ordered, non-overlapping ranges
/// inside the padded buffer, tensors inside `numel`, shards inside `owned_len`.
fn check_layout(
    path: &Path,
    layout: &SavedLayout,
    world_size: usize,
) -> Result<(), CheckpointError> {
    let bad = |field: &str, message: String| Err(CheckpointError::corrupt(path, field, message));
    if layout.engine_stage > 3 {
        return bad(
            "layout.engine_stage",
            format!("{} is not a ZeRO stage (0-3)", layout.engine_stage),
        );
    }
    if layout.world != world_size || layout.owned.len() != layout.world {
        return bad(
            "layout.world",
            format!(
                "{} rank(s) with {} owned range(s), world_size is {world_size}",
                layout.world,
                layout.owned.len()
            ),
        );
    }
    if layout.numel == 0 || layout.numel > layout.padded {
        return bad(
            "layout.numel",
            format!(
                "{} must be positive and at most padded ({})",
                layout.numel, layout.padded
            ),
        );
    }
    let mut previous_end = 0;
    for (rank, &[start, end]) in layout.owned.iter().enumerate() {
        // Stage 3's ranges are the shard's own `[0, owned_len)`, not the flat buffer's.
        let inside = layout.is_sharded() || end <= layout.padded;
        let ordered = start <= end && inside && end - start == layout.owned_len;
        let follows = !matches!(layout.engine_stage, 1 | 2) || rank == 0 || start == previous_end;
        if !ordered || !follows {
            return bad(
                &format!("layout.owned[{rank}]"),
                format!(
                    "[{start}, {end}) is not rank {rank}'s range: ranges must be ordered, each \
                     owned_len ({}) long, consecutive and inside padded ({})",
                    layout.owned_len, layout.padded
                ),
            );
        }
        previous_end = end;
    }
    let mut next_offset = 0usize;
    for tensor in &layout.tensors {
        let field = format!("layout.tensors[{}]", tensor.name);
        let elements = tensor
            .shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d));
        let end = tensor.offset.checked_add(tensor.numel);
        if elements != Some(tensor.numel)
            || tensor.offset < next_offset
            || end.is_none_or(|end| end > layout.numel)
        {
            return bad(
                &field,
                format!(
                    "offset {} and {} elements (shape {:?}) must follow the previous tensor \
                     and lie inside numel {}",
                    tensor.offset, tensor.numel, tensor.shape, layout.numel
                ),
            );
        }
        next_offset = tensor.offset + tensor.numel;
        if layout.is_sharded() {
            let base = tensor.shard_offset.unwrap_or(0);
            if tensor.pieces.len() != layout.world {
                return bad(
                    &field,
                    format!("{} pieces for {} ranks", tensor.pieces.len(), layout.world),
                );
            }
            for &[start, end] in &tensor.pieces {
                if start > end
                    || end > tensor.numel
                    || base
                        .checked_add(end - start)
                        .is_none_or(|e| e > layout.owned_len)
                {
                    return bad(
                        &field,
                        format!(
                            "piece [{start}, {end}) at shard offset {base} lies outside the \
                             tensor ({} elements) or the shard ({} elements)",
                            tensor.numel, layout.owned_len
                        ),
                    );
                }
            }
        }
    }
    if layout.tensors.iter().map(|t| t.numel).sum::<usize>() != layout.numel {
        return bad(
            "layout.tensors",
            format!("their sizes do not add up to numel {}", layout.numel),
        );
    }
    Ok(())
}
