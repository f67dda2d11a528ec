//! [`prepare_resume`]: what a run needs to continue from a checkpoint, after checking that the
//! checkpoint fits it. The same world size, stage and layout continue bit for bit (each rank
//! takes its saved partition back); another world size or stage gets every rank's master
//! weights and Adam moments consolidated into full vectors and cut again for the new plan
//! ([`super::SavedLayout`]).
//!
//! Refused (a [`CheckpointError::Mismatch`] saying what differs and how to fix it): another
//! model, another parameter dtype or loss scaler, another sequence length, other data (kind,
//! size or order), a checkpoint already at or past the steps asked for. Noted only: a changed
//! config (digest), another global batch, another data path with the same size, other accumulation or
//! communication dtypes, a resharded layout.

use std::path::PathBuf;

use dsplan_planner::schedule::loss_scale::LossScaler;

use super::layout::{CheckpointLocation, ENGINE_STATE};
use super::state::{DataDescription, DataKind, EngineState, SavedModel};
use super::{CheckpointError, LoadedCheckpoint};
use crate::zero::OwnedState;

/// Where a resumed run starts and with what.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePoint {
    /// The checkpoint.
    pub location: CheckpointLocation,
    /// Steps already run (the first step of the resumed run has this index).
    pub global_step: u64,
    /// Steps already applied (the scheduler's position).
    pub applied_steps: u64,
    /// The full model-dtype parameters (widened), every rank's starting point.
    pub params: Vec<f32>,
    /// Each rank's optimizer partition in the run's layout.
    pub ranks: Vec<OwnedState>,
    /// The loss scaler, continued.
    pub scaler: LossScaler,
    /// When the layout changed: the checkpoint's world size and stage.
    pub resharded_from: Option<(usize, u8)>,
    /// What differs without preventing the resume.
    pub notes: Vec<String>,
}

