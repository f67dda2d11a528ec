//! [`EnginePlan`]: the parts of the execution plan (`planner::plan::compile`) the ZeRO engines
//! follow, indexed the way they read them. Nothing here decides a size, a partition or a
//! bucket: every number comes from the [`Plan`]; this module only translates the plan's
//! tensor indices into spans of the executor's flat buffer and checks, once at the start of a
//! run, that the plan describes the model the executor trains ([`PlanMismatch`] otherwise).
//!
//! What the engines take from the plan:
//!
//! | plan field | used for |
//! |---|---|
//! | `layout.entries` (order, `offset`, `partition_numel`), `numel`, `padded_numel`, `partition_numel` | the flat buffer and its padding (stages 0-2), each tensor's slice (stage 3) |
//! | `Shards::owned_ranges` with `shards.parameters` / `optimizer_states` | what each rank owns: its stage 1/2 partition, its stage 3 slice of every tensor |
//! | `shards.persistent` | the stage 3 tensors every rank keeps whole |
//! | `buckets.reduce` (`tensors`, their order, `collective`) | which gradients are reduced together, when each bucket is complete, and how it is reduced |
//! | `run` (`engine_stage`, `engine`, `clip`, `averaging`) | which stage's engine runs, the gradient norm and clip rule, where the average divides by the world size |
//! | `buckets.param_gather.shards` | the pieces of the flat-partition parameter all-gather after the step (a plan without them for a flat partition over several ranks is a [`PlanMismatch`]) |
//! | the model graph's fetch units, `stage3.collective` | which tensors one fetch of a model unit gathers, and with which collective |
//! | `settings.dtypes` | parameter, accumulation and communication dtypes |
//!
//! What they deliberately do not follow (the CPU model runs one thread per rank and computes
//! a whole unit at a time, see [`crate::model::ParamUnit`]):
//!
//! * the stage 3 `prefetch`, `kept` (reuse distance) and `max_live_parameters` decisions: on
//!   a CPU there is no second stream to overlap a prefetch with, so every fetch is on demand
//!   and every unit is released after its use (DeepSpeed without prefetching and reuse);
//! * the plan's modules are finer than the model's units: one fetch of a block gathers the
//!   tensors of all the block's modules (the plan's units, in the plan's order);
//! * `FlushPoint` and `Overlap`: a bucket is reduced as soon as its last gradient arrives, on
//!   the rank's own thread;
//! * `shards.sub_groups`: without NVMe offload the optimizer steps the whole owned partition
//!   at once (Adam is element-wise, so the values are the same as group by group); with
//!   optimizer offload to NVMe it steps them one by one, as the plan cuts them ([`NvmeLayout`]);
//! * offload to the CPU (`settings.offload_*` = `cpu`): the CPU backend holds everything in
//!   host memory already, so nothing moves. Offload to NVMe (stage 3) is followed: the master
//!   weights and Adam states live in files, swapped through `buffer_count` buffers sub-group by
//!   sub-group, and the parameter slices the plan puts on NVMe (`offload.nvme_resident`, past
//!   `max_in_cpu`) are read from a file through the `buffer_count × buffer_size` parameter swap
//!   buffers before each gather (see `swap/`). The copies between GPU and host, the pinning,
//!   `pipeline_read`/`pipeline_write`, partial offload (`ratio` < 1, refused) and the swapping of
//!   fp32 gradients to NVMe are not;
//! * `Collective::Reduce` (DeepSpeed's reduce to each destination rank) runs as an all-reduce
//!   of which each rank keeps its own slice: the same values, more traffic.

use std::fmt;
use std::ops::Range;

use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::buckets::ParamAllGather;
use dsplan_planner::plan::layout::LayoutScheme;
use dsplan_planner::plan::settings::OffloadTarget;
use dsplan_planner::plan::shards::{ShardRule, Shards};
use dsplan_planner::plan::stage3::FetchCollective;
use dsplan_planner::plan::{
    ClipRule, Collective, Device, EngineFamily, GradientAveraging, ModelGraph, Plan,
};

