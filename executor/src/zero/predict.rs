//! What a rank's buffers will peak at, per category, computed from the plan
//! ([`EnginePlan`]: its layout, partitions, buckets and fetch units) before anything is
//! allocated, and how each category relates to the plan's own buffer list
//! ([`Correspondence`]).
//!
//! The plan lists the buffers DeepSpeed allocates on a GPU; the CPU executor allocates the same
//! model states (parameters, persistent parameters, master weights, optimizer states, the
//! stage 0-2 fp32 gradient partition of the step), and its own transient buffers where a CPU
//! that computes in `f32` with in-process collectives needs something else. This module gives
//! the executor's exact figure for every category, so that the measured peaks can be checked
//! to the byte, and says for every category whether it must equal the plan's and, if not, why.
//!
//! Per category (`Ψ'` the plan's flat buffer, padded; `O` the rank's owned length: `Ψ`, `P`,
//! `P`, `H` by stage; `b` bytes):
//!
//! * params: `Ψ' b_model` (stages 0-2), `(H + persistent) b_model` (3);
//! * master: `4 O` when there is a separate master (not fp32 stage 0); optimizer: `8 O`;
//! * step scratch: `4 O` when there is a separate master;
//! * grads: the accumulation buffer (`Ψ'`, `Ψ'`, `P`, `H` in the accumulation dtype) plus the
//!   f32 unit gradients of backward (the embedding's stay alive through the whole backward,
//!   next to one other unit's);
//! * gathered: the `f32` units alive at once (the final norm and the embedding at the head,
//!   or one block; stage 3 adds `W` spare elements per unit), for 16-bit storage or stage 3;
//! * buckets: stage 2's bucket, stage 3's bucket and reduce-scatter output, plus the largest
//!   transient staging (16-bit stage 0/1 buckets, the stage 1/2 parameter all-gather, stage 3's
//!   16-bit fetch and persistent re-gather);
//! * activations: the model's arena.

use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::settings::OffloadTarget;
use dsplan_planner::plan::{Dtype as PlanDtype, Plan};

use super::partition::EnginePlan;
use super::precision::Dtype;
use crate::metrics::{ByCategory, Category};
use crate::model::ParamUnit;

const F32: u64 = 4;

/// The predicted peak bytes of every category on one rank (every rank predicts the same).
pub fn predict_peaks(plan: &EnginePlan, activation_bytes: u64) -> ByCategory {
    let flat = plan.flat();
    let world = plan.world() as u64;
    let stage = plan.stage();
    let dtypes = plan.dtypes();
    let (padded, partition) = (flat.padded as u64, flat.partition as u64);
    let shard = plan.shards().len() as u64;
    let persistent = plan.persistent_numel() as u64;
    let model = dtypes.model.bytes() as u64;
    let accum = dtypes.accum.bytes() as u64;
    let owned = plan.owned(0).len() as u64;
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
    let master = !(stage == ZeroStage::Disabled && dtypes.model == Dtype::F32);

    let mut peaks = ByCategory::default();
    peaks.set(
        Category::Params,
        model
            * match stage {
                ZeroStage::Weights => shard + persistent,
                _ => padded,
            },
    );
    peaks.set(Category::Master, if master { F32 * owned } else { 0 });
    peaks.set(Category::StepScratch, if master { F32 * owned } else { 0 });
    peaks.set(Category::Optimizer, 2 * F32 * owned);
    peaks.set(Category::Activations, activation_bytes);
    let accumulation = match stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => padded,
        ZeroStage::Gradients => partition,
        ZeroStage::Weights => shard,
    };
    let backward = embedding + final_norm.max(largest_block);
    peaks.set(Category::Grads, accum * accumulation + F32 * backward);

    // Stage 3 gathers each unit with `world` spare elements for the last tensor's padding.
    let spare = if stage == ZeroStage::Weights {
        world
    } else {
        0
    };
    let widened = stage == ZeroStage::Weights || dtypes.model != Dtype::F32;
    peaks.set(
        Category::Gathered,
        if widened {
            F32 * (largest_block + spare).max(final_norm + embedding + 2 * spare)
        } else {
            0
        },
    );
    peaks.set(Category::Buckets, F32 * bucket_elements(plan));
    peaks
}

/// Elements of the `f32` communication buffers alive at once, at their peak.
fn bucket_elements(plan: &EnginePlan) -> u64 {
    let world = plan.world() as u64;
    let dtypes = plan.dtypes();
    let partition = plan.flat().partition as u64;
    let pieces = plan.param_gather();
    let largest_piece = pieces.iter().map(|p| p.len() as u64).max().unwrap_or(0);
    let whole = pieces.len() == 1 && pieces[0].len() as u64 == partition;
    let gather_flat = if whole && dtypes.model == Dtype::F32 {
        partition
    } else if largest_piece > 0 {
        (1 + world) * largest_piece
    } else {
        0
    };
    match plan.stage() {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => {
            let reduce = plan
                .buckets()
                .iter()
                .filter(|b| dtypes.accum != Dtype::F32 || b.flat_range.is_none())
                .map(|b| b.numel as u64)
                .max()
                .unwrap_or(0);
            let gather = if plan.stage() == ZeroStage::OptimizerStates {
                gather_flat
            } else {
                0
            };
            reduce.max(gather)
        }
        ZeroStage::Gradients => plan.max_bucket_numel() as u64 + gather_flat,
        ZeroStage::Weights => {
            let bucket = (world + 1) * plan.max_bucket_shard_numel() as u64;
            let staging = if dtypes.model == Dtype::F32 {
                0
            } else {
                plan.units()
                    .iter()
                    .flat_map(|u| u.fetch.iter())
                    .map(|&t| plan.shards().chunk(t) as u64)
                    .max()
                    .unwrap_or(0)
            };
            let persistent_chunks: u64 = plan
                .persistent_tensors()
                .map(|t| plan.shards().chunk(t) as u64)
                .sum();
            bucket + staging.max((world + 1) * persistent_chunks)
        }
    }
}

