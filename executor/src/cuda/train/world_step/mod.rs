//! The step of one rank among `W > 1` ([`world_program`]): the one-GPU compute ops of the
//! model's family ([`DeviceLayout::passes`], its recipe in `super::family`), cut into the
//! plan's units, with the plan's collectives between them as [`CommOp`]s. Nothing here
//! knows the family: a compute op is placed by the parameters it reads and the gradients it
//! writes, the rank's buffers by its [`RankShares`].
//!
//! Every decision is the plan's:
//! - **gradient buckets** (`buckets.reduce`): each bucket is reduced where the plan flushes it
//!   (after the backward of its trace step, or in the backward epilogue), in every micro-step
//!   or at the boundary only (`buckets.timing`), with the plan's collective, on the
//!   communication stream when the plan overlaps reduction with backward (else on the compute
//!   stream). Stages 0-2 average in place over the bucket's range of the flat gradients, so
//!   gradients accumulated over micro-steps stay averaged (a bucket whose tensors are not back
//!   to back there is packed into the bucket staging, averaged and copied back); stage 3 packs each tensor's `W`
//!   slices rank by rank and reduce-scatters into the rank's gradient partition;
//! - **stage 3 fetches** (`stage3.steps`): before a unit's compute, its on-demand tensors,
//!   then its prefetch batch, each one all-gather of the packed slices on the communication
//!   stream into the tensors' places in the parameter arena for that trace step
//!   (`stage3.arena`); the compute reads each parameter at its place for the step it runs in
//!   and waits for the event of every gather that wrote a tensor it reads; after the unit,
//!   the releases of the places that end there (the schedule's, but for a tensor the device
//!   reads later in a fused op), then an event on the compute stream that a later gather
//!   into a released place waits for (a place held by a later step's tensor waits for the
//!   micro-step's start); the persistent tensors gathered again after the optimizer step;
//! - **stages 1-2 parameter all-gather** (`buckets.param_gather`): after the optimizer step,
//!   on the communication stream, one collective per piece; the next step's forward waits
//!   for it;
//! - the gradient norm and the overflow flag are summed (maxed) over the ranks' partitions
//!   (stages 1-3), two scalar all-reduces the plan's op graph does not list.
//!
//! A compute op belongs to the unit of the parameters it reads or the gradients it writes
//! (a tied embedding: the embedding going forward, the LM head coming back); ops without
//! parameters stay in the unit before them. A [`Marker`] follows each unit's compute and the
//! optimizer step, so a collective's position (markers before it) is in the plan's op graph
//! coordinates.

use std::collections::BTreeMap;

use crate::comm::ReduceOp;
use dsplan_planner::config::ZeroStage;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::buckets::{FlushPoint, ReduceBucket};
use dsplan_planner::plan::cuda_world::CudaScheme;
use dsplan_planner::plan::settings::{Overlap, ReduceTiming};
use dsplan_planner::plan::stage3::trace_step;
use dsplan_planner::plan::stage3_arena::{ArenaSpan, Stage3Arena};
use dsplan_planner::plan::{Collective, Plan};

use super::layout::DeviceLayout;
use super::program::{
    Access, CommAction, CommOp, CommStream, CopyPiece, EventId, Marker, Op, Purpose, ShapeError,
};
use super::region::{Region, RegionSizes, TensorRef, to_usize};
use super::shares::RankShares;
use super::step::StepProgram;
use crate::tensor::Span;

mod gradients;

/// The pass of a compute op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Forward,
    Backward,
}

/// The step of rank `layout`'s `shares.rank` of `plan` (see the [module
/// documentation](self)). `layout` holds the rank's shares of the same plan.
pub fn world_program(layout: &DeviceLayout, plan: &Plan) -> Result<StepProgram, ShapeError> {
    let mut builder = Builder::new(layout, plan)?;
    let params_ready = builder.event();
    // With a gradient arena, each place is zeroed before its first write of a micro-step;
    // the partition the buckets accumulate into is zeroed here.
    let mut start = vec![Op::Zero {
        tensor: match builder.grad_arena {
            Some(_) => builder.rank.owned(Region::Grads),
            None => layout.whole_region(Region::Grads),
        },
    }];
    if layout.rank_shares().shares.world > 1 {
        start.push(sync(CommStream::Compute, vec![params_ready], None));
    }
    let micro_step = builder.micro_step(plan.buckets.timing == ReduceTiming::EveryMicroStep)?;
    let boundary_micro_step = builder.micro_step(true)?;
    let norm = builder.norm();
    let update = builder.update();
    let after_update = builder.after_update(params_ready)?;
    Ok(StepProgram {
        start,
        micro_step,
        boundary_micro_step,
        norm,
        update,
        after_update,
        offload: None,
    })
}