use super::precision::Dtype;
use super::scaling::GradScaling;
use crate::model::{ParamTable, ParamUnit};
use crate::tensor::Span;

/// Why a plan cannot drive this run: it describes another model, world or layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMismatch {
    /// What differs.
    pub message: String,
}

impl PlanMismatch {
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for PlanMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the plan does not fit the run: {}", self.message)
    }
}

impl std::error::Error for PlanMismatch {}

/// One of the model's units: where it lives and which tensors one fetch gathers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEntry {
    /// The unit.
    pub unit: ParamUnit,
    /// Its span of the flat buffer.
    pub span: Span,
    /// Its tensors (indices into [`EnginePlan::tensors`]).
    pub tensors: Range<usize>,
    /// Stage 3: the plan's fetch units that make up this unit, their non-persistent tensors in
    /// buffer order (what one fetch all-gathers).
    pub fetch: Vec<usize>,
}

/// The stage 0-2 flat buffer: its real and padded lengths and the partition per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatPartition {
    /// Elements of real data.
    pub numel: usize,
    /// Elements after the plan's padding (stages 1/2: a multiple of `2 * world`).
    pub padded: usize,
    /// Elements per rank.
    pub partition: usize,
}

impl FlatPartition {
    /// The flat range rank `rank` owns (padding included).
    pub fn range(&self, rank: usize) -> Range<usize> {
        rank * self.partition..(rank + 1) * self.partition
    }
}

/// Stage 3: every rank's slice of every tensor, as the plan lays them out.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParamShards {
    chunk: Vec<usize>,
    offset: Vec<usize>,
    len: usize,
    /// `pieces[rank][tensor]`: the elements of the tensor (within it) the rank owns.
    pieces: Vec<Vec<Range<usize>>>,
}

impl ParamShards {
    /// Elements of one rank's shard (the same on every rank).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the shard is empty (below stage 3).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements of tensor `t` each rank holds (its slice, padding included).
    pub fn chunk(&self, t: usize) -> usize {
        self.chunk[t]
    }

    /// Where tensor `t`'s slice starts in a shard.
    pub fn offset(&self, t: usize) -> usize {
        self.offset[t]
    }

    /// The elements of tensor `t` (indices within the tensor) that `rank` owns; the rest of
    /// its slice is padding.
    pub fn piece(&self, t: usize, rank: usize) -> Range<usize> {
        self.pieces[rank][t].clone()
    }
}

/// One gradient bucket of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Its tensors, in the order their gradients become ready.
    pub tensors: Vec<usize>,
    /// The collective that reduces it.
    pub collective: Collective,
    /// Where each tensor's gradient sits in the bucket (stage 2 layout: back to back).
    pub offsets: Vec<usize>,
    /// Elements of all its tensors.
    pub numel: usize,
    /// Where each tensor's slice sits in one rank's part of the stage 3 layout.
    pub shard_offsets: Vec<usize>,
    /// Elements of one rank's part in the stage 3 layout (the sum of its tensors' slices).
    pub shard_numel: usize,
    /// Its tensors' range of the flat buffer, when they are contiguous (stages 0/1 reduce it
    /// in place).
    pub flat_range: Option<Range<usize>>,
}

/// Stage 3 offload to NVMe as the plan decides it (nothing below stage 3: the planner treats
/// `nvme` as `cpu` there).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NvmeLayout {
    /// Optimizer offload to NVMe (`offload_optimizer.device: "nvme"`).
    pub optimizer: Option<OptimizerNvme>,
    /// Parameter offload to NVMe (`offload_param.device: "nvme"`).
    pub params: Option<ParamNvme>,
}

