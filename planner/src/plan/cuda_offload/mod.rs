//! ZeRO-Offload and ZeRO-Infinity on dsplan's CUDA executor ([`super::PlanBackend::DsplanCuda`]):
//! what moves off the GPU, what the host holds, and what crosses the link each step.
//!
//! Under `offload_optimizer` the fp32 master weights and AdamW's moments of the offloaded
//! sub-groups live on the host (or on NVMe at stage 3), and the host optimizer steps them.
//! Each reduced bucket's share of the rank's gradients goes device → host as soon as the
//! bucket is reduced; the GPU keeps only the gradients in flight (the gradient arena of
//! [`super::grad_arena`], also at one GPU). Under `offload_param` (stage 3) the rank's 16-bit
//! parameter slices live on the host and each gather first copies them host → device; the
//! gathered-parameter arena ([`super::stage3_arena`]) is placed at one GPU too.
//!
//! The host layout is leaner than DeepSpeed's (`Ψo` the offloaded elements of the rank):
//!
//! | host buffer | dsplan-cuda | DeepSpeed 0.19.8 |
//! |---|---|---|
//! | fp32 master, `exp_avg`, `exp_avg_sq` | `Ψo` each, pageable (never copied by DMA) | master pinned, states pageable |
//! | gradients | `Ψo` in the model dtype (16-bit), pinned per `pin_memory`, filled bucket by bucket | `Ψo` in fp32, pinned |
//! | 16-bit parameters out | two chunks of [`host::PARAM_CHUNK`] elements, pinned (stage 3 with `offload_param`: written into the host parameter slices) | the host staging of the largest tensor |
//! | speculative state (`super_offload`) | a second master and pair of moments, `Ψo` each ([`super::settings::OffloadStepping::Speculative`]) | - |
//!
//! The gradients keep the model dtype: the host optimizer reads bf16 or fp16 gradients and
//! widens them in registers ([`crate::plan`]'s executor counterpart: `optim::offload`), which
//! gives the numbers an fp32 copy would. The device buffers that remain are
//! [`super::cuda_world::CudaShares::new`]'s. Files: [`host`] (the host buffers), [`transfers`] (the copies), [`preflight`] (host RAM and
//! pinnable memory against the plan), [`check`] (what the backend refuses, by name).

pub mod check;
pub mod host;
pub mod preflight;
pub mod transfers;

use super::dtype::Device;
use super::settings::Settings;
use super::shards::Shards;

/// Whether the optimizer or the parameters leave the GPU under `settings`.
pub fn offloads(settings: &Settings) -> bool {
    settings.offload_optimizer.is_offloaded() || settings.offload_param.is_offloaded()
}

/// Elements of the rank's partition whose optimizer runs off the GPU (host or NVMe): all of it
/// under `offload_optimizer`, the first `⌊ratio × groups⌋` sub-groups with `ratio < 1`.
pub fn offloaded_numel(shards: &Shards) -> u64 {
    shards
        .sub_groups
        .iter()
        .filter(|g| g.device != Device::Gpu)
        .map(|g| g.partition_numel)
        .sum()
}

/// Elements of the rank's partition whose optimizer stays on the GPU.
pub fn resident_numel(shards: &Shards) -> u64 {
    shards
        .sub_groups
        .iter()
        .filter(|g| g.device == Device::Gpu)
        .map(|g| g.partition_numel)
        .sum()
}
