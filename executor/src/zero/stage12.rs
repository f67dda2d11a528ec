//! Stages 1 and 2, the flat partition: [`Stage12`] holds the whole flat parameters, and each
//! rank owns one equal partition of them (the plan's `owned` range), for which alone it keeps
//! the fp32 master and Adam's moments.
//!
//! * **Gradients, stage 1**: the whole gradient is accumulated over the micro-steps and
//!   all-reduced at the boundary ([`super::stage0::reduce_accumulated`], dividing by `W` before
//!   the sum); the optimizer reads only the rank's partition of it.
//! * **Gradients, stage 2**: during every micro-step's backward each tensor's gradient is
//!   copied into the bucket as soon as it is ready (reverse tensor order); a complete bucket
//!   (the plan's tensors, in the plan's order) is averaged across ranks (the plan's all-reduce,
//!   DeepSpeed's default `use_multi_rank_bucket_allreduce`: divide by `W`, all-reduce the whole
//!   bucket; its `reduce` to each destination rank runs the same way) and each rank adds the
//!   elements in its partition to its gradient partition. So the gradient is averaged after
//!   every micro-step and then accumulated, exactly DeepSpeed's ZeRO-2 order.
//! * **After the step** every rank writes its updated partition of the flat parameters and
//!   all-gathers the others', one collective per piece of the plan's parameter all-gather
//!   (`buckets.param_gather`; none with one rank): straight into the parameters when they are
//!   `f32` and one piece is the whole partition, else through an `f32` staging pair. The
//!   gathered values are the ranks' own stored values (already rounded to the model dtype), so
//!   every rank ends with bit-identical parameters.

use std::ops::Range;

use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::BufferKind;

use super::ZeroError;
use super::average::average;
use super::bucket::GradBuckets;
use super::flat::{flat_buffer, unit_in_place, widen_unit};
use super::listed::ListedBuffers;
use super::optimizer::{MasterCopy, Optimizer};
use super::partition::EnginePlan;
use super::precision::DtypeVec;
use super::stage0::reduce_accumulated;
use super::state::{Buffer, Group, Stage};
use crate::metrics::{Category, Tracked};

/// When a flat-partition rank reduces its gradients.
enum Reduction {
    /// Stage 1: the whole accumulated gradient, at the boundary.
    AtBoundary,
    /// Stage 2: bucket by bucket during every backward, into the gradient partition.
    EveryBackward(GradBuckets),
}

/// A stage 1 or 2 rank's parameters and gradient bucket.
pub(super) struct Stage12 {
    params: Tracked<DtypeVec>,
    reduction: Reduction,
}

impl Stage12 {
    /// The state of `group`'s rank for the flat parameters `initial`, and its optimizer;
    /// `stage` is 1 or 2 (what differs is [`Reduction`]).
    pub(super) fn new(
        group: &Group,
        initial: &[f32],
        listed: &ListedBuffers,
        stage: ZeroStage,
    ) -> Result<(Self, Optimizer), ZeroError> {
        let params = flat_buffer(group, initial, listed)?;
        let optimizer = Optimizer::new(group, &params, MasterCopy::Separate, listed)?;
        let params = Tracked::new(&group.ledger, Category::Params, params);
        let reduction = match stage {
            ZeroStage::Gradients => {
                let len = listed.take(
                    BufferKind::GradientBuckets,
                    group.plan.max_bucket_numel(),
                    "stage 2's gradient bucket, the largest planned bucket",
                )?;
                Reduction::EveryBackward(GradBuckets::new(
                    &group.ledger,
                    len,
                    group.plan.buckets().len(),
                ))
            }
            _ => Reduction::AtBoundary,
        };
        Ok((Self { params, reduction }, optimizer))
    }
}

impl Stage for Stage12 {
    fn params(&self) -> &Tracked<DtypeVec> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Tracked<DtypeVec> {
        &mut self.params
    }

    fn grads_len(&self, plan: &EnginePlan) -> usize {
        match self.reduction {
            Reduction::AtBoundary => plan.flat().padded,
            Reduction::EveryBackward(_) => plan.flat().partition,
        }
    }

    fn owned_grads(&self, plan: &EnginePlan, rank: usize, grads_len: usize) -> Range<usize> {
        match self.reduction {
            Reduction::AtBoundary => plan.owned(rank),
            Reduction::EveryBackward(_) => 0..grads_len,
        }
    }

    fn norm_pieces(&self, plan: &EnginePlan, rank: usize) -> Vec<Range<usize>> {
        let start = plan.owned(rank).start;
        plan.flat_pieces(rank)
            .into_iter()
            .map(|(_, r)| r.start - start..r.end - start)
            .collect()
    }

