//! What a rank owns, out and back in, for checkpoints: its fp32 master partition with Adam's
//! moments and step count ([`OwnedState`], DeepSpeed's `*_optim_states`), and the model-dtype
//! parameters it holds (stages 0-2: the whole flat buffer; stage 3: its shard), DeepSpeed's
//! `*_model_states`.
//!
//! A rank resumes by being built as usual from the saved model-dtype parameters (so its
//! parameters, persistent tensors and shard are exactly the saved ones) and then taking its
//! owned state back with [`ZeroRank::import_owned`]. Everything here goes through `rank.rs`'s
//! owned-state accessors, which read and write the master and Adam's moments wherever they
//! live (memory, or NVMe swap files under stage 3 offload).

use std::fmt;

use super::ZeroError;
use super::precision::Dtype;
use super::rank::ZeroRank;

/// One rank's optimizer partition: master weights, Adam's moments and its step count, all in
/// the rank's owned coordinates (padding included).
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedState {
    /// The fp32 master weights of the owned region (stage 0 fp32: the parameters).
    pub master: Vec<f32>,
    /// Adam's first moment (torch `exp_avg`).
    pub exp_avg: Vec<f32>,
    /// Adam's second moment (torch `exp_avg_sq`).
    pub exp_avg_sq: Vec<f32>,
    /// Adam's step count.
    pub adam_step: u64,
}

impl OwnedState {
    /// Whether every vector has `expected` elements (the owned region's length).
    pub fn check_len(&self, expected: usize) -> Result<(), SnapshotMismatch> {
        for (field, found) in [
            ("master", self.master.len()),
            ("exp_avg", self.exp_avg.len()),
            ("exp_avg_sq", self.exp_avg_sq.len()),
        ] {
            if found != expected {
                return Err(SnapshotMismatch {
                    field,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }
}

/// A snapshot that does not fit the rank it is imported into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMismatch {
    /// The vector that differs (`master`, `exp_avg`, `exp_avg_sq`).
    pub field: &'static str,
    /// Elements the rank owns.
    pub expected: usize,
    /// Elements the snapshot has.
    pub found: usize,
}

impl fmt::Display for SnapshotMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "`{}` has {} elements, the rank owns {}",
            self.field, self.found, self.expected
        )
    }
}

impl std::error::Error for SnapshotMismatch {}

impl ZeroRank {
    /// A copy of the rank's optimizer partition, read wherever it lives (memory or NVMe).
    pub fn export_owned(&self) -> Result<OwnedState, ZeroError> {
        let (exp_avg, exp_avg_sq) = self.owned_moments()?;
        Ok(OwnedState {
            master: self.owned_master()?,
            exp_avg,
            exp_avg_sq,
            adam_step: self.optimizer_steps(),
        })
    }

    /// Whether `state` fits this rank's optimizer partition.
    pub fn check_owned(&self, state: &OwnedState) -> Result<(), SnapshotMismatch> {
        state.check_len(self.owned_len())
    }

    /// Takes `state` (checked with [`ZeroRank::check_owned`]) as the rank's optimizer
    /// partition, wherever it lives. The model-dtype parameters are left as built (from the
    /// checkpoint's parameters), except for fp32 stage 0, whose parameters are the master.
    pub fn import_owned(&mut self, state: &OwnedState) -> Result<(), ZeroError> {
        self.write_owned_master(&state.master)?;
        self.write_owned_moments(&state.exp_avg, &state.exp_avg_sq, state.adam_step)
    }

    /// The model-dtype parameters this rank holds, widened to `f32` (exact), and their dtype:
    /// stages 0-2 the flat buffer (padding included), stage 3 the rank's shard in shard order,
    /// with the slices offloaded to NVMe read back from their file.
    pub fn held_params(&mut self) -> Result<(Dtype, Vec<f32>), ZeroError> {
        let stage = self.state.get_mut();
        let dtype = stage.params().dtype();
        Ok((dtype, stage.held_params(&self.group)?))
    }
}