/// Where the fp32 master weights and Adam states are swapped, and in which pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerNvme {
    /// `offload_optimizer.nvme_path`.
    pub path: String,
    /// `offload_optimizer.buffer_count`: swap buffers, each of the largest sub-group.
    pub buffer_count: usize,
    /// The plan's sub-groups (`shards.sub_groups`), as ranges of a rank's shard, in order.
    pub sub_groups: Vec<Range<usize>>,
    /// Whether each sub-group lives on NVMe (`false`: partial offload keeps it elsewhere).
    pub on_nvme: Vec<bool>,
}

/// Which parameter slices live in a file, and the swap buffers that read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamNvme {
    /// `offload_param.nvme_path`.
    pub path: String,
    /// `offload_param.buffer_count`.
    pub buffer_count: usize,
    /// `offload_param.buffer_size` (elements per swap buffer).
    pub buffer_size: usize,
    /// Per tensor: whether its slice lives on NVMe (`offload.nvme_resident`: the partitions
    /// past `max_in_cpu`, persistent tensors never).
    pub resident: Vec<bool>,
}

/// The plan as the engines read it; see the [module documentation](self).
#[derive(Debug, Clone, PartialEq)]
pub struct EnginePlan {
    stage: ZeroStage,
    engine: EngineFamily,
    clip: ClipRule,
    scaling: GradScaling,
    world: usize,
    dtypes: PlanDtypes,
    tensors: Vec<Span>,
    units: Vec<UnitEntry>,
    flat: FlatPartition,
    owned: Vec<Range<usize>>,
    shards: ParamShards,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    persistent: Vec<bool>,
    param_gather: Vec<Range<usize>>,
    fetch_collective: FetchCollective,
    nvme: NvmeLayout,
}

/// The element types the plan decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanDtypes {
    /// Parameters and the gradients backward produces.
    pub model: Dtype,
    /// Gradient accumulation and the gradient partition.
    pub accum: Dtype,
    /// Gradient reductions.
    pub comm: Dtype,
}

/// The executor's floating dtype for a plan dtype; the plan's integer dtypes (token ids, flags)
/// never describe parameters, gradients or reductions, so meeting one is a mismatch.
fn dtype(d: dsplan_planner::plan::Dtype) -> Result<Dtype, PlanMismatch> {
    use dsplan_planner::plan::Dtype as PlanDtype;
    match d {
        PlanDtype::Fp32 => Ok(Dtype::F32),
        PlanDtype::Bf16 => Ok(Dtype::Bf16),
        PlanDtype::Fp16 => Ok(Dtype::F16),
        PlanDtype::Int64
        | PlanDtype::Uint8
        | PlanDtype::Fp64
        | PlanDtype::Int32
        | PlanDtype::Uint32 => Err(PlanMismatch::new(format!(
            "the plan gives the integer dtype {d:?} to parameters, gradients or reductions"
        ))),
    }
}

fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

impl EnginePlan {
    /// Reads `plan` for a model laid out as `layout`. `Err` when the plan describes other
    /// tensors, or a buffer order the executor does not lay out.
    pub fn from_plan(
        plan: &Plan,
        layout: &(impl ParamTable + ?Sized),
    ) -> Result<Self, PlanMismatch> {
        let world = to_usize(plan.settings.world_size).max(1);
        // The plan's engine.
        let stage = plan.run.engine_stage;
        let tensors = check_tensors(plan, layout)?;
        let flat = FlatPartition {
            numel: to_usize(plan.layout.numel),
            padded: to_usize(plan.layout.padded_numel),
            partition: to_usize(plan.layout.partition_numel),
        };
        let persistent = persistent(plan, tensors.len());
        let units = units(&plan.model_graph, layout, &tensors, &persistent)?;
        let shards = match plan.layout.scheme {
            LayoutScheme::PerParameter => param_shards(plan, &tensors, world),
            LayoutScheme::Flat => ParamShards::default(),
        };
        let owned = match plan.shards.optimizer_states {
            ShardRule::FlatEqual { .. } => {
                (0..world).map(|rank| flat.range(rank)).collect::<Vec<_>>()
            }
            _ => vec![0..flat.partition; world],
        };
        let (buckets, bucket_of) = buckets(plan, &tensors, &shards)?;
        let param_gather = param_gather(plan, &flat, world)?;
        let fetch_collective = plan
            .stage3
            .as_ref()
            .map_or(FetchCollective::AllGather, |s| s.collective);
        let nvme = nvme_layout(plan, &shards, tensors.len());
        let d = plan.settings.dtypes;
        Ok(Self {
            stage,
            engine: plan.run.engine,
            clip: plan.run.clip,
            scaling: match plan.run.averaging {
                GradientAveraging::PreDivide => GradScaling::PreDivide,
                GradientAveraging::PostMultiply { predivide_factor } => GradScaling::PostMultiply {
                    factor: predivide_factor as f32,
                },
            },
            world,
            dtypes: PlanDtypes {
                model: dtype(d.params)?,
                accum: dtype(d.grad_accum)?,
                comm: dtype(d.communication)?,
            },
            tensors,
            units,
            flat,
            owned,
            shards,
            buckets,
            bucket_of,
            persistent,
            param_gather,
            fetch_collective,
            nvme,
        })
    }

