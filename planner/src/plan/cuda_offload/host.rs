//! The host (and NVMe) buffers of one rank of dsplan's CUDA step under offload
//! ([`host_buffers`]; the table is the [module documentation](super)). Every one is allocated
//! before the first step and kept for the run. Only what a DMA copy touches is pinned (per
//! `pin_memory`): the gradient staging, the parameter chunks and slices, the swap buffers. The
//! fp32 master and the moments are read and written by the host optimizer only, so they stay
//! pageable, which keeps the pinnable memory a run needs small.

use super::super::buffers::{BufferKind, BufferList, Lifetime};
use super::super::dtype::{Device, Dtype};
use super::super::layout::Layout;
use super::super::settings::{OffloadStepping, OffloadTarget, Pinning, Settings};
use super::super::shards::Shards;

/// Elements of one chunk of updated parameters on its way back to the GPU: the host step
/// writes one chunk while the copy engine sends the other (2^26 elements, 128 MiB in 16 bits,
/// well past the size a host → device copy needs to run at full speed).
pub const PARAM_CHUNK: u64 = 1 << 26;

/// What [`host_buffers`] reads from the plan.
pub struct HostInputs<'a> {
    /// Settings.
    pub settings: &'a Settings,
    /// Layout.
    pub layout: &'a Layout,
    /// Shards (the sub-groups and where their optimizer runs).
    pub shards: &'a Shards,
    /// Stage 3 NVMe parameter offload: which tensors have their slice on NVMe.
    pub nvme_resident: &'a [bool],
}

/// Adds the rank's host and NVMe buffers to `list` (nothing without offload).
pub fn host_buffers(list: &mut BufferList, inputs: &HostInputs<'_>) {
    parameter_buffers(list, inputs);
    optimizer_buffers(list, inputs);
}

/// Stage 3 parameter offload: the rank's 16-bit slices on the host (up to `max_in_cpu` under
/// NVMe, the rest in swap files read through the swap buffers).
fn parameter_buffers(list: &mut BufferList, inputs: &HostInputs<'_>) {
    let s = inputs.settings;
    let params = s.dtypes.params;
    let partition = inputs.layout.partition_numel;
    let run = Lifetime::Persistent;
    match &s.offload_param {
        OffloadTarget::None => {}
        OffloadTarget::Cpu { pinning } => {
            list.add(
                "parameter slices (host)",
                BufferKind::Parameters,
                params,
                partition,
                Device::Cpu,
                run,
            );
            list.pinned(*pinning);
        }
        OffloadTarget::Nvme {
            pinning,
            buffer_count,
            buffer_size,
            ..
        } => {
            let on_nvme: u64 = inputs
                .layout
                .entries
                .iter()
                .filter(|e| inputs.nvme_resident.get(e.tensor).copied().unwrap_or(false))
                .map(|e| e.partition_numel)
                .sum();
            list.add(
                "parameter slices (host, up to max_in_cpu)",
                BufferKind::Parameters,
                params,
                partition.saturating_sub(on_nvme),
                Device::Cpu,
                run,
            );
            list.pinned(*pinning);
            list.add(
                "parameter slices (NVMe)",
                BufferKind::Parameters,
                params,
                on_nvme,
                Device::Nvme,
                run,
            );
            list.add(
                "parameter swap buffers",
                BufferKind::ParamSwapBuffers,
                params,
                buffer_count.saturating_mul(*buffer_size),
                Device::Cpu,
                run,
            );
            list.pinned(Pinning::Pinned);
        }
    }
}

/// Optimizer offload: master and moments of the offloaded sub-groups (host or NVMe), the
/// model-dtype gradient staging, the parameter chunks going back, the speculative side.
fn optimizer_buffers(list: &mut BufferList, inputs: &HostInputs<'_>) {
    let s = inputs.settings;
    let Some(pinning) = s.offload_optimizer.pinning() else {
        return;
    };
    let run = Lifetime::Persistent;
    let groups = &inputs.shards.sub_groups;
    let numel_on = |device: Device| -> u64 {
        groups
            .iter()
            .filter(|g| g.device == device)
            .map(|g| g.partition_numel)
            .sum()
    };
    let (on_host, on_nvme) = (numel_on(Device::Cpu), numel_on(Device::Nvme));
    let state_names = [
        ("fp32 master", BufferKind::MasterWeights),
        ("AdamW exp_avg", BufferKind::OptimizerStates),
        ("AdamW exp_avg_sq", BufferKind::OptimizerStates),
    ];
    for (name, kind) in state_names {
        list.add(
            format!("{name} (host)"),
            kind,
            Dtype::Fp32,
            on_host,
            Device::Cpu,
            run,
        );
        list.add(
            format!("{name} (NVMe)"),
            kind,
            Dtype::Fp32,
            on_nvme,
            Device::Nvme,
            run,
        );
    }
    if s.offload_stepping == OffloadStepping::Speculative {
        for (name, kind) in state_names {
            list.add(
                format!("{name}, speculative side (host)"),
                kind,
                Dtype::Fp32,
                on_host,
                Device::Cpu,
                run,
            );
        }
    }
    if let OffloadTarget::Nvme { buffer_count, .. } = s.offload_optimizer {
        let largest = groups
            .iter()
            .filter(|g| g.device == Device::Nvme)
            .map(|g| g.partition_numel)
            .max()
            .unwrap_or(0);
        list.add(
            "optimizer swap buffers",
            BufferKind::OptimizerSwapBuffers,
            Dtype::Fp32,
            buffer_count.saturating_mul(largest),
            Device::Cpu,
            run,
        );
        list.pinned(Pinning::Pinned);
    }
    let model = s.dtypes.params;
    list.add(
        format!("gradient staging (host, {})", model.as_str()),
        BufferKind::Gradients,
        model,
        on_host + on_nvme,
        Device::Cpu,
        run,
    );
    list.pinned(pinning);
    if !s.offload_param.is_offloaded() {
        list.add(
            "updated parameter chunks (host, two)",
            BufferKind::OffloadStaging,
            model,
            2 * PARAM_CHUNK.min(on_host + on_nvme),
            Device::Cpu,
            run,
        );
        list.pinned(pinning);
    }
}