fn sync(stream: CommStream, waits: Vec<EventId>, record: Option<EventId>) -> Op {
    Op::Collective(CommOp::with_events(stream, waits, record, CommAction::Sync))
}

fn on(stream: CommStream, action: CommAction) -> Op {
    Op::Collective(CommOp::on(stream, action))
}

fn slice(region: Region, offset: usize, len: usize) -> TensorRef {
    TensorRef {
        region,
        span: Span::new(offset, len),
    }
}

struct Builder<'a> {
    layout: &'a DeviceLayout,
    /// The rank's shares (the layout's).
    rank: RankShares<'a>,
    plan: &'a Plan,
    /// Model tensor → the executor's span of it in the flat buffers.
    spans: Vec<Span>,
    /// Model tensor → its slice in the stage-3 shard (offset from the shard's start).
    shard: Vec<Span>,
    /// Model tensor → its name (for errors).
    names: Vec<String>,
    /// Stage 3: the plan's parameter arena.
    arena: Option<&'a Stage3Arena>,
    /// Stages 2-3: the plan's gradient arena (backward writes each gradient at its place).
    grad_arena: Option<&'a Stage3Arena>,
    /// Model tensor → the index of its gradient bucket.
    bucket_of: Vec<Option<usize>>,
    /// Stages 2-3: the tensors whose gradient place this micro-step has zeroed.
    zeroed: Vec<bool>,
    /// Stages 2-3: bucket → the event recorded once its gradients are packed out of the
    /// arena (this micro-step).
    packed: BTreeMap<usize, EventId>,
    /// Elements of the flat parameters the compute ops are built over.
    flat_len: usize,
    /// Stage 3: trace step → the event recorded on the compute stream after its releases.
    released: BTreeMap<usize, EventId>,
    /// Stage 3: the event recorded on the compute stream as the micro-step starts.
    entered: Option<EventId>,
    /// `(start, end, model tensor)` of the flat buffers, by start.
    by_offset: Vec<(usize, usize, usize)>,
    /// Model tensor → trace steps whose unit holds it, ascending.
    steps_of: Vec<Vec<usize>>,
    /// Trace steps (twice the units).
    steps: usize,
    world: usize,
    events: usize,
    ops: Vec<Op>,
    started: Option<usize>,
    pending: BTreeMap<usize, EventId>,
    reduce_events: Vec<EventId>,
    reduces: bool,
}

/// A tensor's flat span and index: `(start, end, tensor)`.
type FlatTensor = (usize, usize, usize);

impl<'a> Builder<'a> {
    fn new(layout: &'a DeviceLayout, plan: &'a Plan) -> Result<Self, ShapeError> {
        let graph = &plan.model_graph;
        let rank = layout.rank_shares();
        let entries = rank.table.entries();
        let mut spans = Vec::with_capacity(graph.tensors.len());
        let mut shard = Vec::with_capacity(graph.tensors.len());
        for tensor in &graph.tensors {
            let index = entries
                .iter()
                .position(|e| e.name == tensor.name)
                .ok_or_else(|| {
                    ShapeError(format!(
                        "the plan's tensor `{}` is not a parameter of the device model",
                        tensor.name
                    ))
                })?;
            spans.push(entries[index].span);
            shard.push(
                rank.shard_spans
                    .get(index)
                    .copied()
                    .unwrap_or(Span::new(0, 0)),
            );
        }
        if matches!(
            rank.shares.scheme,
            CudaScheme::FlatPartition | CudaScheme::PartitionedGradients
        ) {
            for entry in &plan.layout.entries {
                let ours = spans.get(entry.tensor).map(|s| s.offset as u64);
                if ours != Some(entry.offset) {
                    return Err(ShapeError(format!(
                        "`{}` sits at {ours:?} in the device's flat buffer, at {} in the plan's",
                        entry.name, entry.offset
                    )));
                }
            }
        }
        let arena = match rank.shares.scheme {
            CudaScheme::Sharded => Some(stage3_arena(&rank, plan, &spans)?),
            CudaScheme::Replicated
            | CudaScheme::FlatPartition
            | CudaScheme::PartitionedGradients => None,
        };
        let grad_arena = gradients::arena(&rank, plan)?;
        let mut bucket_of = vec![None; graph.tensors.len()];
        for bucket in &plan.buckets.reduce {
            for &t in &bucket.tensors {
                if let Some(slot) = bucket_of.get_mut(t) {
                    *slot = Some(bucket.index);
                }
            }
        }
        let flat_len = spans.iter().map(|s| s.end()).max().unwrap_or(0);
        let mut by_offset: Vec<(usize, usize, usize)> = spans
            .iter()
            .enumerate()
            .map(|(t, s)| (s.offset, s.end(), t))
            .collect();
        by_offset.sort_unstable();
        let units = graph.units.len();
        let mut steps_of = vec![Vec::new(); graph.tensors.len()];
        for step in 0..2 * units {
            for &t in &graph.units[trace_step(units, step).0].tensors {
                if let Some(list) = steps_of.get_mut(t) {
                    list.push(step);
                }
            }
        }
        Ok(Self {
            layout,
            rank,
            plan,
            spans,
            shard,
            names: graph.tensors.iter().map(|t| t.name.clone()).collect(),
            arena,
            grad_arena,
            bucket_of,
            zeroed: vec![false; graph.tensors.len()],
            packed: BTreeMap::new(),
            flat_len,
            released: BTreeMap::new(),
            entered: None,
            by_offset,
            steps_of,
            steps: 2 * units,
            world: rank.shares.world.max(1) as usize,
            events: 0,
            ops: Vec::new(),
            started: None,
            pending: BTreeMap::new(),
            reduce_events: Vec::new(),
            reduces: false,
        })
    }