    /// Stage 3 offload to NVMe (empty when nothing is offloaded there).
    pub fn nvme(&self) -> &NvmeLayout {
        &self.nvme
    }

    /// The ZeRO stage whose engine runs (the plan's `run.engine_stage`, the config's).
    pub fn stage(&self) -> ZeroStage {
        self.stage
    }

    /// What each rank holds (the plan's `run.engine`).
    pub fn engine(&self) -> EngineFamily {
        self.engine
    }

    /// How the gradient norm and the clip factor are computed (the plan's `run.clip`).
    pub fn clip_rule(&self) -> ClipRule {
        self.clip
    }

    /// Where the gradient average divides by the world size (the plan's `run.averaging`).
    pub fn grad_scaling(&self) -> GradScaling {
        self.scaling
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The element types.
    pub fn dtypes(&self) -> PlanDtypes {
        self.dtypes
    }

    /// Every parameter tensor's span, in buffer order.
    pub fn tensors(&self) -> &[Span] {
        &self.tensors
    }

    /// The model's units, in buffer order.
    pub fn units(&self) -> &[UnitEntry] {
        &self.units
    }

    /// The position of `unit` in [`EnginePlan::units`] (a block that does not exist maps past
    /// the blocks).
    pub fn unit_index(&self, unit: ParamUnit) -> usize {
        match unit {
            ParamUnit::Embedding => 0,
            ParamUnit::Block(l) => (l + 1).min(self.units.len()),
            ParamUnit::FinalNorm => self.units.len().saturating_sub(1),
        }
    }

    /// The stage 0-2 flat buffer.
    pub fn flat(&self) -> &FlatPartition {
        &self.flat
    }

    /// Where rank `rank`'s optimizer partition lies: its flat range (stages 1/2, padding
    /// included), or the whole of what it holds (stage 0: the flat buffer; stage 3: its
    /// shard).
    pub fn owned(&self, rank: usize) -> Range<usize> {
        self.owned[rank].clone()
    }

    /// The stage 3 shards.
    pub fn shards(&self) -> &ParamShards {
        &self.shards
    }

    /// The gradient buckets, in reduction order.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket of tensor `t`.
    pub fn bucket_of(&self, t: usize) -> usize {
        self.bucket_of[t]
    }

    /// `tensors` in the order their gradients fill the buckets: by bucket, then by place in
    /// it. A rank's one bucket buffer then holds one bucket at a time, also for a model whose
    /// flat order is not the reverse of its gradients' (a Llama layer's norms come after its
    /// projections in the flat order, and are reduced between them).
    pub fn in_reduction_order(&self, tensors: impl Iterator<Item = usize>) -> Vec<usize> {
        let place = |t: usize| {
            let b = self.bucket_of[t];
            let j = self
                .buckets
                .get(b)
                .and_then(|bucket| bucket.tensors.iter().position(|&x| x == t));
            (b, j)
        };
        let mut ordered: Vec<usize> = tensors.collect();
        ordered.sort_by_key(|&t| place(t));
        ordered
    }

    /// Whether tensor `t` stays gathered under stage 3.
    pub fn is_persistent(&self, t: usize) -> bool {
        self.persistent[t]
    }

    /// The persistent tensors, in order.
    pub fn persistent_tensors(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.tensors.len()).filter(|&t| self.persistent[t])
    }