/// How the executor's buffers of one category relate to the plan's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Correspondence {
    /// The executor allocates exactly the plan's buffers of this category.
    Same,
    /// It allocates something else, for this reason.
    Differs(&'static str),
}

impl Correspondence {
    /// Whether measured and planned bytes must be equal.
    pub fn is_same(self) -> bool {
        self == Correspondence::Same
    }

    /// The reason, or `""`.
    pub fn reason(self) -> &'static str {
        match self {
            Correspondence::Same => "",
            Correspondence::Differs(reason) => reason,
        }
    }
}

/// How category `category` of the executor relates to the plan's buffers of that category
/// (see [`crate::metrics::plan`] for which plan buffers map to which category).
pub fn correspondence(category: Category, plan: &Plan) -> Correspondence {
    use Correspondence::{Differs, Same};
    let s = &plan.settings;
    let stage = s.stage;
    let sixteen_bit = s.dtypes.params != PlanDtype::Fp32;
    match category {
        Category::Params => Same,
        Category::Master if s.dtypes.master == PlanDtype::Fp32 => Same,
        Category::Master => Differs(
            "the plan keeps bf16 master weights (bf16_master_weights_and_grads); the executor keeps an fp32 master",
        ),
        Category::Optimizer
            if s.dtypes.optimizer_states == PlanDtype::Fp32 && s.optimizer.states == 2 =>
        {
            Same
        }
        Category::Optimizer => Differs(
            "the executor runs Adam with two fp32 states per element; the plan assumes another optimizer or dtype",
        ),
        Category::StepScratch => match stage {
            ZeroStage::Weights => Differs(
                "the plan counts DeepSpeed's per-sub-group fp32 flatten next to its largest-sub-group fp32 buffer; the executor makes one fp32 copy of its shard for the step",
            ),
            ZeroStage::Disabled if sixteen_bit => Differs(
                "without ZeRO, 16-bit runs use DeepSpeed's BF16_Optimizer, which steps on a view of its whole fp32 gradient accumulation buffer (the plan's buffer here); the executor runs stage 1's engine and copies its partition for the step",
            ),
            _ if s.offload_optimizer != OffloadTarget::None => Differs(
                "with optimizer offload the plan keeps the fp32 gradient partition on the host for the whole run (as gradients); the executor makes the copy for the step only",
            ),
            _ => Same,
        },
        Category::Grads => match stage {
            ZeroStage::Disabled | ZeroStage::OptimizerStates => Differs(
                "the plan counts each module's gradient in the model dtype until the boundary (stage 1: plus grads_in_partition); the executor accumulates into its own buffer (the accumulation dtype, stage 1 padded) and computes each unit's gradient in a fresh f32 buffer, the embedding's through the whole backward",
            ),
            ZeroStage::Gradients | ZeroStage::Weights => Differs(
                "the gradient partition is the plan's; next to it the plan counts one module's gradient in the model dtype until it is copied into the bucket, the executor the CPU model's f32 gradient of one unit at a time, the embedding's through the whole backward",
            ),
        },
        Category::Buckets => match stage {
            ZeroStage::Disabled => Differs(
                "the plan counts DeepSpeed's flattened all-reduce bucket in the communication dtype; the executor reduces fp32 gradients in place and 16-bit ones through an f32 copy of the bucket",
            ),
            ZeroStage::OptimizerStates | ZeroStage::Gradients => Differs(
                "the plan counts the IPG buffer(s) of reduce_bucket_size elements DeepSpeed allocates whole (two with overlap_comm); the executor the largest planned bucket in f32 (stage 2) and f32 staging for the parameter all-gather",
            ),
            ZeroStage::Weights => Differs(
                "the plan counts one IPG buffer of reduce_bucket_size elements; the executor the largest planned bucket laid out per rank in f32 with its reduce-scatter output, and f32 staging for 16-bit fetches and the persistent re-gather",
            ),
        },
        Category::Gathered => match stage {
            ZeroStage::Weights => Differs(
                "the plan keeps each gathered tensor in the model dtype as long as its schedule says (prefetch, reuse distance); the executor gathers one model unit at a time in f32 (plus W spare elements) and releases it after each use",
            ),
            _ if sixteen_bit => Differs(
                "the CPU model computes in f32: each 16-bit unit is widened into an f32 copy while in use (a GPU computes on the 16-bit parameters)",
            ),
            _ => Same,
        },
        Category::Activations => Differs(
            "the plan uses its per-layer activation formula in the model dtype; the executor the CPU model's f32 activation arena",
        ),
    }
}
