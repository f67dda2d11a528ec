//! [`Offload`]: the copies between GPU, host and NVMe that offloading adds to a step, with their
//! sizes and the tick they happen at.
//!
//! - **Optimizer offload, stages 1/2** (ZeRO-Offload): each reducing micro-step copies the
//!   rank's gradient partition, cast to fp32, into the pinned host buffer (later micro-steps
//!   accumulate "in CPU via GPU": host → device, add, device → host); DeepSpeedCPUAdam steps
//!   the host master; the updated 16-bit partition goes back to the GPU before the all-gather.
//! - **Optimizer offload, stage 3**: every micro-step each bucket's reduced partition goes to
//!   the host gradient buffer; at the step each sub-group is stepped on the host (NVMe: its
//!   master and states are read before and written after) and its 16-bit partition copied back.
//! - **dsplan's CUDA step** ([`super::cuda_offload::transfers`]): each bucket's share of the
//!   rank's gradients in the model dtype as soon as it is reduced, and the updated 16-bit
//!   parameters back after the host step.
//! - **Parameter offload, stage 3**: every gather first copies the rank's partition of each
//!   tensor host → device; partitions beyond `max_in_cpu` elements are read from NVMe first, and
//!   written back after the step.

use serde::Serialize;

use super::backend::PlanBackend;
use super::buckets::{Buckets, FlushPoint};
use super::dtype::{Device, Dtype};
use super::layout::Layout;
use super::settings::{OffloadTarget, Settings};
use super::shards::Shards;
use super::stage3::Stage3Schedule;
use super::ticks::Ticks;
pub use super::transfer::{Transfer, nvme_group_swaps};

/// Bytes per optimizer step over each link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct TransferTotals {
    /// GPU → host.
    pub device_to_host: u64,
    /// Host → GPU.
    pub host_to_device: u64,
    /// NVMe → host.
    pub nvme_read: u64,
    /// Host → NVMe.
    pub nvme_write: u64,
}

/// Offload decisions and copies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Offload {
    /// Where optimizer state lives.
    pub optimizer: OffloadTarget,
    /// Where parameters live (stage 3).
    pub params: OffloadTarget,
    /// Every copy.
    pub transfers: Vec<Transfer>,
    /// Per-step totals.
    pub totals: TransferTotals,
    /// Stage 3 NVMe parameter offload: which model tensors have their partition on NVMe.
    #[serde(skip)]
    pub nvme_resident: Vec<bool>,
}

/// Which tensors' partitions live on NVMe: those beyond the first `max_in_cpu` partition
/// elements, in layout order (persistent ones never).
pub fn nvme_resident(
    layout: &Layout,
    settings: &Settings,
    persistent: &[usize],
    tensors: usize,
) -> Vec<bool> {
    let mut resident = vec![false; tensors];
    if let OffloadTarget::Nvme { max_in_cpu, .. } = settings.offload_param {
        let mut in_cpu = 0u64;
        let mut is_persistent = vec![false; layout.entries.len()];
        for &index in persistent {
            if let Some(slot) = is_persistent.get_mut(index) {
                *slot = true;
            }
        }
        for (index, entry) in layout.entries.iter().enumerate() {
            if is_persistent[index] {
                continue;
            }
            if in_cpu + entry.partition_numel <= max_in_cpu {
                in_cpu += entry.partition_numel;
            } else {
                resident[entry.tensor] = true;
            }
        }
    }
    resident
}

