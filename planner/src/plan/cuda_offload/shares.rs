//! What one rank of the CUDA step keeps on the GPU under offload: [`on_device`] takes the
//! shares of the same job without offload ([`CudaShares`]) and moves out what the host holds.
//!
//! | share | optimizer offload | + parameter offload (stage 3) |
//! |---|---|---|
//! | fp32 master, AdamW moments | the sub-groups kept on the GPU (`ratio < 1`), else none | as left |
//! | gradient partition | the kept sub-groups' | as left |
//! | gradients | the gradient arena (gradients in flight), at one GPU too | as left |
//! | parameter shard | kept | none: the host's slices are copied into the gather staging |
//! | parameters | unchanged (whole, flat, or stage 3's arena) | stage 3's arena, at one GPU too |
//!
//! At one GPU nothing is reduced: each bucket's gradients are copied to the host straight out
//! of the gradient arena, and a gather is a host → device copy into the arena, so neither
//! bucket nor gather staging is kept.

use super::super::buckets::Buckets;
use super::super::cuda_world::{CudaScheme, CudaShares};
use super::super::settings::Settings;
use super::super::shards::Shards;
use super::super::stage3::Stage3Schedule;
use super::resident_numel;

/// The device shares under offload, from the `resident` shares of the same job.
pub fn on_device(
    resident: CudaShares,
    settings: &Settings,
    shards: &Shards,
    buckets: &Buckets,
    stage3: Option<&Stage3Schedule>,
) -> CudaShares {
    let kept = if settings.offload_optimizer.is_offloaded() {
        resident_numel(shards)
    } else {
        resident.optimizer
    };
    let params_offloaded = settings.offload_param.is_offloaded();
    let base = CudaShares {
        master: if resident.master > 0 { kept } else { 0 },
        optimizer: kept,
        grad_partition: if resident.grad_partition > 0 { kept } else { 0 },
        param_shard: if params_offloaded {
            0
        } else {
            resident.param_shard
        },
        ..resident
    };
    if resident.world > 1 {
        return base;
    }
    let arena = buckets.gradient_arena.as_ref();
    let grads = arena.map_or(resident.grads, |a| a.numel);
    let gathered = stage3.and_then(|s| s.arena.as_ref()).map(|a| a.numel);
    let (scheme, params) = match (params_offloaded, gathered) {
        (true, Some(numel)) => (CudaScheme::Sharded, numel),
        _ if arena.is_some() => (CudaScheme::PartitionedGradients, resident.params),
        _ => (resident.scheme, resident.params),
    };
    CudaShares {
        scheme,
        params,
        grads,
        grad_partition: if arena.is_some() { kept } else { 0 },
        bucket: 0,
        gather: 0,
        ..base
    }
}