    /// Elements of all persistent tensors.
    pub fn persistent_numel(&self) -> usize {
        self.persistent_tensors().map(|t| self.tensors[t].len).sum()
    }

    /// The pieces of each rank's partition the stage 1/2 parameter all-gather moves, one
    /// collective each (empty: nothing to gather, one rank).
    pub fn param_gather(&self) -> &[Range<usize>] {
        &self.param_gather
    }

    /// The stage 3 fetch collective.
    pub fn fetch_collective(&self) -> FetchCollective {
        self.fetch_collective
    }

    /// The pieces of tensors inside `rank`'s flat partition: `(tensor, flat range)`, padding
    /// left out. The stage 1/2 gradient norm is summed over these.
    pub fn flat_pieces(&self, rank: usize) -> Vec<(usize, Range<usize>)> {
        let owned = self.flat.range(rank);
        self.tensors
            .iter()
            .enumerate()
            .filter_map(|(t, span)| {
                let start = span.offset.max(owned.start);
                let end = span.end().min(owned.end);
                (start < end).then_some((t, start..end))
            })
            .collect()
    }

    /// The largest bucket's elements.
    pub fn max_bucket_numel(&self) -> usize {
        self.buckets.iter().map(|b| b.numel).max().unwrap_or(0)
    }

    /// The largest bucket's per-rank part in the stage 3 layout.
    pub fn max_bucket_shard_numel(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.shard_numel)
            .max()
            .unwrap_or(0)
    }
}

/// The pieces of each rank's flat partition the parameter all-gather moves, as the plan cuts
/// them. A flat-partition engine over several ranks must have them: the executor does not make
/// up a gather the plan left out.
fn param_gather(
    plan: &Plan,
    flat: &FlatPartition,
    world: usize,
) -> Result<Vec<Range<usize>>, PlanMismatch> {
    let pieces: Vec<Range<usize>> = plan
        .buckets
        .param_gather
        .as_ref()
        .map(|gather: &ParamAllGather| {
            gather
                .shards
                .iter()
                .map(|r| to_usize(r.start)..to_usize(r.end))
                .collect()
        })
        .unwrap_or_default();
    if let Some(piece) = pieces
        .iter()
        .find(|p| p.start > p.end || p.end > flat.partition)
    {
        return Err(PlanMismatch::new(format!(
            "its parameter all-gather moves elements {}..{} of a partition of {}",
            piece.start, piece.end, flat.partition
        )));
    }
    if plan.run.engine == EngineFamily::FlatPartition && world > 1 && pieces.is_empty() {
        return Err(PlanMismatch::new(
            "it partitions the flat buffer over several ranks but plans no parameter all-gather after the step (buckets.param_gather)",
        ));
    }
    Ok(pieces)
}