/// The copies of one step.
pub fn plan_offload(
    settings: &Settings,
    layout: &Layout,
    shards: &Shards,
    buckets: &Buckets,
    stage3: Option<&Stage3Schedule>,
    ticks: &Ticks,
    nvme: Vec<bool>,
) -> Offload {
    let mut transfers = Vec::new();
    let gas = settings.batch.gradient_accumulation_steps;
    let param_bytes = settings.dtypes.params.bytes();
    if settings.offload_optimizer.is_offloaded() {
        match (settings.backend, stage3) {
            (PlanBackend::DsplanCuda, _) => super::cuda_offload::transfers::optimizer_transfers(
                settings,
                layout,
                shards,
                buckets,
                ticks,
                &mut transfers,
            ),
            (_, None) => stage12_optimizer(settings, layout, ticks, &mut transfers),
            (_, Some(_)) => stage3_optimizer(settings, shards, buckets, ticks, &mut transfers),
        }
    }
    if let (Some(schedule), true) = (stage3, settings.offload_param.is_offloaded()) {
        let mut per_tick: Vec<(u64, u64)> = vec![(0, 0); ticks.len()];
        for step in &schedule.steps {
            for &t in step.on_demand.iter().chain(&step.prefetch) {
                let Some(entry) = layout.entry_of(t) else {
                    continue;
                };
                let bytes = entry.partition_numel * param_bytes;
                per_tick[ticks.trace(step.step)].0 += bytes;
                if nvme.get(t).copied().unwrap_or(false) {
                    per_tick[ticks.trace(step.step)].1 += bytes;
                }
            }
        }
        for (tick, (h2d, from_nvme)) in per_tick.into_iter().enumerate() {
            if from_nvme > 0 {
                transfers.push(Transfer {
                    name: "parameter partitions swapped in for gathering".into(),
                    from: Device::Nvme,
                    to: Device::Cpu,
                    bytes: from_nvme,
                    tick,
                    per_step: gas,
                });
            }
            if h2d > 0 {
                transfers.push(Transfer {
                    name: "parameter partitions to the GPU for gathering".into(),
                    from: Device::Cpu,
                    to: Device::Gpu,
                    bytes: h2d,
                    tick,
                    per_step: gas,
                });
            }
        }
        let written: u64 = layout
            .entries
            .iter()
            .filter(|e| nvme.get(e.tensor).copied().unwrap_or(false))
            .map(|e| e.partition_numel * param_bytes)
            .sum();
        if written > 0 {
            transfers.push(Transfer {
                name: "updated parameter partitions written back".into(),
                from: Device::Cpu,
                to: Device::Nvme,
                bytes: written,
                tick: ticks.last_optimizer(),
                per_step: 1,
            });
        }
    }
    let mut totals = TransferTotals::default();
    for t in &transfers {
        let bytes = t.bytes * t.per_step;
        match (t.from, t.to) {
            (Device::Gpu, Device::Cpu) => totals.device_to_host += bytes,
            (Device::Cpu, Device::Gpu) => totals.host_to_device += bytes,
            (Device::Nvme, _) => totals.nvme_read += bytes,
            (_, Device::Nvme) => totals.nvme_write += bytes,
            _ => {}
        }
    }
    Offload {
        optimizer: settings.offload_optimizer.clone(),
        params: settings.offload_param.clone(),
        transfers,
        totals,
        nvme_resident: nvme,
    }
}

fn stage12_optimizer(settings: &Settings, layout: &Layout, ticks: &Ticks, out: &mut Vec<Transfer>) {
    let gas = settings.batch.gradient_accumulation_steps;
    let partition = layout.partition_numel;
    let reductions = if settings.partitions_gradients() {
        gas
    } else {
        1
    };
    out.push(Transfer {
        name: "fp32 gradient partition to the host".into(),
        from: Device::Gpu,
        to: Device::Cpu,
        bytes: partition * Dtype::Fp32.bytes(),
        tick: ticks.epilogue(),
        per_step: reductions,
    });
    if reductions > 1 {
        out.push(Transfer {
            name: "host gradient accumulator to the GPU (accumulate in CPU via GPU)".into(),
            from: Device::Cpu,
            to: Device::Gpu,
            bytes: partition * Dtype::Fp32.bytes(),
            tick: ticks.epilogue(),
            per_step: reductions - 1,
        });
    }
    out.push(Transfer {
        name: "updated 16-bit parameter partition to the GPU".into(),
        from: Device::Cpu,
        to: Device::Gpu,
        bytes: partition * settings.dtypes.params.bytes(),
        tick: ticks.last_optimizer(),
        per_step: 1,
    });
}

fn stage3_optimizer(
    settings: &Settings,
    shards: &Shards,
    buckets: &Buckets,
    ticks: &Ticks,
    out: &mut Vec<Transfer>,
) {
    let gas = settings.batch.gradient_accumulation_steps;
    let world = settings.world_size;
    let accum = settings.dtypes.grad_accum.bytes();
    let comm = settings.dtypes.communication.bytes();
    let any_cpu = shards.sub_groups.iter().any(|g| g.device != Device::Gpu);
    if any_cpu {
        for bucket in &buckets.reduce {
            let tick = match bucket.flush {
                FlushPoint::BackwardStep { step } => ticks.trace(step),
                FlushPoint::Epilogue => ticks.epilogue(),
            };
            out.push(Transfer {
                name: format!(
                    "reduced gradient partition of bucket {} to the host",
                    bucket.index
                ),
                from: Device::Gpu,
                to: Device::Cpu,
                bytes: bucket.bytes / comm / world * accum,
                tick,
                per_step: gas,
            });
        }
    }
    for group in &shards.sub_groups {
        let tick = ticks.optimizer(group.index);
        nvme_group_swaps(settings, group, ticks, out);
        if group.device != Device::Gpu && !settings.offload_param.is_offloaded() {
            out.push(Transfer {
                name: format!(
                    "sub-group {} updated 16-bit partition to the GPU",
                    group.index
                ),
                from: Device::Cpu,
                to: Device::Gpu,
                bytes: group.partition_numel * settings.dtypes.params.bytes(),
                tick,
                per_step: 1,
            });
        }
    }
}