    fn event(&mut self) -> EventId {
        self.events += 1;
        EventId(self.events - 1)
    }

    fn sharded(&self) -> bool {
        self.rank.shares.scheme == CudaScheme::Sharded
    }

    /// Model tensors a compute op (as built, over the flat parameters) reads (parameters)
    /// or writes (gradients) in the flat buffers.
    fn touched(&self, op: &Op) -> Vec<usize> {
        self.tensors_of(op, |region, access| match (region, access) {
            (Region::Params, _) | (Region::Grads, Access::Write) => Some(self.flat_len),
            _ => None,
        })
    }

    /// Model tensors whose gradients a compute op writes.
    fn written(&self, op: &Op) -> Vec<usize> {
        self.tensors_of(op, |region, access| {
            (region == Region::Grads && access == Access::Write).then_some(self.flat_len)
        })
    }

    /// Model tensors under `op`'s accesses that `flat` keeps, each kept access giving the
    /// length of the flat buffer it addresses.
    fn tensors_of(&self, op: &Op, flat: impl Fn(Region, Access) -> Option<usize>) -> Vec<usize> {
        let mut found = Vec::new();
        for (tensor, access) in op.tensors() {
            let Some(flat) = flat(tensor.region, access) else {
                continue;
            };
            let (a, b) = (tensor.span.offset, tensor.span.end().min(flat));
            for &(start, end, t) in &self.by_offset {
                if start < b && a < end && !found.contains(&t) {
                    found.push(t);
                }
            }
        }
        found
    }

    /// The trace step `op` computes in.
    fn target(&self, op: &Op, pass: Pass) -> Option<usize> {
        let units = self.steps / 2;
        let range = match pass {
            Pass::Forward => 0..units,
            Pass::Backward => units..self.steps,
        };
        let low = self.started.unwrap_or(0).max(range.start);
        let step = |&t: &usize| {
            self.steps_of[t]
                .iter()
                .copied()
                .find(|&s| s >= low && range.contains(&s))
        };
        // A backward op that writes several tensors' gradients (the q, k and v biases) runs at
        // the first of their steps, so no bucket is reduced before the op has written its part.
        let written = self.written(op);
        if pass == Pass::Backward && !written.is_empty() {
            return written.iter().filter_map(step).min();
        }
        self.touched(op).iter().filter_map(step).max()
    }

    /// Issues every trace step up to `target`: the markers and after-hooks of the steps
    /// left, the before-hooks of the steps entered.
    fn advance(&mut self, target: usize) -> Result<(), ShapeError> {
        let first = self.started.map_or(0, |s| s + 1);
        for step in first..=target {
            if step > 0 {
                self.close(step - 1)?;
            }
            self.open(step)?;
            self.started = Some(step);
        }
        Ok(())
    }

    fn open(&mut self, step: usize) -> Result<(), ShapeError> {
        let Some(schedule) = self.plan.stage3.as_ref() else {
            return Ok(());
        };
        let Some(record) = schedule.steps.get(step) else {
            return Ok(());
        };
        let batches = [
            (record.on_demand.clone(), Purpose::Fetch { step }),
            (record.prefetch.clone(), Purpose::Prefetch { step }),
        ];
        for (batch, purpose) in batches {
            if batch.is_empty() {
                continue;
            }
            let mut places = Vec::with_capacity(batch.len());
            for &t in &batch {
                places.push((t, self.place(t, step, Placed::GatheredAt)?));
            }
            let waits = self.free_before(&places);
            self.gather(&places, purpose, waits);
        }
        Ok(())
    }