/// The executor's spans of the plan's tensors, after checking names, sizes and order.
fn check_tensors(
    plan: &Plan,
    layout: &(impl ParamTable + ?Sized),
) -> Result<Vec<Span>, PlanMismatch> {
    let entries = layout.tensors().entries();
    if plan.layout.entries.len() != entries.len() {
        return Err(PlanMismatch::new(format!(
            "it lists {} parameter tensors, the model has {}",
            plan.layout.entries.len(),
            entries.len()
        )));
    }
    let flat = plan.layout.scheme == LayoutScheme::Flat;
    for (position, (planned, ours)) in plan.layout.entries.iter().zip(entries).enumerate() {
        if planned.tensor != position {
            return Err(PlanMismatch::new(format!(
                "it orders the flat buffer differently from the model (`{}` at position {position}); round_robin_gradients is not implemented by dsplan's executor",
                planned.name
            )));
        }
        if planned.name != ours.name || to_usize(planned.numel) != ours.span.len {
            return Err(PlanMismatch::new(format!(
                "tensor {position} is `{}` with {} elements in the plan, `{}` with {} in the model",
                planned.name, planned.numel, ours.name, ours.span.len
            )));
        }
        if flat && to_usize(planned.offset) != ours.span.offset {
            return Err(PlanMismatch::new(format!(
                "`{}` starts at {} in the plan's flat buffer, at {} in the model's",
                planned.name, planned.offset, ours.span.offset
            )));
        }
    }
    Ok(entries.iter().map(|e| e.span).collect())
}

fn persistent(plan: &Plan, count: usize) -> Vec<bool> {
    let mut persistent = vec![false; count];
    if let Some(set) = &plan.shards.persistent {
        for &entry in &set.entries {
            if let Some(tensor) = plan.layout.entries.get(entry).map(|e| e.tensor)
                && tensor < count
            {
                persistent[tensor] = true;
            }
        }
    }
    persistent
}

/// The model's units, each with the plan's fetch units that fall inside it.
fn units(
    graph: &ModelGraph,
    layout: &(impl ParamTable + ?Sized),
    tensors: &[Span],
    persistent: &[bool],
) -> Result<Vec<UnitEntry>, PlanMismatch> {
    let mut units: Vec<UnitEntry> = layout
        .units()
        .into_iter()
        .map(|unit| {
            let span = layout.unit_span(unit);
            let first = tensors.partition_point(|t| t.offset < span.offset);
            let last = tensors.partition_point(|t| t.offset < span.end());
            UnitEntry {
                unit,
                span,
                tensors: first..last,
                fetch: Vec::new(),
            }
        })
        .collect();
    for planned in &graph.units {
        let Some(&first) = planned.tensors.first() else {
            continue;
        };
        let Some(unit) = units.iter_mut().find(|u| u.tensors.contains(&first)) else {
            return Err(PlanMismatch::new(format!(
                "its fetch unit `{}` uses a tensor the model does not have",
                planned.module
            )));
        };
        if let Some(&outside) = planned.tensors.iter().find(|t| !unit.tensors.contains(t)) {
            return Err(PlanMismatch::new(format!(
                "its fetch unit `{}` spans two of the model's units (tensor {outside})",
                planned.module
            )));
        }
        for &t in &planned.tensors {
            if !persistent[t] && !unit.fetch.contains(&t) {
                unit.fetch.push(t);
            }
        }
    }
    // Gathered tensor by tensor in buffer order, so that each one's padding spills only over
    // a tensor gathered after it (see `stage3.rs`).
    for unit in &mut units {
        unit.fetch.sort_unstable();
    }
    Ok(units)
}

/// Stage 3's slices from the plan's layout and ownership rule.
fn param_shards(plan: &Plan, tensors: &[Span], world: usize) -> ParamShards {
    let chunk: Vec<usize> = plan
        .layout
        .entries
        .iter()
        .map(|e| to_usize(e.partition_numel))
        .collect();
    let offset: Vec<usize> = plan
        .layout
        .entries
        .iter()
        .map(|e| to_usize(e.offset))
        .collect();
    let pieces = (0..world)
        .map(|rank| {
            let owned = Shards::owned_ranges(
                &plan.layout,
                plan.shards.parameters,
                plan.settings.world_size,
                rank as u64,
            );
            // Owned ranges are in model element space, which is the executor's flat buffer.
            tensors
                .iter()
                .map(|span| {
                    owned
                        .iter()
                        .map(|r| to_usize(r.start)..to_usize(r.end))
                        .find(|r| r.start >= span.offset && r.end <= span.end())
                        .map_or(span.len..span.len, |r| {
                            r.start - span.offset..r.end - span.offset
                        })
                })
                .collect()
        })
        .collect();
    ParamShards {
        chunk,
        offset,
        len: to_usize(plan.layout.partition_numel),
        pieces,
    }
}

