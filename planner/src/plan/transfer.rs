//! [`Transfer`]: one copy between GPU, host and NVMe that offloading adds to a step, and the
//! NVMe swaps of an optimizer sub-group ([`nvme_group_swaps`]), shared by DeepSpeed's plan
//! ([`super::offload`]) and dsplan-cuda's ([`super::cuda_offload::transfers`]).

use serde::Serialize;

use super::dtype::Device;
use super::settings::Settings;
use super::shards::SubGroup;
use super::ticks::Ticks;

/// One copy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transfer {
    /// What is copied.
    pub name: String,
    /// Source.
    pub from: Device,
    /// Destination.
    pub to: Device,
    /// Bytes per occurrence.
    pub bytes: u64,
    /// Tick of the detailed (boundary) micro-step it happens at.
    pub tick: usize,
    /// Occurrences per optimizer step.
    pub per_step: u64,
}

/// A sub-group on NVMe: its master and optimizer state read before its step and written
/// after it (stage 3, `offload_optimizer.device: nvme`); nothing for a group elsewhere.
pub fn nvme_group_swaps(
    settings: &Settings,
    group: &SubGroup,
    ticks: &Ticks,
    out: &mut Vec<Transfer>,
) {
    let states = settings.optimizer.states;
    let master = settings.dtypes.master.bytes();
    let state_bytes = settings.dtypes.optimizer_states.bytes();
    if group.device == Device::Nvme {
        let tick = ticks.optimizer(group.index);
        let bytes = group.partition_numel * (master + states * state_bytes);
        for (from, to, way) in [
            (Device::Nvme, Device::Cpu, "in"),
            (Device::Cpu, Device::Nvme, "out"),
        ] {
            out.push(Transfer {
                name: format!(
                    "sub-group {} master and optimizer state swapped {way}",
                    group.index
                ),
                from,
                to,
                bytes,
                tick,
                per_step: 1,
            });
        }
    }
}
