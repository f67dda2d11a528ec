//! [`Buckets`]: gradients grouped for reduction in the order backward produces them, each
//! bucket with its collective, and the flat-partition parameter all-gather after the step
//! (stages 1/2: see [`super::run_policy`]).
//!
//! - **Stage 0** (`buffered_allreduce_fallback`): after backward, in `named_parameters()`
//!   order; a tensor joins the bucket, and the bucket is all-reduced once it holds more than
//!   5e8 elements.
//! - **Stages 1-3** (the IPG bucket): as each gradient becomes ready, the bucket is flushed
//!   first if it is not empty and the gradient would overflow `reduce_bucket_size`; a gradient
//!   larger than the bucket travels alone. The last bucket flushes in the backward epilogue.
//!   Collectives: stages 1/2 all-reduce the whole bucket and keep their slices when
//!   `reduce_scatter` and `use_multi_rank_bucket_allreduce` (the default: not a true
//!   reduce-scatter), reduce to each destination rank without multi-rank all-reduce, and
//!   all-reduce without `reduce_scatter`; stage 3 reduce-scatters (each gradient padded to a
//!   multiple of N), or all-reduces without `reduce_scatter`.
//!
//! Gradient readiness order: a tensor is ready after the backward of the last module that uses
//! it (GPT-2's tied `wte` after the embedding's backward, not the LM head's); within a module,
//! the reverse of its parameter order. That is autograd's usual order for these models; it is
//! an assumption, not a trace.

use serde::Serialize;

use super::dtype::Dtype;
use super::layout::{Layout, NCCL_START_ALIGNMENT};
use super::model_graph::ModelGraph;
use super::run_policy::{EngineFamily, RunPolicy};
use super::settings::{Overlap, ParamGatherMode, ReduceTiming, Settings};
use super::shards::ElementRange;
use super::stage3::{Pass, trace_step};
use super::stage3_arena::Stage3Arena;
use crate::config::ZeroStage;

/// A collective operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    /// Every rank ends with the sum of all.
    AllReduce,
    /// Every rank ends with the sum of its own slice.
    ReduceScatter,
    /// One reduce to each destination rank, for its slice.
    Reduce,
    /// Every rank ends with every rank's slice.
    AllGather,
}

impl Collective {
    /// Bytes each rank sends per byte of the full buffer, for a ring over `world` ranks.
    pub fn ring_factor(self, world: u64) -> f64 {
        if world <= 1 {
            return 0.0;
        }
        let share = (world - 1) as f64 / world as f64;
        match self {
            Collective::AllReduce => 2.0 * share,
            Collective::ReduceScatter | Collective::Reduce | Collective::AllGather => share,
        }
    }

    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all-gather",
        }
    }
}

/// Why a bucket holds what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BucketKind {
    /// Filled up to `reduce_bucket_size`.
    Ipg,
    /// One gradient larger than the bucket, reduced alone.
    Oversized,
    /// Stage 0's post-backward all-reduce bucket.
    Fallback,
}

/// When a bucket's reduction is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "at", rename_all = "kebab-case")]
pub enum FlushPoint {
    /// In the gradient hook of the given backward trace step.
    BackwardStep {
        /// Trace step (see [`super::stage3::trace_step`]).
        step: usize,
    },
    /// After the backward pass.
    Epilogue,
}

/// One gradient bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReduceBucket {
    /// Position in reduction order.
    pub index: usize,
    /// Model tensors, in readiness order.
    pub tensors: Vec<usize>,
    /// Gradient elements.
    pub numel: u64,
    /// Bytes on the wire (communication dtype, stage-3 padding included).
    pub bytes: u64,
    /// The collective.
    pub collective: Collective,
    /// Filled normally, oversized, or stage 0.
    pub kind: BucketKind,
    /// When it is launched.
    pub flush: FlushPoint,
    /// Whether it overlaps backward.
    pub overlap: Overlap,
}

/// The parameter all-gather after the optimizer step of a flat-partition engine (stages 1/2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParamAllGather {
    /// One collective, or shards.
    pub mode: ParamGatherMode,
    /// Ranges of each rank's partition gathered by one collective each.
    pub shards: Vec<ElementRange>,
    /// Bytes of the whole flat buffer per collective round (all ranks' slices).
    pub bytes: u64,
}

/// Every bucket of one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Buckets {
    /// Elements per reduction bucket.
    pub bucket_size: u64,
    /// Reduce every micro-step or at the boundary.
    pub timing: ReduceTiming,
    /// Communication dtype.
    pub dtype: Dtype,
    /// Reduction buckets of one reducing micro-step.
    pub reduce: Vec<ReduceBucket>,
    /// The parameter all-gather after the step of a flat-partition engine (stages 1/2, bf16
    /// without ZeRO); `None` for one rank and the other engines.
    pub param_gather: Option<ParamAllGather>,
    /// dsplan's CUDA step at stages 2-3 (`W > 1`): where backward writes each gradient until
    /// its bucket is packed ([`super::grad_arena`]); `None` otherwise (every gradient has its
    /// place in a whole-model buffer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gradient_arena: Option<Stage3Arena>,
}