    fn fetch(&mut self, group: &mut Group, i: usize) -> Result<Option<Buffer>, ZeroError> {
        Ok(widen_unit(group, &self.params, i))
    }

    fn in_place(&self, group: &Group, i: usize) -> Option<&[f32]> {
        unit_in_place(group, &self.params, i)
    }

    fn grads_ready(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
        i: usize,
        values: &[f32],
    ) -> Result<(), ZeroError> {
        let entry = &group.plan.units()[i];
        let Reduction::EveryBackward(buckets) = &mut self.reduction else {
            grads.accumulate(entry.span.offset, values);
            return Ok(());
        };
        let (unit_start, tensors) = (entry.span.offset, entry.tensors.clone());
        for t in group.plan.in_reduction_order(tensors) {
            let span = group.plan.tensors()[t];
            let start = span.offset - unit_start;
            let b = group.plan.bucket_of(t);
            let entry = &group.plan.buckets()[b];
            let Some(j) = entry.tensors.iter().position(|&x| x == t) else {
                continue;
            };
            let dst = entry.offsets[j];
            buckets.buffer[dst..dst + span.len].copy_from_slice(&values[start..start + span.len]);
            if buckets.arrive(b, entry.tensors.len()) {
                flush_bucket(group, &mut buckets.buffer, grads, b)?;
            }
        }
        Ok(())
    }

    fn reduce_at_boundary(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
    ) -> Result<(), ZeroError> {
        match self.reduction {
            Reduction::AtBoundary => reduce_accumulated(group, grads),
            Reduction::EveryBackward(_) => Ok(()),
        }
    }

    fn write_owned(
        &mut self,
        group: &Group,
        start: usize,
        values: &[f32],
    ) -> Result<(), ZeroError> {
        let own_start = group.plan.owned(group.rank).start;
        self.params.write(own_start + start, values);
        Ok(())
    }

    fn after_step(&mut self, group: &mut Group) -> Result<(), ZeroError> {
        gather_partitions(group, &mut self.params)
    }
}

/// Stage 2: averages bucket `b` across ranks and adds this rank's part of it to its gradient
/// partition `grads`.
fn flush_bucket(
    group: &mut Group,
    buffer: &mut [f32],
    grads: &mut Tracked<DtypeVec>,
    b: usize,
) -> Result<(), ZeroError> {
    let Group {
        plan,
        comm,
        options,
        rank,
        ..
    } = group;
    let entry = &plan.buckets()[b];
    let values = &mut buffer[..entry.numel];
    average(comm.as_mut(), options, values)?;
    let owned = plan.owned(*rank);
    for (&t, &offset) in entry.tensors.iter().zip(&entry.offsets) {
        let span = plan.tensors()[t];
        let start = span.offset.max(owned.start);
        let end = span.end().min(owned.end);
        if start < end {
            let from = offset + (start - span.offset);
            grads.accumulate(start - owned.start, &values[from..from + (end - start)]);
        }
    }
    Ok(())
}

/// Rebuilds the full flat parameters from every rank's partition.
fn gather_partitions(group: &mut Group, params: &mut Tracked<DtypeVec>) -> Result<(), ZeroError> {
    let world = group.world;
    let partition = group.plan.flat().partition;
    let pieces = group.plan.param_gather();
    let own_start = group.plan.owned(group.rank).start;
    let whole = pieces.len() == 1 && pieces[0] == (0..partition);
    if whole && let Some(full) = params.as_f32_mut() {
        // One all-gather straight into the f32 parameters; only this rank's own partition
        // is copied out first (it is both the input and part of the output).
        let mut input = Tracked::zeros(&group.ledger, Category::Buckets, partition);
        input.copy_from_slice(&full[own_start..own_start + partition]);
        group
            .comm
            .all_gather(&input, &mut full[..world * partition])?;
        return Ok(());
    }
    let largest = pieces.iter().map(|p| p.len()).max().unwrap_or(0);
    if largest == 0 {
        return Ok(());
    }
    let mut input = Tracked::zeros(&group.ledger, Category::Buckets, largest);
    let mut output = Tracked::zeros(&group.ledger, Category::Buckets, world * largest);
    for piece in pieces {
        let len = piece.len();
        if len == 0 {
            continue;
        }
        params.read(own_start + piece.start, &mut input[..len]);
        group
            .comm
            .all_gather(&input[..len], &mut output[..world * len])?;
        for (q, values) in output[..world * len].chunks_exact(len).enumerate() {
            params.write(q * partition + piece.start, values);
        }
    }
    Ok(())
}
