//! Stage 2: gradients are sharded too. During every micro-step's backward, each tensor's
//! gradient is copied into the bucket as soon as it is ready (reverse tensor order); a complete
//! bucket (the plan's tensors, in the plan's order) is averaged across ranks (the plan's
//! all-reduce, DeepSpeed's default `use_multi_rank_bucket_allreduce`: divide by `W`, all-reduce
//! the whole bucket; its `reduce` to each destination rank runs the same way) and each rank adds
//! the elements that fall in its flat partition to its gradient partition. So the gradient is averaged after every
//! micro-step and then accumulated, exactly DeepSpeed's ZeRO-2 order.

use super::ZeroError;
use super::average::average;
use super::rank::ZeroRank;

impl ZeroRank {
    /// Averages bucket `b` across ranks and keeps this rank's part of it.
    pub(super) fn flush_flat_bucket(&mut self, b: usize) -> Result<(), ZeroError> {
        let Self {
            plan,
            bucket,
            grads,
            comm,
            options,
            rank,
            ..
        } = self;
        let Some(buffer) = bucket.as_mut() else {
            return Ok(());
        };
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
}
