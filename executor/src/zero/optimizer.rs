//! [`Optimizer`]: the fp32 master weights and Adam's moments of the region a rank owns, in
//! memory or (stage 3 offload) in NVMe swap files, and the `f32` copy of the owned gradients
//! the step uses. Every stage family has one; what it owns comes from the plan
//! ([`super::EnginePlan::owned`]).

use dsplan_planner::plan::BufferKind;

use super::ZeroError;
use super::listed::ListedBuffers;
use super::precision::DtypeVec;
use super::state::{Buffer, Group};
use super::swap::OptimizerSwap;
use crate::metrics::{Category, Reservation, Tracked};
use crate::optim::AdamState;

/// Whether the optimizer keeps an fp32 master apart from the model-dtype parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MasterCopy {
    /// An fp32 master (16-bit parameters, or a partitioned optimizer).
    Separate,
    /// The `f32` parameters are the master (fp32 stage 0).
    InParams,
}

/// Where the master weights live.
pub(super) enum Master {
    /// In the parameters themselves (fp32 stage 0).
    Params,
    /// In memory.
    Memory(Buffer),
    /// With Adam's moments in swap files (stage 3 `offload_optimizer.device: nvme`).
    Nvme(Box<OptimizerSwap>),
}

/// The owned region's optimizer state.
pub(super) struct Optimizer {
    /// The master weights.
    pub(super) master: Master,
    /// Adam's moments (empty when they are on NVMe) and its step counter.
    pub(super) adam: AdamState,
    _adam_bytes: Reservation,
    /// The `f32` copy of the owned gradients the step uses (when there is a master), from the
    /// boundary to the step.
    pub(super) staged: Option<Buffer>,
}

impl Optimizer {
    /// The optimizer state of `group`'s rank, its master the owned region of the model-dtype
    /// parameters `held` (widened) unless `copy` says the parameters are the master. Under
    /// optimizer offload to NVMe it creates the rank's swap files.
    pub(super) fn new(
        group: &Group,
        held: &DtypeVec,
        copy: MasterCopy,
        listed: &ListedBuffers,
    ) -> Result<Self, ZeroError> {
        let owned = group.plan.owned(group.rank);
        let ledger = &group.ledger;
        let in_memory = match (&group.plan.nvme().optimizer, copy) {
            (None, MasterCopy::Separate) => owned.len(),
            (Some(_), _) | (None, MasterCopy::InParams) => 0,
        };
        let master_len = listed.take(
            BufferKind::MasterWeights,
            in_memory,
            "the owned region's fp32 master in memory",
        )?;
        let master = match (&group.plan.nvme().optimizer, copy) {
            (Some(layout), _) => {
                let largest = layout.sub_groups.iter().map(|g| g.len()).max();
                listed.take(
                    BufferKind::OptimizerSwapBuffers,
                    layout.buffer_count * largest.unwrap_or(0),
                    "the optimizer swap buffers, buffer_count times the largest sub-group",
                )?;
                let mut values = vec![0.0f32; owned.len()];
                held.read(owned.start, &mut values);
                Master::Nvme(Box::new(OptimizerSwap::create(
                    layout, group.rank, &values, ledger,
                )?))
            }
            (None, MasterCopy::Separate) => {
                let mut master = vec![0.0f32; master_len].into_boxed_slice();
                held.read(owned.start, &mut master);
                Master::Memory(Tracked::new(ledger, Category::Master, master))
            }
            (None, MasterCopy::InParams) => Master::Params,
        };
        let adam_len = match master {
            Master::Nvme(_) => 0,
            Master::Params | Master::Memory(_) => owned.len(),
        };
        let adam_len = listed.take(
            BufferKind::OptimizerStates,
            2 * adam_len,
            "Adam's two moments of the owned region in memory",
        )? / 2;
        Ok(Self {
            master,
            adam: AdamState::new(adam_len),
            _adam_bytes: Reservation::new(
                ledger,
                Category::Optimizer,
                (2 * adam_len * std::mem::size_of::<f32>()) as u64,
            ),
            staged: None,
        })
    }

    /// Whether the step updates a separate fp32 master (in memory or on NVMe).
    pub(super) fn has_master(&self) -> bool {
        !matches!(self.master, Master::Params)
    }

    /// The optimizer offload to NVMe, when there is one.
    pub(super) fn swap(&self) -> Option<&OptimizerSwap> {
        match &self.master {
            Master::Nvme(swap) => Some(swap),
            Master::Params | Master::Memory(_) => None,
        }
    }
}