/// Checks `loaded` against the run about to start (`run`: its state before step 0, with the
/// config's loss scaler `fresh_scaler`) that asks for `steps` steps in all, and prepares its
/// starting point.
pub fn prepare_resume(
    loaded: &LoadedCheckpoint,
    run: &EngineState,
    fresh_scaler: LossScaler,
    steps: u64,
) -> Result<ResumePoint, CheckpointError> {
    let saved = &loaded.checkpoint.state;
    let path = loaded.location.path().join(ENGINE_STATE);
    let mismatch =
        |field: &str, saved: String, run: String, help: &str| CheckpointError::Mismatch {
            path: path.clone(),
            field: field.to_string(),
            saved,
            run,
            help: help.to_string(),
        };
    if saved.model != run.model {
        return Err(mismatch(
            "model",
            model_fields(&saved.model, &run.model, Side::Saved),
            model_fields(&saved.model, &run.model, Side::Run),
            "resume with the model the checkpoint was trained on (--model)",
        ));
    }
    if saved.dtypes.model != run.dtypes.model {
        return Err(mismatch(
            "dtypes.model",
            saved.dtypes.model.clone(),
            run.dtypes.model.clone(),
            "enable the same fp16/bf16 section in the config as when it was saved",
        ));
    }
    let scaler = saved.loss_scaler.restore(fresh_scaler).map_err(|message| {
        mismatch(
            "loss_scaler",
            saved.loss_scaler.describe(),
            message,
            "use the fp16 section the checkpoint was trained with",
        )
    })?;
    if saved.seq_len != run.seq_len {
        // A fine-tuning run's length is its longest micro-batch, not a flag.
        let fix = match run.data.kind {
            DataKind::Labelled => {
                "resume with the data and max_length the checkpoint was trained with".to_string()
            }
            _ => format!("pass --seq-len {}", saved.seq_len),
        };
        return Err(mismatch(
            "seq_len",
            saved.seq_len.to_string(),
            run.seq_len.to_string(),
            &fix,
        ));
    }
    let (a, b) = (&saved.data, &run.data);
    if a.kind != b.kind || a.bytes != b.bytes || a.order != b.order {
        return Err(mismatch(
            "data",
            describe_data(a),
            describe_data(b),
            "batches are a function of the step, so a resumed run must read the same data in \
             the same order (--data, --seed); start a fresh run to train on other data",
        ));
    }
    if saved.layout.numel != run.layout.numel {
        return Err(mismatch(
            "layout.numel",
            saved.layout.numel.to_string(),
            run.layout.numel.to_string(),
            "resume with the model the checkpoint was trained on",
        ));
    }
    if saved.global_step >= steps {
        return Err(mismatch(
            "global_step",
            saved.global_step.to_string(),
            format!("--steps {steps}"),
            &format!(
                "--steps counts all steps, resumed or not: ask for more than {}",
                saved.global_step
            ),
        ));
    }
    let mut notes = Vec::new();
    if a.name != b.name {
        notes.push(format!(
            "the checkpoint was trained on `{}`, this run reads `{}` (same size and order)",
            a.name, b.name
        ));
    }
    if saved.train_batch != run.train_batch {
        notes.push(format!(
            "the global batch was {} rows, now {}: from here on the steps read other rows than \
             the uninterrupted run would",
            saved.train_batch, run.train_batch
        ));
    }
    if saved.config_digest != run.config_digest {
        notes.push(format!(
            "the resolved config differs from the checkpoint's (digest {} vs {})",
            saved.config_digest, run.config_digest
        ));
    }
    if saved.dtypes != run.dtypes {
        notes.push(format!(
            "accumulation/communication dtypes {}/{} were {}/{}",
            run.dtypes.accum, run.dtypes.comm, saved.dtypes.accum, saved.dtypes.comm
        ));
    }

    let checkpoint = &loaded.checkpoint;
    let same_layout = saved.layout == run.layout;
    let ranks = if same_layout {
        // Stage 0 saves one partition, which every rank holds.
        (0..run.layout.world)
            .map(|r| {
                let last = checkpoint.ranks.len().saturating_sub(1);
                checkpoint.ranks.get(r.min(last)).cloned().ok_or_else(|| {
                    CheckpointError::corrupt(&path, "ranks", "no optimizer partition")
                })
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        reshard(loaded, run, &path)?
    };
    if !same_layout {
        notes.push(format!(
            "resharded from {} rank(s), stage {} to {} rank(s), stage {}",
            saved.world_size, saved.stage, run.world_size, run.stage
        ));
    }
    Ok(ResumePoint {
        location: loaded.location.clone(),
        global_step: saved.global_step,
        applied_steps: saved.lr_scheduler_step,
        params: checkpoint.params.clone(),
        ranks,
        scaler,
        resharded_from: (!same_layout).then_some((saved.world_size, saved.stage)),
        notes,
    })
}

/// Which model a field list describes.
#[derive(Clone, Copy)]
enum Side {
    Saved,
    Run,
}

/// The fields in which two models differ, `name value` each, from `side`'s model (all of
/// them when none differs in the JSON form).
fn model_fields(saved: &SavedModel, run: &SavedModel, side: Side) -> String {
    let (a, b) = (
        serde_json::to_value(saved).unwrap_or_default(),
        serde_json::to_value(run).unwrap_or_default(),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return String::new();
    };
    let mine = match side {
        Side::Saved => a,
        Side::Run => b,
    };
    let differing: Vec<String> = mine
        .iter()
        .filter(|(key, _)| a.get(*key) != b.get(*key))
        .map(|(key, value)| format!("{key} {value}"))
        .collect();
    if differing.is_empty() {
        mine.iter()
            .map(|(key, value)| format!("{key} {value}"))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        differing.join(", ")
    }
}

/// `file `path` (1234 bytes, shuffled:1)`.
fn describe_data(data: &DataDescription) -> String {
    let size = data
        .bytes
        .map_or_else(|| "size unknown".to_string(), |b| format!("{b} bytes"));
    format!(
        "{} `{}` ({size}, {})",
        data.kind.name(),
        data.name,
        data.order
    )
}

/// Every rank's partition of the run's layout, from the checkpoint's consolidated vectors.
fn reshard(
    loaded: &LoadedCheckpoint,
    run: &EngineState,
    path: &PathBuf,
) -> Result<Vec<OwnedState>, CheckpointError> {
    let checkpoint = &loaded.checkpoint;
    let saved = &checkpoint.state.layout;
    let full = |pick: fn(&OwnedState) -> &Vec<f32>, field: &str| {
        let parts: Vec<Vec<f32>> = checkpoint.ranks.iter().map(|r| pick(r).clone()).collect();
        saved
            .consolidate(&parts)
            .map_err(|message| CheckpointError::corrupt(path, field, message))
    };
    let master = full(|r| &r.master, "fp32_master")?;
    let exp_avg = full(|r| &r.exp_avg, "exp_avg")?;
    let exp_avg_sq = full(|r| &r.exp_avg_sq, "exp_avg_sq")?;
    let adam_step = checkpoint.ranks.first().map_or(0, |r| r.adam_step);
    Ok((0..run.layout.world)
        .map(|rank| OwnedState {
            master: run.layout.slice(rank, &master),
            exp_avg: run.layout.slice(rank, &exp_avg),
            exp_avg_sq: run.layout.slice(rank, &exp_avg_sq),
            adam_step,
        })
        .collect())
}
