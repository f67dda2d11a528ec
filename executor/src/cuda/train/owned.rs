//! What a GPU rank owns of the model states, as data: where each piece of its device
//! partition sits in the whole flat model ([`DeviceOwned`]), and the CPU rank's checkpoint
//! layout of the same plan ([`owned_from_whole`], [`held_from_whole`], [`scatter_owned`]).
//!
//! A checkpoint holds each rank's optimizer partition in the CPU rank's layout (its flat
//! partition with the plan's padding as zeros at stages 0-2, its slice of every tensor in shard
//! order at stage 3). The device partition of the same rank covers the same model elements,
//! laid out by `DeviceLayout`. Both are translated through the whole flat model (the
//! [`crate::model::ParamLayout`] order): device → whole → CPU to save, CPU → whole → device
//! to resume, so a GPU rank's checkpoint is a CPU rank's and back. Pure: no GPU needed.

use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::cuda_world::CudaScheme;

use super::layout::DeviceLayout;
use super::shares::RankShares;
use crate::zero::EnginePlan;

/// One run of consecutive elements: `len` elements at `device` in the rank's owned range are
/// the model's elements at `whole` in the flat model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedRun {
    /// Offset in the owned range (from its start).
    pub device: usize,
    /// Offset in the whole flat model.
    pub whole: usize,
    /// Elements.
    pub len: usize,
}

/// Where a GPU rank's owned range (its optimizer partition: the master, the moments and,
/// without a master, the parameters it steps) sits, and which model elements it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOwned {
    /// Where the owned range starts in the parameters' region.
    pub params_at: usize,
    /// Its elements (padding included).
    pub len: usize,
    /// Its model elements, by position.
    pub runs: Vec<OwnedRun>,
    /// Elements of the whole model.
    pub num_params: usize,
}

impl DeviceOwned {
    /// A rank that owns the whole model (one GPU, or stage 0).
    pub fn whole(num_params: usize) -> Self {
        Self {
            params_at: 0,
            len: num_params,
            runs: vec![OwnedRun {
                device: 0,
                whole: 0,
                len: num_params,
            }],
            num_params,
        }
    }

    /// What the rank of `layout` (its `shares`) owns.
    pub fn of_layout(layout: &DeviceLayout) -> Self {
        Self::of_shares(&layout.rank_shares())
    }

    /// What a rank holding `held` (its layout's shares, any family) owns.
    pub fn of_shares(held: &RankShares<'_>) -> Self {
        let num_params = held.table.total_len();
        let shares = held.shares;
        let at = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        match shares.scheme {
            CudaScheme::Replicated => Self::whole(num_params),
            CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => {
                let (start, len) = (at(shares.partition), at(shares.optimizer));
                let real = num_params.saturating_sub(start).min(len);
                Self {
                    params_at: start,
                    len,
                    runs: (real > 0)
                        .then_some(OwnedRun {
                            device: 0,
                            whole: start,
                            len: real,
                        })
                        .into_iter()
                        .collect(),
                    num_params,
                }
            }
            CudaScheme::Sharded => {
                let rank = at(shares.rank);
                let entries = held.table.entries();
                let runs = entries
                    .iter()
                    .zip(held.shard_spans)
                    .filter_map(|(entry, slice)| {
                        let from = (entry.span.offset + rank * slice.len).min(entry.span.end());
                        let to = (from + slice.len).min(entry.span.end());
                        (to > from).then_some(OwnedRun {
                            device: slice.offset,
                            whole: from,
                            len: to - from,
                        })
                    })
                    .collect();
                Self {
                    params_at: at(shares.params),
                    len: at(shares.param_shard),
                    runs,
                    num_params,
                }
            }
        }
    }

    /// The owned range of the whole flat model `whole` (zeros where it pads).
    pub fn from_whole(&self, whole: &[f32]) -> Vec<f32> {
        let mut out = vec![0.0f32; self.len];
        for run in &self.runs {
            out[run.device..run.device + run.len]
                .copy_from_slice(&whole[run.whole..run.whole + run.len]);
        }
        out
    }

    /// Writes the owned range `owned` into its places in the whole flat model `whole`.
    pub fn into_whole(&self, owned: &[f32], whole: &mut [f32]) {
        for run in &self.runs {
            whole[run.whole..run.whole + run.len]
                .copy_from_slice(&owned[run.device..run.device + run.len]);
        }
    }

    /// The owned range `owned` in the CPU rank `rank`'s layout of `plan` (through the whole
    /// model; elements the device does not own are zeros, which at the same plan are only
    /// padding).
    pub fn to_cpu(&self, plan: &EnginePlan, rank: usize, owned: &[f32]) -> Vec<f32> {
        let mut whole = vec![0.0f32; self.num_params];
        self.into_whole(owned, &mut whole);
        owned_from_whole(plan, rank, &whole)
    }

    /// The CPU rank `rank`'s owned state `cpu` of `plan`, laid out as this device range.
    pub fn from_cpu(&self, plan: &EnginePlan, rank: usize, cpu: &[f32]) -> Vec<f32> {
        let mut whole = vec![0.0f32; self.num_params];
        scatter_owned(plan, rank, cpu, &mut whole);
        self.from_whole(&whole)
    }
}

/// What rank `rank` of `plan` owns of a whole flat model state (`whole`: parameters,
/// master or a moment, in the flat order): its flat partition with the plan's padding as
/// zeros (stages 0-2), or its slice of every tensor in shard order (stage 3). A backend that
/// holds the whole state hands it out in this layout.
pub fn owned_from_whole(plan: &EnginePlan, rank: usize, whole: &[f32]) -> Vec<f32> {
    match plan.stage() {
        ZeroStage::Weights => {
            let shards = plan.shards();
            let mut owned = vec![0.0f32; plan.owned(rank).len()];
            for (t, span) in plan.tensors().iter().enumerate() {
                let piece = shards.piece(t, rank);
                let from = shards.offset(t);
                owned[from..from + piece.len()]
                    .copy_from_slice(&whole[span.offset + piece.start..span.offset + piece.end]);
            }
            owned
        }
        _ => plan
            .owned(rank)
            .map(|i| whole.get(i).copied().unwrap_or(0.0))
            .collect(),
    }
}

/// The inverse of [`owned_from_whole`]: writes rank `rank`'s owned state `owned` (the CPU
/// rank's layout) into its places in the whole flat model `whole` (padding dropped).
pub fn scatter_owned(plan: &EnginePlan, rank: usize, owned: &[f32], whole: &mut [f32]) {
    match plan.stage() {
        ZeroStage::Weights => {
            let shards = plan.shards();
            for (t, span) in plan.tensors().iter().enumerate() {
                let piece = shards.piece(t, rank);
                let from = shards.offset(t);
                whole[span.offset + piece.start..span.offset + piece.end]
                    .copy_from_slice(&owned[from..from + piece.len()]);
            }
        }
        _ => {
            for (value, i) in owned.iter().zip(plan.owned(rank)) {
                if let Some(slot) = whole.get_mut(i) {
                    *slot = *value;
                }
            }
        }
    }
}

/// The model-dtype parameters rank `rank` of `plan` holds, from the whole flat parameters:
/// the whole flat buffer with its padding (stages 0-2), or the rank's shard (stage 3).
pub fn held_from_whole(plan: &EnginePlan, rank: usize, whole: &[f32]) -> Vec<f32> {
    match plan.stage() {
        ZeroStage::Weights => owned_from_whole(plan, rank, whole),
        _ => (0..plan.flat().padded)
            .map(|i| whole.get(i).copied().unwrap_or(0.0))
            .collect(),
    }
}