    /// Stage 3: tensor `t`'s span in the arena while trace step `step` runs. `Placed` says
    /// what the step must be to its interval: the one that gathers it, the one that
    /// releases it, or any step in between.
    fn place(&self, t: usize, step: usize, placed: Placed) -> Result<ArenaSpan, ShapeError> {
        let name = || self.names.get(t).map_or("?", String::as_str).to_string();
        let arena = self.arena.ok_or_else(|| {
            ShapeError(format!(
                "`{}` is gathered, but the plan places no stage-3 arena",
                name()
            ))
        })?;
        let span = arena.span_at(t, step).copied().ok_or_else(|| {
            ShapeError(format!(
                "`{}` is used at trace step {step}, where the plan's stage-3 arena does not hold it",
                name()
            ))
        })?;
        let fits = match placed {
            Placed::GatheredAt => span.from == step,
            Placed::ReleasedAt => span.to == step,
            Placed::Live => true,
        };
        if !fits {
            return Err(ShapeError(format!(
                "`{}` at trace step {step}: the plan's arena holds it over steps {}..={}",
                name(),
                span.from,
                span.to
            )));
        }
        Ok(span)
    }

    /// Stage 3: the events a gather into `places` waits for before it overwrites them: the
    /// compute of the step that released the latest earlier tensor there, and the start of
    /// the micro-step when a later step's tensor held the place in the micro-step before.
    fn free_before(&self, places: &[(usize, ArenaSpan)]) -> Vec<EventId> {
        let Some(arena) = self.arena else {
            return Vec::new();
        };
        let mut latest_release: Option<usize> = None;
        let mut after_entry = false;
        for (_, place) in places {
            for other in arena
                .spans
                .iter()
                .filter(|o| o.overlaps(place) && o.numel > 0)
            {
                if other.to < place.from {
                    latest_release = latest_release.max(Some(other.to));
                } else if other.from > place.to {
                    after_entry = true;
                }
            }
        }
        let mut waits: Vec<EventId> = latest_release
            .and_then(|step| self.released.get(&step).copied())
            .into_iter()
            .collect();
        if after_entry {
            waits.extend(self.entered);
        }
        waits
    }

    fn close(&mut self, step: usize) -> Result<(), ShapeError> {
        self.ops.push(on(
            CommStream::Compute,
            CommAction::Mark(Marker::Unit { step }),
        ));
        if self.reduces {
            let flushed: Vec<ReduceBucket> = self
                .plan
                .buckets
                .reduce
                .iter()
                .filter(|b| b.flush == FlushPoint::BackwardStep { step })
                .cloned()
                .collect();
            for bucket in &flushed {
                self.reduce(bucket)?;
            }
        }
        if let Some(arena) = self.arena {
            self.release(&arena.released_after(step), step)?;
        }
        Ok(())
    }

    /// Stage 3: the release of `tensors` after trace step `step` (the plan's arena places
    /// end there), and the event recorded after the step's compute that a later gather into
    /// their places waits for.
    fn release(&mut self, tensors: &[usize], step: usize) -> Result<(), ShapeError> {
        let mut spans = Vec::with_capacity(tensors.len());
        for &t in tensors {
            let place = self.place(t, step, Placed::ReleasedAt)?;
            spans.push(slice(
                Region::Params,
                to_usize(place.offset),
                to_usize(place.numel),
            ));
        }
        let done = self.event();
        let action = if spans.is_empty() {
            CommAction::Sync
        } else {
            CommAction::Release { tensors: spans }
        };
        self.ops.push(Op::Collective(CommOp::with_events(
            CommStream::Compute,
            Vec::new(),
            Some(done),
            action,
        )));
        self.released.insert(step, done);
        Ok(())
    }

