//! Stages 2-3 at `W > 1`: gradients in the plan's gradient arena, reduced into the rank's
//! gradient partition (`planner::plan::grad_arena`, `planner::plan::cuda_world`).
//!
//! - A compute op's gradient writes, built over the flat gradients, move to each tensor's place
//!   in the arena for the trace step it runs in; the first write of a micro-step into a place
//!   is preceded by a zero of the place, after the event of every earlier occupant's bucket
//!   pack (the reuse the plan placed).
//! - A bucket is packed out of the arena into the bucket staging (its pack records the event a
//!   later occupant waits for), reduced there with an average (stage 2: an all-reduce of the
//!   packed bucket, the plan's collective; stage 3: each tensor's `W` slices packed rank by
//!   rank, zero-padded, and reduce-scattered in place into the staging's last chunk), and this
//!   rank's part is added into its gradient partition ([`CommAction::Accumulate`]): micro-steps
//!   accumulate there, as DeepSpeed's partitions do. A bucket's tensors need not be back to back
//!   in the flat buffer or the shard: every piece is placed on its own.

use dsplan_planner::plan::Collective;
use dsplan_planner::plan::Plan;
use dsplan_planner::plan::buckets::{FlushPoint, ReduceBucket};
use dsplan_planner::plan::cuda_world::CudaScheme;
use dsplan_planner::plan::stage3_arena::{ArenaSpan, Stage3Arena};

use super::{Builder, slice, sync};
use crate::comm::ReduceOp;
use crate::cuda::train::program::{
    Access, CommAction, CommOp, CommStream, CopyPiece, EventId, Op, Purpose, ShapeError,
};
use crate::cuda::train::region::{Region, TensorRef, to_usize};
use crate::cuda::train::shares::RankShares;
use crate::tensor::Span;

/// The plan's gradient arena where the rank's shares keep one (stages 2-3), checked against
/// them.
pub(super) fn arena<'a>(
    rank: &RankShares<'_>,
    plan: &'a Plan,
) -> Result<Option<&'a Stage3Arena>, ShapeError> {
    let partitioned = matches!(
        rank.shares.scheme,
        CudaScheme::PartitionedGradients | CudaScheme::Sharded
    ) && rank.shares.grad_partition > 0;
    let arena = plan.buckets.gradient_arena.as_ref();
    match (partitioned, arena) {
        (false, None) => Ok(None),
        (true, Some(arena)) if arena.numel == rank.shares.grads => Ok(Some(arena)),
        (true, Some(arena)) => Err(ShapeError(format!(
            "the plan's gradient arena has {} elements, the layout's {}",
            arena.numel, rank.shares.grads
        ))),
        (true, None) => Err(ShapeError(
            "the rank keeps a gradient partition but the plan places no gradient arena".into(),
        )),
        (false, Some(_)) => {
            if rank.shares.scheme == CudaScheme::Sharded {
                return Err(ShapeError(
                    "the plan places a gradient arena for a layout of whole gradients".into(),
                ));
            }
            Ok(None)
        }
    }
}

/// Adjacent pieces (both sides continuing where the previous one ended) merged into one.
fn merged(pieces: Vec<CopyPiece>) -> Vec<CopyPiece> {
    let mut out: Vec<CopyPiece> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if let Some(last) = out.last_mut()
            && last.dst.region == piece.dst.region
            && last.src.region == piece.src.region
            && last.dst.span.end() == piece.dst.span.offset
            && last.src.span.end() == piece.src.span.offset
        {
            last.dst.span.len += piece.dst.span.len;
            last.src.span.len += piece.src.span.len;
            continue;
        }
        out.push(piece);
    }
    out
}

