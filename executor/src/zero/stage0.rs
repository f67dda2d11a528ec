//! Stage 0 (plain data parallelism), and stage 1's reduction: every rank holds the whole
//! gradient, accumulated over the micro-steps, and all-reduces it once at the accumulation
//! boundary, bucket by bucket as the plan groups the tensors (stage 0: DeepSpeed's fallback
//! buckets in parameter order; stage 1: the IPG buckets in readiness order).
//!
//! Stage 0 averages as DeepSpeed's engine does (`allreduce_bucket`: sum, then multiply by
//! `1/W`); stage 1 as its ZeRO optimizer does (divide by `W`, then sum). Stage 1 then keeps only
//! its partition of the result for the optimizer (`ZeroRank::owned_grads`). The plan's
//! `Collective::Reduce` (to each destination rank) runs as an all-reduce: each rank's slice
//! receives the same values.

use super::ZeroError;
use super::average::average;
use super::rank::ZeroRank;
use crate::metrics::{Category, Tracked};

impl ZeroRank {
    /// All-reduces the accumulated gradients of every planned bucket: in place when they are
    /// `f32` and the bucket's tensors are contiguous, else through an `f32` staging copy of the
    /// bucket (the `Comm` works on `f32`).
    pub(super) fn reduce_accumulated(&mut self) -> Result<(), ZeroError> {
        let Self {
            plan,
            grads,
            comm,
            options,
            ledger,
            ..
        } = self;
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
}