/// The plan's NVMe offload, in shard coordinates (stage 3 only; the planner has already turned
/// `nvme` below stage 3 into `cpu`).
fn nvme_layout(plan: &Plan, shards: &ParamShards, tensors: usize) -> NvmeLayout {
    if shards.is_empty() {
        return NvmeLayout::default();
    }
    let start_of = |entry: usize| {
        if entry < tensors {
            shards.offset(entry)
        } else {
            shards.len()
        }
    };
    let optimizer = match &plan.settings.offload_optimizer {
        OffloadTarget::Nvme {
            path, buffer_count, ..
        } => Some(OptimizerNvme {
            path: path.clone(),
            buffer_count: to_usize(*buffer_count),
            sub_groups: plan
                .shards
                .sub_groups
                .iter()
                .map(|g| start_of(g.first_entry)..start_of(g.end_entry))
                .collect(),
            on_nvme: plan
                .shards
                .sub_groups
                .iter()
                .map(|g| g.device == Device::Nvme)
                .collect(),
        }),
        _ => None,
    };
    let params = match &plan.settings.offload_param {
        OffloadTarget::Nvme {
            path,
            buffer_count,
            buffer_size,
            ..
        } => Some(ParamNvme {
            path: path.clone(),
            buffer_count: to_usize(*buffer_count),
            buffer_size: to_usize(*buffer_size),
            resident: (0..tensors)
                .map(|t| plan.offload.nvme_resident.get(t).copied().unwrap_or(false))
                .collect(),
        }),
        _ => None,
    };
    NvmeLayout { optimizer, params }
}

type BucketTable = (Vec<Bucket>, Vec<usize>);

/// The plan's reduction buckets, with the offsets the engines copy gradients to.
fn buckets(
    plan: &Plan,
    tensors: &[Span],
    shards: &ParamShards,
) -> Result<BucketTable, PlanMismatch> {
    let mut bucket_of = vec![usize::MAX; tensors.len()];
    let mut list = Vec::with_capacity(plan.buckets.reduce.len());
    for (index, planned) in plan.buckets.reduce.iter().enumerate() {
        let mut bucket = Bucket {
            tensors: Vec::with_capacity(planned.tensors.len()),
            collective: planned.collective,
            offsets: Vec::new(),
            numel: 0,
            shard_offsets: Vec::new(),
            shard_numel: 0,
            flat_range: None,
        };
        for &t in &planned.tensors {
            let Some(span) = tensors.get(t) else {
                return Err(PlanMismatch::new(format!(
                    "bucket {index} names tensor {t}, which the model does not have"
                )));
            };
            if bucket_of[t] != usize::MAX {
                return Err(PlanMismatch::new(format!(
                    "tensor {t} is in two gradient buckets"
                )));
            }
            bucket_of[t] = index;
            bucket.tensors.push(t);
            bucket.offsets.push(bucket.numel);
            bucket.numel += span.len;
            if !shards.is_empty() {
                bucket.shard_offsets.push(bucket.shard_numel);
                bucket.shard_numel += shards.chunk(t);
            }
        }
        let start = bucket.tensors.iter().map(|&t| tensors[t].offset).min();
        let end = bucket.tensors.iter().map(|&t| tensors[t].end()).max();
        if let (Some(start), Some(end)) = (start, end)
            && end - start == bucket.numel
        {
            bucket.flat_range = Some(start..end);
        }
        list.push(bucket);
    }
    if let Some(t) = bucket_of.iter().position(|&b| b == usize::MAX) {
        return Err(PlanMismatch::new(format!(
            "tensor {t} is in no gradient bucket"
        )));
    }
    Ok((list, bucket_of))
}