    /// The operands of `op` in `region` (the flat parameters or gradients), each with the
    /// flat span `(start, end, tensor)` of the one tensor that holds it; an operand accessed
    /// as `refused` is refused with `why(tensor name)`.
    fn arena_operands<'o>(
        &self,
        op: &'o mut Op,
        region: Region,
        refused: Access,
        why: &dyn Fn(&str) -> String,
    ) -> Result<Vec<(&'o mut TensorRef, FlatTensor)>, ShapeError> {
        let what = match region {
            Region::Grads => "gradients",
            _ => "parameters",
        };
        let mut operands = Vec::new();
        for (tensor, access) in op.tensors_mut() {
            if tensor.region != region || tensor.is_empty() {
                continue;
            }
            let (a, b) = (tensor.span.offset, tensor.span.end());
            let &(start, end, t) = self
                .by_offset
                .iter()
                .find(|&&(start, end, _)| start <= a && b <= end && start < end)
                .ok_or_else(|| {
                    ShapeError(format!(
                        "a compute op touches {what} {a}..{b}, which are not within one tensor"
                    ))
                })?;
            if access == refused {
                return Err(ShapeError(why(&self.names[t])));
            }
            operands.push((tensor, (start, end, t)));
        }
        Ok(operands)
    }

    /// Stage 3: a compute op built over the flat parameters, its parameter reads moved to
    /// their places in the arena for trace step `step`.
    fn in_arena(&self, mut op: Op, step: usize) -> Result<Op, ShapeError> {
        if self.arena.is_none() {
            return Ok(op);
        }
        let why = |name: &str| format!("a compute op writes the gathered `{name}` at stage 3");
        for (tensor, (start, end, t)) in
            self.arena_operands(&mut op, Region::Params, Access::Write, &why)?
        {
            let (a, b) = (tensor.span.offset, tensor.span.end());
            let place = self.place(t, step, Placed::Live)?;
            debug_assert_eq!(end - start, to_usize(place.numel));
            tensor.span = Span::new(to_usize(place.offset) + (a - start), b - a);
        }
        Ok(op)
    }

    /// Stage 3: all-gathers the slices of `places`' tensors into their places in the arena on
    /// the communication stream (pack, all-gather, unpack) after `waits`; the tensors wait
    /// for its event.
    fn gather(&mut self, places: &[(usize, ArenaSpan)], purpose: Purpose, waits: Vec<EventId>) {
        let world = self.world;
        let base = self.rank.shares.params as usize;
        let mut pack = Vec::new();
        let mut at = 0;
        let mut placed = Vec::new();
        for &(t, _) in places {
            let s = self.shard[t];
            pack.push(CopyPiece {
                dst: slice(Region::GatherIn, at, s.len),
                src: slice(Region::Params, base + s.offset, s.len),
            });
            placed.push((t, at, s.len));
            at += s.len;
        }
        let total = at;
        let mut unpack = Vec::new();
        for rank in 0..world {
            for (&(t, offset, len), (_, place)) in placed.iter().zip(places) {
                let numel = self.spans[t].len;
                let from = (rank * len).min(numel);
                let real = (from + len).min(numel) - from;
                if real > 0 {
                    unpack.push(CopyPiece {
                        dst: slice(Region::Params, to_usize(place.offset) + from, real),
                        src: slice(Region::GatherOut, rank * total + offset, real),
                    });
                }
            }
        }
        let done = self.event();
        self.ops.push(Op::Collective(CommOp::with_events(
            CommStream::Comm,
            waits,
            None,
            CommAction::Copy { pieces: pack },
        )));
        self.ops.push(on(
            CommStream::Comm,
            CommAction::Collective {
                kind: Collective::AllGather,
                input: slice(Region::GatherIn, 0, total),
                output: slice(Region::GatherOut, 0, world * total),
                reduction: None,
                purpose,
                world,
            },
        ));
        self.ops.push(Op::Collective(CommOp::with_events(
            CommStream::Comm,
            Vec::new(),
            Some(done),
            CommAction::Copy { pieces: unpack },
        )));
        for &(t, _) in places {
            self.pending.insert(t, done);
        }
    }

    /// The copies that pack `tensors`' gradients (flat order) back to back into the bucket
    /// staging, the copies that put them back, and the packed length: a bucket whose tensors
    /// are not back to back in the flat gradients (a Llama layer's norms sit after its
    /// projections in the flat order but are reduced between them).
    fn packing(
        &self,
        tensors: &[usize],
        bucket: usize,
    ) -> Result<(Vec<CopyPiece>, Vec<CopyPiece>, usize), ShapeError> {
        let (mut pack, mut unpack, mut at) = (Vec::new(), Vec::new(), 0usize);
        for &t in tensors {
            let span = self.spans[t];
            let (grads, staged) = (
                slice(Region::Grads, span.offset, span.len),
                slice(Region::ReduceStaging, at, span.len),
            );
            pack.push(CopyPiece {
                dst: staged,
                src: grads,
            });
            unpack.push(CopyPiece {
                dst: grads,
                src: staged,
            });
            at += span.len;
        }
        let staging = self.layout.region_len(Region::ReduceStaging);
        if at > staging {
            return Err(ShapeError(format!(
                "bucket {bucket}: its {at} gradient elements are not back to back in the flat \
                 buffer and do not fit the plan's bucket staging of {staging}"
            )));
        }
        Ok((pack, unpack, at))
    }

    /// The stream the plan's gradient reductions run on (the communication stream when they
    /// overlap the compute), and what its first op waits for: an event recorded on the
    /// compute stream now, when the two differ.
    fn reduce_stream(&mut self) -> (CommStream, Vec<EventId>) {
        match self.plan.settings.overlap {
            Overlap::Serialized => (CommStream::Compute, Vec::new()),
            Overlap::Overlapped => {
                let ready = self.event();
                self.ops
                    .push(sync(CommStream::Compute, Vec::new(), Some(ready)));
                (CommStream::Comm, vec![ready])
            }
        }
    }

    /// One of the plan's gradient buckets.
    fn reduce(&mut self, bucket: &ReduceBucket) -> Result<(), ShapeError> {
        if self.grad_arena.is_some() {
            return self.reduce_into_partition(bucket);
        }
        let (stream, waits) = self.reduce_stream();
        let done = (stream == CommStream::Comm).then(|| self.event());
        let purpose = Purpose::ReduceBucket {
            bucket: bucket.index,
        };
        let world = self.world;
        let mut tensors = bucket.tensors.clone();
        let ops = if self.sharded() {
            tensors.sort_by_key(|&t| self.shard[t].offset);
            let chunk: usize = tensors.iter().map(|&t| self.shard[t].len).sum();
            let first = tensors.first().map_or(0, |&t| self.shard[t].offset);
            contiguous(tensors.iter().map(|&t| self.shard[t]), bucket.index)?;
            let mut pieces = Vec::new();
            for rank in 0..world {
                let mut at = rank * chunk;
                for &t in &tensors {
                    let (whole, p) = (self.spans[t], self.shard[t].len);
                    let from = (rank * p).min(whole.len);
                    let real = (from + p).min(whole.len) - from;
                    if real > 0 {
                        pieces.push(CopyPiece {
                            dst: slice(Region::ReduceStaging, at, real),
                            src: slice(Region::Grads, whole.offset + from, real),
                        });
                    }
                    at += p;
                }
            }
            let partition = self.rank.shares.grads as usize + first;
            vec![
                CommOp::with_events(
                    stream,
                    waits,
                    None,
                    CommAction::Zero {
                        tensor: slice(Region::ReduceStaging, 0, world * chunk),
                    },
                ),
                CommOp::on(stream, CommAction::Copy { pieces }),
                CommOp::with_events(
                    stream,
                    Vec::new(),
                    done,
                    CommAction::Collective {
                        kind: Collective::ReduceScatter,
                        input: slice(Region::ReduceStaging, 0, world * chunk),
                        output: slice(Region::Grads, partition, chunk),
                        reduction: Some(ReduceOp::Avg),
                        purpose,
                        world,
                    },
                ),
            ]
        } else {
            if bucket.collective != Collective::AllReduce {
                return Err(ShapeError(format!(
                    "bucket {}: the plan's {} is not run on a flat partition",
                    bucket.index,
                    bucket.collective.as_str()
                )));
            }
            tensors.sort_by_key(|&t| self.spans[t].offset);
            let all_reduce = |data: TensorRef, waits: Vec<EventId>, record: Option<EventId>| {
                CommOp::with_events(
                    stream,
                    waits,
                    record,
                    CommAction::Collective {
                        kind: Collective::AllReduce,
                        input: data,
                        output: data,
                        reduction: Some(ReduceOp::Avg),
                        purpose,
                        world,
                    },
                )
            };
            match contiguous(tensors.iter().map(|&t| self.spans[t]), bucket.index) {
                Ok(range) => vec![all_reduce(
                    slice(Region::Grads, range.offset, range.len),
                    waits,
                    done,
                )],
                Err(_) => {
                    let (pack, unpack, len) = self.packing(&tensors, bucket.index)?;
                    vec![
                        CommOp::with_events(stream, waits, None, CommAction::Copy { pieces: pack }),
                        all_reduce(slice(Region::ReduceStaging, 0, len), Vec::new(), None),
                        CommOp::with_events(
                            stream,
                            Vec::new(),
                            done,
                            CommAction::Copy { pieces: unpack },
                        ),
                    ]
                }
            }
        };
        self.ops.extend(ops.into_iter().map(Op::Collective));
        self.reduce_events.extend(done);
        Ok(())
    }

    /// One micro-step: forward and backward cut into units, with the plan's collectives.
    fn micro_step(&mut self, reduces: bool) -> Result<Vec<Op>, ShapeError> {
        self.reduces = reduces;
        self.started = None;
        self.released.clear();
        self.zeroed.fill(false);
        self.packed.clear();
        self.entered = None;
        if self.arena.is_some() {
            let entered = self.event();
            self.ops
                .push(sync(CommStream::Compute, Vec::new(), Some(entered)));
            self.entered = Some(entered);
        }
        let [forward, backward] = self.layout.passes();
        let passes = [(Pass::Forward, forward), (Pass::Backward, backward)];
        for (pass, ops) in passes {
            for op in ops {
                let target = self.target(&op, pass).or(match self.started {
                    None => Some(0),
                    Some(_) => None,
                });
                if let Some(target) = target
                    && self.started.is_none_or(|s| target > s)
                {
                    self.advance(target)?;
                }
                self.wait_for_gathers(&op);
                let step = self.started.unwrap_or(0);
                let op = self.in_arena(op, step)?;
                let op = self.in_grad_arena(op, step)?;
                self.ops.push(op);
            }
        }
        let last = self.steps.saturating_sub(1);
        self.advance(last)?;
        self.close(last)?;
        if reduces {
            let epilogue: Vec<ReduceBucket> = self
                .plan
                .buckets
                .reduce
                .iter()
                .filter(|b| b.flush == FlushPoint::Epilogue)
                .cloned()
                .collect();
            for bucket in &epilogue {
                self.reduce(bucket)?;
            }
        }
        if !self.reduce_events.is_empty() {
            let waits = std::mem::take(&mut self.reduce_events);
            self.ops.push(sync(CommStream::Compute, waits, None));
        }
        Ok(std::mem::take(&mut self.ops))
    }

    fn wait_for_gathers(&mut self, op: &Op) {
        let mut waits: Vec<EventId> = self
            .touched(op)
            .iter()
            .filter_map(|t| self.pending.remove(t))
            .collect();
        waits.sort_unstable();
        waits.dedup();
        if !waits.is_empty() {
            self.ops.push(sync(CommStream::Compute, waits, None));
        }
    }

    /// The unscale and norm over the rank's gradients; the sums over the ranks.
    fn norm(&mut self) -> Vec<Op> {
        let layout = self.layout;
        let found_inf = layout.whole_region(Region::Step(CudaRegion::FoundInf));
        let total = layout.whole_region(Region::Step(CudaRegion::NormTotal));
        let mut ops = vec![
            Op::Zero { tensor: found_inf },
            Op::UnscaleNorm {
                grads: self.rank.owned(Region::Grads),
                partials: layout.whole_region(Region::Step(CudaRegion::NormPartials)),
                total,
                found_inf,
            },
        ];
        if self.rank.shares.scheme != CudaScheme::Replicated {
            for (data, reduction) in [(total, ReduceOp::Sum), (found_inf, ReduceOp::Max)] {
                ops.push(on(
                    CommStream::Compute,
                    CommAction::Collective {
                        kind: Collective::AllReduce,
                        input: data,
                        output: data,
                        reduction: Some(reduction),
                        purpose: Purpose::StepScalars,
                        world: self.world,
                    },
                ));
            }
        }
        ops
    }

    /// The fused AdamW over the rank's partition, then the optimizer's marker.
    fn update(&mut self) -> Vec<Op> {
        let layout = self.layout;
        let owned = self.rank.owned(Region::Params);
        let (master, params_out) = if layout.trains_master() {
            (layout.whole_region(Region::Master), Some(owned))
        } else {
            (owned, None)
        };
        let segments = layout
            .whole_region(Region::Step(CudaRegion::Segments))
            .prefix(self.rank.segments().len());
        vec![
            Op::AdamW {
                master,
                params_out,
                grads: self.rank.owned(Region::Grads),
                exp_avg: layout.whole_region(Region::ExpAvg),
                exp_avg_sq: layout.whole_region(Region::ExpAvgSq),
                segments,
            },
            on(CommStream::Compute, CommAction::Mark(Marker::Optimizer)),
        ]
    }

    /// The parameters gathered again after the step: stages 1-2's all-gather pieces,
    /// stage 3's persistent tensors. Records `params_ready`.
    fn after_update(&mut self, params_ready: EventId) -> Result<Vec<Op>, ShapeError> {
        let shares = self.rank.shares;
        let world = self.world;
        let stepped = self.event();
        let mut ops = vec![sync(CommStream::Compute, Vec::new(), Some(stepped))];
        match shares.scheme {
            CudaScheme::Replicated => {
                ops.push(sync(CommStream::Comm, Vec::new(), Some(params_ready)));
            }
            CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => {
                let Some(gather) = self.plan.buckets.param_gather.as_ref() else {
                    return Err(ShapeError(
                        "the plan partitions the optimizer but gathers no parameters after its step"
                            .into(),
                    ));
                };
                let partition = shares.optimizer as usize;
                let mine = shares.partition as usize;
                let mut waits = vec![stepped];
                for (index, piece) in gather.shards.iter().enumerate() {
                    let (a, b) = (piece.start as usize, piece.end as usize);
                    let len = b - a;
                    let purpose = Purpose::ParamGather { shard: index };
                    if len == partition {
                        ops.push(Op::Collective(CommOp::with_events(
                            CommStream::Comm,
                            std::mem::take(&mut waits),
                            None,
                            CommAction::Collective {
                                kind: Collective::AllGather,
                                input: slice(Region::Params, mine, partition),
                                output: slice(Region::Params, 0, world * partition),
                                reduction: None,
                                purpose,
                                world,
                            },
                        )));
                        continue;
                    }
                    ops.push(Op::Collective(CommOp::with_events(
                        CommStream::Comm,
                        std::mem::take(&mut waits),
                        None,
                        CommAction::Copy {
                            pieces: vec![CopyPiece {
                                dst: slice(Region::GatherIn, 0, len),
                                src: slice(Region::Params, mine + a, len),
                            }],
                        },
                    )));
                    ops.push(on(
                        CommStream::Comm,
                        CommAction::Collective {
                            kind: Collective::AllGather,
                            input: slice(Region::GatherIn, 0, len),
                            output: slice(Region::GatherOut, 0, world * len),
                            reduction: None,
                            purpose,
                            world,
                        },
                    ));
                    let pieces = (0..world)
                        .map(|rank| CopyPiece {
                            dst: slice(Region::Params, rank * partition + a, len),
                            src: slice(Region::GatherOut, rank * len, len),
                        })
                        .collect();
                    ops.push(on(CommStream::Comm, CommAction::Copy { pieces }));
                }
                ops.push(sync(CommStream::Comm, waits, Some(params_ready)));
            }
            CudaScheme::Sharded => {
                let persistent: Vec<(usize, ArenaSpan)> = self
                    .arena
                    .map(|a| a.persistent().map(|p| (p.tensor, *p)).collect())
                    .unwrap_or_default();
                self.ops.clear();
                if persistent.is_empty() || self.plan.settings.stage != ZeroStage::Weights {
                    ops.push(sync(CommStream::Comm, vec![stepped], Some(params_ready)));
                } else {
                    self.gather(&persistent, Purpose::PersistentRegather, vec![stepped]);
                    for &(t, _) in &persistent {
                        self.pending.remove(&t);
                    }
                    ops.append(&mut self.ops);
                    ops.push(sync(CommStream::Comm, Vec::new(), Some(params_ready)));
                }
            }
        }
        Ok(ops)
    }
}