/// The buckets of one step of an engine that runs as `run` says: the parameter all-gather is
/// planned whenever the engine keeps flat partitions and there is more than one rank (stages
/// 1/2, `BF16_Optimizer` included, which all-gathers its bf16 partitions after the step).
pub fn buckets(
    model: &ModelGraph,
    layout: &Layout,
    settings: &Settings,
    run: &RunPolicy,
) -> Buckets {
    let world = settings.world_size;
    let reduce = if settings.stage == ZeroStage::Disabled {
        fallback_buckets(model, settings)
    } else {
        ipg_buckets(model, settings)
    };
    let param_gather = (run.engine == EngineFamily::FlatPartition && world > 1)
        .then(|| param_gather(layout, settings));
    Buckets {
        bucket_size: settings.reduce_bucket_size,
        timing: settings.reduce_timing,
        dtype: settings.dtypes.communication,
        reduce,
        param_gather,
        gradient_arena: None,
    }
}

/// Tensors with the backward step that makes each ready, in readiness order.
pub fn gradient_order(model: &ModelGraph) -> Vec<(usize, usize)> {
    let units = model.units.len();
    let mut ready_step = vec![0usize; model.tensors.len()];
    for step in units..2 * units {
        let (unit, pass) = trace_step(units, step);
        debug_assert_eq!(pass, Pass::Backward);
        for &t in &model.units[unit].tensors {
            ready_step[t] = step;
        }
    }
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(model.tensors.len());
    for step in units..2 * units {
        let unit = &model.units[trace_step(units, step).0];
        for &t in unit.tensors.iter().rev() {
            if ready_step[t] == step {
                order.push((t, step));
            }
        }
    }
    order
}

fn fallback_buckets(model: &ModelGraph, settings: &Settings) -> Vec<ReduceBucket> {
    let dtype = settings.dtypes.communication;
    let mut buckets = Vec::new();
    let mut current = Vec::new();
    let mut numel = 0u64;
    for (index, tensor) in model.tensors.iter().enumerate() {
        current.push(index);
        numel += tensor.numel;
        let last = index + 1 == model.tensors.len();
        if numel > settings.reduce_bucket_size || last {
            buckets.push(ReduceBucket {
                index: buckets.len(),
                tensors: std::mem::take(&mut current),
                numel,
                bytes: numel * dtype.bytes(),
                collective: Collective::AllReduce,
                kind: BucketKind::Fallback,
                flush: FlushPoint::Epilogue,
                overlap: Overlap::Serialized,
            });
            numel = 0;
        }
    }
    buckets
}

fn ipg_buckets(model: &ModelGraph, settings: &Settings) -> Vec<ReduceBucket> {
    let world = settings.world_size;
    let stage3 = settings.stage == ZeroStage::Weights;
    let collective = match (
        stage3,
        settings.reduce_scatter,
        settings.multi_rank_bucket_allreduce,
    ) {
        (_, false, _) => Collective::AllReduce,
        (true, true, _) => Collective::ReduceScatter,
        (false, true, true) => Collective::AllReduce,
        (false, true, false) => Collective::Reduce,
    };
    let dtype = settings.dtypes.communication;
    let size = settings.reduce_bucket_size;
    // ZeRO-1 without overlap registers no gradient hooks: it reduces after backward.
    let after_backward =
        settings.stage == ZeroStage::OptimizerStates && settings.overlap == Overlap::Serialized;
    let wire = |t: usize| {
        let n = model.tensors[t].numel;
        if stage3 { n.div_ceil(world) * world } else { n }
    };
    let mut buckets: Vec<ReduceBucket> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut numel = 0u64;
    let close = |buckets: &mut Vec<ReduceBucket>, tensors: Vec<usize>, numel: u64, flush| {
        let bytes = tensors.iter().map(|&t| wire(t)).sum::<u64>() * dtype.bytes();
        let kind = if numel > size {
            BucketKind::Oversized
        } else {
            BucketKind::Ipg
        };
        buckets.push(ReduceBucket {
            index: buckets.len(),
            tensors,
            numel,
            bytes,
            collective,
            kind,
            flush,
            overlap: settings.overlap,
        });
    };
    for (tensor, step) in gradient_order(model) {
        let n = model.tensors[tensor].numel;
        if !current.is_empty() && numel + n > size {
            let flush = if after_backward {
                FlushPoint::Epilogue
            } else {
                FlushPoint::BackwardStep { step }
            };
            close(&mut buckets, std::mem::take(&mut current), numel, flush);
            numel = 0;
        }
        current.push(tensor);
        numel += n;
    }
    if !current.is_empty() {
        close(&mut buckets, current, numel, FlushPoint::Epilogue);
    }
    buckets
}

/// DeepSpeed's `all_gather_dp_groups`: one collective, or `allgather_bucket_size` shards of
/// each rank's partition (aligned down to 2 elements, the last taking the rest).
fn param_gather(layout: &Layout, settings: &Settings) -> ParamAllGather {
    let partition = layout.partition_numel;
    let world = settings.world_size;
    let bytes_of = |numel: u64| numel * world * layout.dtype.bytes();
    if settings.param_gather == ParamGatherMode::IntoTensor {
        return ParamAllGather {
            mode: ParamGatherMode::IntoTensor,
            shards: vec![ElementRange {
                start: 0,
                end: partition,
            }],
            bytes: bytes_of(partition),
        };
    }
    let bucket = settings.allgather_bucket_size.max(1);
    let count = (partition * world / bucket).max(1);
    let mut shard = partition / count;
    shard -= shard % NCCL_START_ALIGNMENT;
    let mut shards = Vec::new();
    let mut start = 0;
    for index in 0..count {
        let end = if index + 1 == count {
            partition
        } else {
            start + shard
        };
        shards.push(ElementRange { start, end });
        start = end;
    }
    ParamAllGather {
        mode: ParamGatherMode::Sharded,
        shards,
        bytes: bytes_of(partition),
    }
}
