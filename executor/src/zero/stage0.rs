//! Stage 0 (plain data parallelism): [`Stage0`] holds the whole flat parameters and the whole
//! gradient, accumulated over the micro-steps, and all-reduces it once at the accumulation
//! boundary, bucket by bucket as the plan groups the tensors (DeepSpeed's fallback buckets in
//! parameter order). The optimizer steps everything; fp32 parameters are their own master.
//!
//! The boundary reduction ([`reduce_accumulated`]) is stage 1's too (its IPG buckets in
//! readiness order). Stage 0 averages as DeepSpeed's engine does (`allreduce_bucket`: sum,
//! then multiply by `1/W`); stage 1 as its ZeRO optimizer does (divide by `W`, then sum). The
//! plan's `Collective::Reduce` (to each destination rank) runs as an all-reduce: each rank's
//! slice receives the same values.

use std::ops::Range;

use super::ZeroError;
use super::average::average;
use super::flat::{flat_buffer, unit_in_place, widen_unit};
use super::listed::ListedBuffers;
use super::optimizer::{MasterCopy, Optimizer};
use super::partition::EnginePlan;
use super::precision::{Dtype, DtypeVec};
use super::state::{Buffer, Group, Stage};
use crate::metrics::{Category, Tracked};

/// A stage 0 rank's parameters: the whole flat buffer.
pub(super) struct Stage0 {
    params: Tracked<DtypeVec>,
}

impl Stage0 {
    /// The state of `group`'s rank for the flat parameters `initial`, and its optimizer.
    pub(super) fn new(
        group: &Group,
        initial: &[f32],
        listed: &ListedBuffers,
    ) -> Result<(Self, Optimizer), ZeroError> {
        let params = flat_buffer(group, initial, listed)?;
        let copy = match group.options.model_dtype {
            Dtype::F32 => MasterCopy::InParams,
            Dtype::Bf16 | Dtype::F16 => MasterCopy::Separate,
        };
        let optimizer = Optimizer::new(group, &params, copy, listed)?;
        let params = Tracked::new(&group.ledger, Category::Params, params);
        Ok((Self { params }, optimizer))
    }
}

impl Stage for Stage0 {
    fn params(&self) -> &Tracked<DtypeVec> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Tracked<DtypeVec> {
        &mut self.params
    }

    fn grads_len(&self, plan: &EnginePlan) -> usize {
        plan.flat().padded
    }

    fn norm_pieces(&self, plan: &EnginePlan, _rank: usize) -> Vec<Range<usize>> {
        plan.tensors().iter().map(|t| t.offset..t.end()).collect()
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
        grads.accumulate(group.plan.units()[i].span.offset, values);
        Ok(())
    }

    fn reduce_at_boundary(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
    ) -> Result<(), ZeroError> {
        reduce_accumulated(group, grads)
    }

    fn write_owned(
        &mut self,
        _group: &Group,
        start: usize,
        values: &[f32],
    ) -> Result<(), ZeroError> {
        self.params.write(start, values);
        Ok(())
    }
}

/// All-reduces the accumulated gradients `grads` (the whole flat buffer) of every planned
/// bucket: in place when they are `f32` and the bucket's tensors are contiguous, else through
/// an `f32` staging copy of the bucket (the `Comm` works on `f32`).
pub(super) fn reduce_accumulated(
    group: &mut Group,
    grads: &mut Tracked<DtypeVec>,
) -> Result<(), ZeroError> {
    let Group {
        plan,
        comm,
        options,
        ledger,
        ..
    } = group;
    let staged_len = plan
        .buckets()
        .iter()
        .filter(|b| grads.as_f32().is_none() || b.flat_range.is_none())
        .map(|b| b.numel)
        .max()
        .unwrap_or(0);
    let mut staging =
        (staged_len > 0).then(|| Tracked::zeros(ledger, Category::Buckets, staged_len));
    for bucket in plan.buckets() {
        if let (Some(range), Some(values)) = (&bucket.flat_range, grads.as_f32_mut()) {
            average(comm.as_mut(), options, &mut values[range.clone()])?;
            continue;
        }
        let Some(staging) = staging.as_mut() else {
            continue;
        };
        let values = &mut staging[..bucket.numel];
        for (&t, &offset) in bucket.tensors.iter().zip(&bucket.offsets) {
            let span = plan.tensors()[t];
            grads.read(span.offset, &mut values[offset..offset + span.len]);
        }
        average(comm.as_mut(), options, values)?;
        for (&t, &offset) in bucket.tensors.iter().zip(&bucket.offsets) {
            let span = plan.tensors()[t];
            grads.write(span.offset, &values[offset..offset + span.len]);
        }
    }
    Ok(())
}