/// What a trace step must be to a tensor's interval in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    /// The step whose fetch or prefetch gathers it.
    GatheredAt,
    /// The step after which it is released.
    ReleasedAt,
    /// Any step it is gathered through.
    Live,
}

/// The plan's stage-3 arena, checked against the rank's shares `layout` (built from the same
/// plan, [`DeviceLayout::for_plan_rank`] or the Llama family's) and the flat parameters'
/// `spans`.
fn stage3_arena<'a>(
    layout: &RankShares<'_>,
    plan: &'a Plan,
    spans: &[Span],
) -> Result<&'a Stage3Arena, ShapeError> {
    let graph = &plan.model_graph;
    let arena = plan
        .stage3
        .as_ref()
        .and_then(|s| s.arena.as_ref())
        .ok_or_else(|| {
            ShapeError("the plan shards the parameters but places no stage-3 arena".into())
        })?;
    if layout.arena != Some(arena) {
        return Err(ShapeError(
            "the device layout holds another stage-3 arena than the plan's (build it with DeviceLayout::for_plan_rank)".into(),
        ));
    }
    if arena.numel != layout.shares.params {
        return Err(ShapeError(format!(
            "the plan's arena has {} elements, the layout's {}",
            arena.numel, layout.shares.params
        )));
    }
    for place in &arena.spans {
        let numel = spans.get(place.tensor).map(|s| s.len as u64);
        if numel != Some(place.numel) || place.end() > arena.numel {
            let name = graph
                .tensors
                .get(place.tensor)
                .map_or("?", |t| t.name.as_str());
            return Err(ShapeError(format!(
                "the arena's place for `{name}` ({} elements at {}) does not fit the tensor ({numel:?} elements) or the arena",
                place.numel, place.offset
            )));
        }
    }
    Ok(arena)
}

/// The one range `spans` cover back to back (sorted by offset), or an error naming the
/// bucket.
fn contiguous(spans: impl Iterator<Item = Span>, bucket: usize) -> Result<Span, ShapeError> {
    let mut range: Option<Span> = None;
    for span in spans {
        range = Some(match range {
            None => span,
            Some(r) if r.end() == span.offset => Span::new(r.offset, r.len + span.len),
            Some(_) => {
                return Err(ShapeError(format!(
                    "bucket {bucket}: its tensors are not back to back in the device buffers"
                )));
            }
        });
    }
    Ok(range.unwrap_or(Span::new(0, 0)))
}
