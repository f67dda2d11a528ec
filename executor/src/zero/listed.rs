//! [`ListedBuffers`]: the run-long host buffers the `dsplan-cpu` plan lists for one rank
//! (`planner::plan::cpu_buffers`), by kind. A rank's stage allocates its parameters, persistent
//! tensors, master, Adam's moments, accumulated gradients and gradient bucket from this list, as
//! the CUDA step's `DeviceLayout` walks the planner's `cuda_tensors`; a listed size that is not
//! what the stage's geometry (the `EnginePlan`) needs is a [`PlanMismatch`]. The short-lived
//! buffers (per unit, at the boundary, at the step) are held to the plan by the measured peaks
//! (`tests/zero_plan_memory.rs`).
//!
//! A plan compiled for another backend lists that backend's buffers; the list is then derived
//! from the same plan's layout, shards, buckets and ticks with the `dsplan-cpu` backend's
//! function, so every run allocates what a `dsplan-cpu` plan of its settings would list.

use std::collections::BTreeMap;

use dsplan_planner::plan::cpu_buffers::{CpuBufferInputs, cpu_buffers};
use dsplan_planner::plan::{Buffer, BufferKind, Device, Lifetime, Plan, PlanBackend};

use super::ZeroError;
use super::partition::PlanMismatch;

/// Per kind: the elements and names of the plan's run-long host buffers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListedBuffers {
    kinds: BTreeMap<BufferKind, Listed>,
}

/// The buffers of one kind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Listed {
    numel: u64,
    names: Vec<String>,
}

impl ListedBuffers {
    /// The run-long host buffers of `plan`: its own list when it was compiled for
    /// `dsplan-cpu`, else the list that backend derives from the plan.
    pub fn of_plan(plan: &Plan) -> Self {
        if plan.settings.backend == PlanBackend::DsplanCpu {
            return Self::of(&plan.buffers);
        }
        Self::of(&cpu_buffers(&CpuBufferInputs {
            model: &plan.model_graph,
            settings: &plan.settings,
            layout: &plan.layout,
            shards: &plan.shards,
            buckets: &plan.buckets,
            ticks: &plan.ticks,
            nvme_resident: &plan.offload.nvme_resident,
            run: &plan.run,
        }))
    }

    /// The run-long host buffers of `buffers`.
    pub fn of(buffers: &[Buffer]) -> Self {
        let mut kinds: BTreeMap<BufferKind, Listed> = BTreeMap::new();
        for buffer in buffers {
            if buffer.device == Device::Cpu && buffer.lifetime == Lifetime::Persistent {
                let listed = kinds.entry(buffer.kind).or_default();
                listed.numel += buffer.numel;
                listed.names.push(buffer.name.clone());
            }
        }
        Self { kinds }
    }

    /// The listed elements of `kind`, when they are the `needed` elements of `what` (a stage's
    /// buffer, in words); a [`PlanMismatch`] naming the listed buffers otherwise.
    pub(super) fn take(
        &self,
        kind: BufferKind,
        needed: usize,
        what: &str,
    ) -> Result<usize, ZeroError> {
        let listed = self.kinds.get(&kind);
        let numel = listed.map_or(0, |l| l.numel);
        if numel == needed as u64 {
            return Ok(needed);
        }
        let names = listed.map_or(format!("{kind:?}"), |l| {
            let quoted: Vec<String> = l.names.iter().map(|n| format!("`{n}`")).collect();
            quoted.join(" + ")
        });
        Err(ZeroError::PlanMismatch(PlanMismatch {
            message: format!(
                "its buffer list gives {names} {numel} elements per rank, where the executor holds {needed} for {what}; compile the plan for this run"
            ),
        }))
    }
}
