//! The copies dsplan's CUDA step makes under optimizer offload ([`optimizer_transfers`]); the
//! stage-3 parameter fetches are [`super::super::offload`]'s and the NVMe swaps
//! [`super::super::transfer`]'s, shared with the
//! DeepSpeed plan.
//!
//! - After each bucket is reduced, the rank's share of it goes device → host in the model
//!   dtype, on the copy stream, every micro-step ([`bucket_shares`]).
//! - After the host step, the updated 16-bit parameters go host → device: stages 1-2 into the
//!   rank's partition of the flat parameters (then the all-gather), stage 3 into the
//!   parameter shard, one copy per sub-group. Under `offload_param` nothing goes back: the
//!   host step writes the host's parameter slices, which the next gathers fetch.

use super::super::buckets::{Buckets, FlushPoint};
use super::super::dtype::Device;
use super::super::layout::Layout;
use super::super::settings::Settings;
use super::super::shards::Shards;
use super::super::ticks::Ticks;
use super::super::transfer::{Transfer, nvme_group_swaps};
use crate::config::ZeroStage;

/// Elements of each reduce bucket the host receives from rank 0: at stages 1-2 the part of
/// the bucket's tensors inside rank 0's flat partition, at stage 3 the rank's slices of the
/// bucket's tensors, in both cases only of the sub-groups whose optimizer is off the GPU.
pub fn bucket_shares(
    settings: &Settings,
    layout: &Layout,
    shards: &Shards,
    buckets: &Buckets,
) -> Vec<u64> {
    let mut offloaded = vec![false; layout.entries.len()];
    for group in shards.sub_groups.iter().filter(|g| g.device != Device::Gpu) {
        for slot in offloaded
            .iter_mut()
            .take(group.end_entry)
            .skip(group.first_entry)
        {
            *slot = true;
        }
    }
    let mut entry_of_tensor = vec![None; layout.entries.len().max(1)];
    for (index, entry) in layout.entries.iter().enumerate() {
        if let Some(slot) = entry_of_tensor.get_mut(entry.tensor) {
            *slot = Some(index);
        }
    }
    let partition = layout.partition_numel;
    let sharded = settings.stage == ZeroStage::Weights;
    buckets
        .reduce
        .iter()
        .map(|bucket| {
            bucket
                .tensors
                .iter()
                .filter_map(|&t| entry_of_tensor.get(t).copied().flatten())
                .filter(|&e| offloaded[e])
                .map(|e| {
                    let entry = &layout.entries[e];
                    if sharded {
                        entry.partition_numel
                    } else {
                        let end = (entry.offset + entry.numel).min(partition);
                        end.saturating_sub(entry.offset)
                    }
                })
                .sum()
        })
        .collect()
}

/// The gradient and parameter copies of optimizer offload on the CUDA step.
pub fn optimizer_transfers(
    settings: &Settings,
    layout: &Layout,
    shards: &Shards,
    buckets: &Buckets,
    ticks: &Ticks,
    out: &mut Vec<Transfer>,
) {
    let gas = settings.batch.gradient_accumulation_steps;
    let model_bytes = settings.dtypes.params.bytes();
    let shares = bucket_shares(settings, layout, shards, buckets);
    for (bucket, share) in buckets.reduce.iter().zip(shares) {
        if share == 0 {
            continue;
        }
        let tick = match bucket.flush {
            FlushPoint::BackwardStep { step } => ticks.trace(step),
            FlushPoint::Epilogue => ticks.epilogue(),
        };
        out.push(Transfer {
            name: format!(
                "bucket {} gradients to the host ({}, copy stream)",
                bucket.index,
                settings.dtypes.params.as_str()
            ),
            from: Device::Gpu,
            to: Device::Cpu,
            bytes: share * model_bytes,
            tick,
            per_step: gas,
        });
    }
    for group in &shards.sub_groups {
        nvme_group_swaps(settings, group, ticks, out);
    }
    if settings.offload_param.is_offloaded() {
        return;
    }
    if settings.stage == ZeroStage::Weights {
        for group in shards.sub_groups.iter().filter(|g| g.device != Device::Gpu) {
            out.push(Transfer {
                name: format!(
                    "sub-group {} updated parameters to the GPU shard",
                    group.index
                ),
                from: Device::Cpu,
                to: Device::Gpu,
                bytes: group.partition_numel * model_bytes,
                tick: ticks.optimizer(group.index),
                per_step: 1,
            });
        }
    } else {
        let partition: u64 = super::offloaded_numel(shards).min(layout.partition_numel);
        out.push(Transfer {
            name: "updated parameter partition to the GPU".into(),
            from: Device::Cpu,
            to: Device::Gpu,
            bytes: partition * model_bytes,
            tick: ticks.last_optimizer(),
            per_step: 1,
        });
    }
}