impl Builder<'_> {
    /// Tensor `t`'s gradient place at trace step `step`, or an error naming both.
    fn grad_place(&self, t: usize, step: usize) -> Result<ArenaSpan, ShapeError> {
        let name = self.names.get(t).map_or("?", String::as_str);
        self.grad_arena
            .and_then(|arena| arena.span_at(t, step))
            .copied()
            .ok_or_else(|| {
                ShapeError(format!(
                    "the gradient of `{name}` is written at trace step {step}, where the plan's \
                     gradient arena holds no place for it"
                ))
            })
    }

    /// A compute op built over the flat gradients, its gradient writes moved to their places in
    /// the arena for trace step `step`; the zeroes of the places it writes first this
    /// micro-step are pushed before it.
    pub(super) fn in_grad_arena(&mut self, mut op: Op, step: usize) -> Result<Op, ShapeError> {
        if self.grad_arena.is_none() {
            return Ok(op);
        }
        let mut first = Vec::new();
        let why =
            |name: &str| format!("a compute op reads the gradient of `{name}` from the arena");
        for (tensor, (start, end, t)) in
            self.arena_operands(&mut op, Region::Grads, Access::Read, &why)?
        {
            let (a, b) = (tensor.span.offset, tensor.span.end());
            let place = self.grad_place(t, step)?;
            if end - start != to_usize(place.numel) {
                return Err(ShapeError(format!(
                    "the arena's place for `{}` holds {} elements, the tensor {}",
                    self.names[t],
                    place.numel,
                    end - start
                )));
            }
            tensor.span = Span::new(to_usize(place.offset) + (a - start), b - a);
            if !self.zeroed[t] {
                self.zeroed[t] = true;
                first.push((t, place));
            }
        }
        for (t, place) in first {
            let waits = self.packed_before(t, &place);
            if !waits.is_empty() {
                self.ops.push(sync(CommStream::Compute, waits, None));
            }
            self.ops.push(Op::Zero {
                tensor: slice(Region::Grads, to_usize(place.offset), to_usize(place.numel)),
            });
        }
        Ok(op)
    }

    /// The pack events of the buckets of every earlier occupant of `place` this micro-step.
    fn packed_before(&self, t: usize, place: &ArenaSpan) -> Vec<EventId> {
        let Some(arena) = self.grad_arena else {
            return Vec::new();
        };
        let mut waits: Vec<EventId> = arena
            .spans
            .iter()
            .filter(|o| o.tensor != t && o.numel > 0 && o.overlaps(place) && o.to < place.from)
            .filter_map(|o| self.bucket_of.get(o.tensor).copied().flatten())
            .filter_map(|b| self.packed.get(&b).copied())
            .collect();
        waits.sort_unstable();
        waits.dedup();
        waits
    }

    /// The trace step whose hook flushes `bucket` (the backward's last for the epilogue).
    fn flush_step(&self, bucket: &ReduceBucket) -> usize {
        match bucket.flush {
            FlushPoint::BackwardStep { step } => step,
            FlushPoint::Epilogue => self.steps.saturating_sub(1),
        }
    }

    /// `bucket` packed out of the gradient arena, averaged over the ranks, and this rank's
    /// part added into its gradient partition (see the [module documentation](self)).
    pub(super) fn reduce_into_partition(
        &mut self,
        bucket: &ReduceBucket,
    ) -> Result<(), ShapeError> {
        let (stream, waits) = self.reduce_stream();
        let step = self.flush_step(bucket);
        let purpose = Purpose::ReduceBucket {
            bucket: bucket.index,
        };
        let world = self.world;
        let packed = self.event();
        let done = (stream == CommStream::Comm).then(|| self.event());
        let partition = self.rank.shares.grads as usize;
        let mut places = Vec::with_capacity(bucket.tensors.len());
        for &t in &bucket.tensors {
            places.push((t, self.grad_place(t, step)?));
        }
        let ops = if self.rank.shares.scheme == CudaScheme::Sharded {
            self.reduce_scatter_bucket(&places, (stream, waits), (packed, done), purpose)?
        } else {
            // Stage 2: the bucket packed in flat order, all-reduced, and the pieces of each
            // tensor inside this rank's flat partition added into it.
            places.sort_by_key(|&(t, _)| self.spans[t].offset);
            let mine = self.rank.shares.partition as usize;
            let owned = self.rank.shares.grad_partition as usize;
            let (mut pack, mut add, mut at) = (Vec::new(), Vec::new(), 0usize);
            for &(t, place) in &places {
                let flat = self.spans[t];
                pack.push(CopyPiece {
                    dst: slice(Region::ReduceStaging, at, flat.len),
                    src: slice(Region::Grads, to_usize(place.offset), flat.len),
                });
                let (from, to) = (flat.offset.max(mine), flat.end().min(mine + owned));
                if from < to {
                    add.push(CopyPiece {
                        dst: slice(Region::Grads, partition + from - mine, to - from),
                        src: slice(Region::ReduceStaging, at + from - flat.offset, to - from),
                    });
                }
                at += flat.len;
            }
            let staged = slice(Region::ReduceStaging, 0, at);
            pack_average_add(
                (stream, waits, packed, done),
                pack,
                (Collective::AllReduce, staged, staged),
                add,
                (purpose, world),
            )
        };
        self.ops.extend(ops.into_iter().map(Op::Collective));
        self.packed.insert(bucket.index, packed);
        self.reduce_events.extend(done);
        Ok(())
    }

    /// Stage 3: each tensor's `W` slices packed rank by rank (zero-padded), reduce-scattered
    /// in place into the staging's last chunk, and this rank's slices added into its shard's
    /// gradient partition.
    fn reduce_scatter_bucket(
        &self,
        places: &[(usize, ArenaSpan)],
        (stream, waits): (CommStream, Vec<EventId>),
        (packed, done): (EventId, Option<EventId>),
        purpose: Purpose,
    ) -> Result<Vec<CommOp>, ShapeError> {
        let world = self.world;
        let chunk: usize = places.iter().map(|&(t, _)| self.shard[t].len).sum();
        let staging = self.layout.len(Region::ReduceStaging);
        if (world + 1) * chunk > staging {
            return Err(ShapeError(format!(
                "a bucket of {chunk} elements per rank does not fit the plan's bucket staging of \
                 {staging} ({} ranks and the reduced chunk)",
                world
            )));
        }
        let partition = self.rank.shares.grads as usize;
        let mut pack = Vec::new();
        for rank in 0..world {
            let mut at = rank * chunk;
            for &(t, place) in places {
                let (numel, p) = (self.spans[t].len, self.shard[t].len);
                let from = (rank * p).min(numel);
                let real = (from + p).min(numel) - from;
                if real > 0 {
                    pack.push(CopyPiece {
                        dst: slice(Region::ReduceStaging, at, real),
                        src: slice(Region::Grads, to_usize(place.offset) + from, real),
                    });
                }
                at += p;
            }
        }
        let mut add = Vec::new();
        let mut at = world * chunk;
        for &(t, _) in places {
            let s = self.shard[t];
            add.push(CopyPiece {
                dst: slice(Region::Grads, partition + s.offset, s.len),
                src: slice(Region::ReduceStaging, at, s.len),
            });
            at += s.len;
        }
        let zero = CommOp::with_events(
            stream,
            waits,
            None,
            CommAction::Zero {
                tensor: slice(Region::ReduceStaging, 0, world * chunk),
            },
        );
        let mut ops = vec![zero];
        ops.extend(pack_average_add(
            (stream, Vec::new(), packed, done),
            pack,
            (
                Collective::ReduceScatter,
                slice(Region::ReduceStaging, 0, world * chunk),
                slice(Region::ReduceStaging, world * chunk, chunk),
            ),
            add,
            (purpose, world),
        ));
        Ok(ops)
    }
}

/// A bucket's reduction on `stream`: `pack` copied into the staging after `waits` (recording
/// `packed`), averaged there by `kind` from `input` into `output` over `world` ranks, and
/// `add` accumulated into the gradient partition (recording `done`).
fn pack_average_add(
    (stream, waits, packed, done): (CommStream, Vec<EventId>, EventId, Option<EventId>),
    pack: Vec<CopyPiece>,
    (kind, input, output): (Collective, TensorRef, TensorRef),
    add: Vec<CopyPiece>,
    (purpose, world): (Purpose, usize),
) -> Vec<CommOp> {
    let reduce = CommAction::Collective {
        kind,
        input,
        output,
        reduction: Some(ReduceOp::Avg),
        purpose,
        world,
    };
    vec![
        CommOp::with_events(
            stream,
            waits,
            Some(packed),
            CommAction::Copy {
                pieces: merged(pack),
            },
        ),
        CommOp::on(stream, reduce),
        CommOp::with_events(
            stream,
            Vec::new(),
            done,
            CommAction::Accumulate {
                pieces: merged(add),
            },
        ),
    ]
}
