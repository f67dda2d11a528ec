//! What a rank's buffers will peak at, per category, computed from the [`ShardPlan`] and the
//! options alone, before anything is allocated: the prediction the measured
//! [`crate::metrics::MemoryReport`] is checked against (to be replaced by the plan's buffers).
//!
//! Per category (`Ψ` parameters, `Ψ'` padded, `P` partition, `H` stage 3 shard, `b` bytes):
//!
//! * params: `Ψ b_model` (stage 0), `Ψ' b_model` (1, 2), `(H + persistent) b_model` (3);
//! * master: `4` × the owned length (`Ψ`, `P`, `P`, `H`), none for fp32 stage 0;
//! * optimizer: twice that;
//! * grads: the accumulation buffer (`Ψ`, `Ψ'`, `P`, `H` in the accumulation dtype) plus the
//!   larger of backward's unit gradients (the embedding's stay alive through the whole
//!   backward, next to one other unit's) and the `f32` copy of the owned gradients a 16-bit
//!   step makes;
//! * gathered: the `f32` units alive at once (the final norm and the embedding at the head,
//!   or one block; stage 3 adds `W` spare elements per unit), for 16-bit storage or stage 3;
//! * buckets: stage 2's bucket, stage 3's bucket and reduce-scatter output, plus the largest
//!   transient staging (the stage 0/1 reduction chunk of 16-bit gradients, the stage 1/2
//!   parameter all-gather, stage 3's 16-bit chunk and persistent all-gather);
//! * activations: the model's arena.

use dsplan_planner::config::ZeroStage;

use super::partition::ShardPlan;
use super::precision::Dtype;
use super::rank::RankOptions;
use crate::metrics::{ByCategory, Category};
use crate::model::ParamUnit;

const F32: u64 = 4;

/// The predicted peak bytes of every category on one rank (every rank predicts the same).
pub fn predict_peaks(plan: &ShardPlan, options: &RankOptions, activation_bytes: u64) -> ByCategory {
    let flat = plan.flat();
    let world = plan.world();
    let (numel, padded, partition) = (flat.numel as u64, flat.padded as u64, flat.partition as u64);
    let shard = plan.shards().len() as u64;
    let persistent = plan.persistent_numel() as u64;
    let model = options.model_dtype.bytes() as u64;
    let accum = options.accum_dtype.bytes() as u64;
    let stage = options.stage;
    let owned = match stage {
        ZeroStage::Disabled => numel,
        ZeroStage::OptimizerStates | ZeroStage::Gradients => partition,
        ZeroStage::Weights => shard,
    };
    let unit_len = |unit: ParamUnit| plan.units()[plan.unit_index(unit)].span.len as u64;
    let (embedding, final_norm) = (
        unit_len(ParamUnit::Embedding),
        unit_len(ParamUnit::FinalNorm),
    );
    let largest_block = plan
        .units()
        .iter()
        .filter(|u| matches!(u.unit, ParamUnit::Block(_)))
        .map(|u| u.span.len as u64)
        .max()
        .unwrap_or(0);

    let mut peaks = ByCategory::default();
    peaks.set(
        Category::Params,
        model
            * match stage {
                ZeroStage::Disabled => numel,
                ZeroStage::OptimizerStates | ZeroStage::Gradients => padded,
                ZeroStage::Weights => shard + persistent,
            },
    );
    let master = !(stage == ZeroStage::Disabled && options.model_dtype == Dtype::F32);
    peaks.set(Category::Master, if master { F32 * owned } else { 0 });
    peaks.set(Category::Optimizer, 2 * F32 * owned);
    peaks.set(Category::Activations, activation_bytes);

    let accumulation = match stage {
        ZeroStage::Disabled => numel,
        ZeroStage::OptimizerStates => padded,
        ZeroStage::Gradients => partition,
        ZeroStage::Weights => shard,
    };
    let backward = embedding + final_norm.max(largest_block);
    let staged = if options.accum_dtype == Dtype::F32 {
        0
    } else {
        owned
    };
    peaks.set(
        Category::Grads,
        accum * accumulation + F32 * backward.max(staged),
    );

    // Stage 3 gathers each unit with `world` spare elements for the last tensor's padding.
    let spare = if stage == ZeroStage::Weights {
        world as u64
    } else {
        0
    };
    let widened = stage == ZeroStage::Weights || options.model_dtype != Dtype::F32;
    peaks.set(
        Category::Gathered,
        if widened {
            F32 * (largest_block + spare).max(final_norm + embedding + 2 * spare)
        } else {
            0
        },
    );

    let world64 = world as u64;
    let gather_flat = if partition == 0 {
        0
    } else {
        let chunk = ((options.allgather_bucket_size / world) as u64).clamp(1, partition);
        if chunk == partition && options.model_dtype == Dtype::F32 {
            partition
        } else {
            (1 + world64) * chunk
        }
    };
    let buckets = match stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => {
            let len = if stage == ZeroStage::Disabled {
                numel
            } else {
                padded
            };
            let reduce = if options.accum_dtype == Dtype::F32 {
                0
            } else {
                (options.reduce_bucket_size as u64).clamp(1, len.max(1))
            };
            let gather = if stage == ZeroStage::OptimizerStates {
                gather_flat
            } else {
                0
            };
            reduce.max(gather)
        }
        ZeroStage::Gradients => plan.max_bucket_numel() as u64 + gather_flat,
        ZeroStage::Weights => {
            let bucket = (world64 + 1) * plan.max_bucket_shard_numel() as u64;
            let staging = if options.model_dtype == Dtype::F32 {
                0
            } else {
                (0..plan.tensors().len())
                    .filter(|&t| !plan.is_persistent(t))
                    .map(|t| plan.shards().chunk(t) as u64)
                    .max()
                    .unwrap_or(0)
            };
            let persistent_chunks: u64 = plan
                .persistent_tensors()
                .map(|t| plan.shards().chunk(t) as u64)
                .sum();
            bucket + staging.max((world64 + 1) * persistent_chunks)
        }
    };
    peaks.set(Category::Buckets, F32 * buckets);
    peaks
}
