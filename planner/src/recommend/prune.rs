//! Which candidates `recommend` may skip without their full memory estimate.
//!
//! The walk of one strategy tries micro-batches from the largest down and stops at the first
//! that fits; of those that do not fit, only micro-batch 1's peaks are reported. So a
//! micro-batch above 1 that provably overflows the GPU changes nothing and needs no estimate.
//! The proof is the plan's [`ActivationFloor`]: the GPU bytes its activations alone hold, a
//! lower bound of the estimate's GPU peak that costs a fraction of a full plan (at 16,384
//! layers and sequence length 1,024 the activations are hundreds of GiB, and every
//! micro-batch above 1 is skipped this way).

use crate::estimate::Topology;
use crate::estimate::full::plan_config::workload;
use crate::estimate::full::{ConfigReading, Prepared, TrainingShape};
use crate::plan::Cluster;
use crate::plan::activation_floor::ActivationFloor;

/// How `recommend` plans its candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Planning {
    /// Every candidate gets its full memory estimate: the reference the pruned walk is tested
    /// and timed against.
    EveryCandidate,
    /// A micro-batch above 1 whose activations alone overflow the GPU is skipped.
    Pruned,
}

/// The floor of one request's model, when the walk prunes.
pub(super) struct Pruner<'a> {
    floor: Option<(ActivationFloor<'a>, Cluster)>,
}

impl<'a> Pruner<'a> {
    /// A pruner for the `prepared` model on `hardware` (one that skips nothing when
    /// `planning` says so, or when the model or cluster cannot be planned: the full estimate
    /// then says why).
    pub(super) fn new(prepared: &'a Prepared<'_>, hardware: Topology, planning: Planning) -> Self {
        let floor = match planning {
            Planning::EveryCandidate => None,
            Planning::Pruned => prepared
                .graph
                .as_ref()
                .ok()
                .zip(Cluster::new(hardware.total_gpus(), hardware.gpus_per_node()).ok()),
        };
        Pruner {
            floor: floor.map(|(graph, cluster)| (ActivationFloor::new(graph), cluster)),
        }
    }

    /// Whether the config `reading` describes certainly needs more than `gpu_memory` bytes
    /// per GPU.
    pub(super) fn overflows(
        &mut self,
        reading: &ConfigReading,
        shape: &TrainingShape,
        gpu_memory: u64,
    ) -> bool {
        let Some((floor, cluster)) = self.floor.as_mut() else {
            return false;
        };
        let work = workload(&reading.config, &reading.setup, shape);
        floor
            .gpu_bytes(&reading.config, cluster, &work)
            .is_some_and(|bytes| bytes > gpu_memory)
    }
}
