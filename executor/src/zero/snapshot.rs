//! What a rank owns, out and back in, for checkpoints: its fp32 master partition with Adam's
//! moments and step count ([`OwnedState`], DeepSpeed's `*_optim_states`), and the model-dtype
//! parameters it holds (stages 0-2: the whole flat buffer; stage 3: its shard), DeepSpeed's
//! `*_model_states`.
//!
//! A rank resumes by being built as usual from the saved model-dtype parameters (so its
//! parameters, persistent tensors and shard are exactly the saved ones) and then taking its
//! owned state back with [`ZeroRank::import_owned`]. Everything here goes through these few
//! methods, so how `rank.rs` stores the master and optimizer state stays its own business.

use std::fmt;

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
    /// Elements of the rank's optimizer partition.
    pub fn owned_len(&self) -> usize {
        self.master().len()
    }

    /// A copy of the rank's optimizer partition.
    pub fn export_owned(&self) -> OwnedState {
        OwnedState {
            master: self.master().to_vec(),
            exp_avg: self.adam.exp_avg.clone(),
            exp_avg_sq: self.adam.exp_avg_sq.clone(),
            adam_step: self.adam.step,
        }
    }

    /// Takes `state` as the rank's optimizer partition. The model-dtype parameters are left as
    /// built (from the checkpoint's parameters), except for fp32 stage 0, whose parameters are
    /// the master.
    pub fn import_owned(&mut self, state: &OwnedState) -> Result<(), SnapshotMismatch> {
        let moments = self.adam.exp_avg.len();
        for (field, expected, found) in [
            ("master", self.owned_len(), state.master.len()),
            ("exp_avg", moments, state.exp_avg.len()),
            ("exp_avg_sq", moments, state.exp_avg_sq.len()),
        ] {
            if found != expected {
                return Err(SnapshotMismatch {
                    field,
                    expected,
                    found,
                });
            }
        }
        let master: &mut [f32] = match &mut self.master {
            Some(master) => master,
            None => self.params.as_f32_mut().unwrap_or(&mut []),
        };
        master.copy_from_slice(&state.master);
        self.adam.exp_avg.copy_from_slice(&state.exp_avg);
        self.adam.exp_avg_sq.copy_from_slice(&state.exp_avg_sq);
        self.adam.step = state.adam_step;
        Ok(())
    }

    /// The model-dtype parameters this rank holds, widened to `f32` (exact), and their dtype:
    /// stages 0-2 the flat buffer (padding included), stage 3 the rank's shard.
    pub fn held_params(&self) -> (Dtype, Vec<f32>) {
        let mut values = vec![0.0f32; self.params.len()];
        self.params.read(0, &mut values);
        (self.params.dtype(), values)
    }
}
