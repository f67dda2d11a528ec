//! Stage 3: parameters are sharded as well. Each tensor is cut into `W` chunks of
//! `ceil(n / W)` elements; a rank keeps its chunk of every tensor (its *shard*), plus the full
//! values of the few *persistent* tensors (see `partition.rs`).
//!
//! * **Fetch** (before a unit's forward or backward): the ranks all-gather their chunks of the
//!   unit's non-persistent tensors (one coalesced collective) and the unit is reassembled in
//!   `f32` for the model; **release** (after) frees it. The unit is gathered again for
//!   backward, as DeepSpeed does without prefetching or reuse.
//! * **Gradients**: a complete bucket, laid out per destination rank (each tensor's gradient cut
//!   into the same chunks, zero-padded), is divided by `W` and reduce-scattered; each rank adds
//!   what it receives to its gradient shard. Every micro-step.
//! * **After the step** the shard holds the new parameters; the persistent tensors are
//!   re-gathered on every rank.

use super::ZeroError;
use super::partition::ShardPlan;
use super::precision::{Dtype, DtypeVec};
use super::rank::{ZeroRank, scale_after_sum, scale_before_sum};
use crate::comm::ReduceOp;
use crate::metrics::{Category, Tracked};

/// Rank `rank`'s shard of the full flat parameters `initial`, in `dtype`.
pub(super) fn cut_shard(plan: &ShardPlan, rank: usize, dtype: Dtype, initial: &[f32]) -> DtypeVec {
    let shards = plan.shards();
    let mut shard = DtypeVec::zeros(dtype, shards.len());
    for (t, span) in plan.tensors().iter().enumerate() {
        let piece = shards.piece(t, rank);
        let values = &initial[span.offset + piece.start..span.offset + piece.end];
        shard.write(shards.offset(t), values);
    }
    shard
}

/// The persistent tensors' full values, back to back, and where each starts.
pub(super) fn persistent_store(
    plan: &ShardPlan,
    dtype: Dtype,
    initial: &[f32],
) -> (DtypeVec, Vec<Option<usize>>) {
    let mut offsets = vec![None; plan.tensors().len()];
    let mut store = DtypeVec::zeros(dtype, plan.persistent_numel());
    let mut next = 0;
    for t in plan.persistent_tensors() {
        let span = plan.tensors()[t];
        store.write(next, span.of(initial));
        offsets[t] = Some(next);
        next += span.len;
    }
    (store, offsets)
}

impl ZeroRank {
    /// All-gathers unit `i` into a new `f32` buffer.
    pub(super) fn gather_unit(&mut self, i: usize) -> Result<Tracked<Box<[f32]>>, ZeroError> {
        let entry = self.plan.units()[i].clone();
        let shards = self.plan.shards().clone();
        let mut unit = Tracked::zeros(&self.ledger, Category::Gathered, entry.span.len);
        let contributed = self.plan.gather_numel(&entry);
        if contributed > 0 {
            let mut input = Tracked::zeros(&self.ledger, Category::Buckets, contributed);
            let mut at = 0;
            for t in entry.tensors.clone() {
                if self.plan.is_persistent(t) {
                    continue;
                }
                let chunk = shards.chunk(t);
                self.params
                    .read(shards.offset(t), &mut input[at..at + chunk]);
                at += chunk;
            }
            let mut gathered =
                Tracked::zeros(&self.ledger, Category::Buckets, self.world * contributed);
            self.comm.all_gather(&input, &mut gathered)?;
            drop(input);
            let mut at = 0;
            for t in entry.tensors.clone() {
                if self.plan.is_persistent(t) {
                    continue;
                }
                let base = self.plan.tensors()[t].offset - entry.span.offset;
                for q in 0..self.world {
                    let piece = shards.piece(t, q);
                    let from = q * contributed + at;
                    unit[base + piece.start..base + piece.end]
                        .copy_from_slice(&gathered[from..from + piece.len()]);
                }
                at += shards.chunk(t);
            }
        }
        if let Some(store) = &self.persistent {
            for t in entry.tensors.clone() {
                if let Some(offset) = self.persistent_offset[t] {
                    let span = self.plan.tensors()[t];
                    let base = span.offset - entry.span.offset;
                    store.read(offset, &mut unit[base..base + span.len]);
                }
            }
        }
        Ok(unit)
    }

    /// Reduce-scatters bucket `b` and adds this rank's chunks to its gradient shard.
    pub(super) fn flush_shard_bucket(&mut self, b: usize) -> Result<(), ZeroError> {
        let Self {
            plan,
            bucket,
            bucket_out,
            grads,
            comm,
            options,
            world,
            ..
        } = self;
        let (Some(buffer), Some(out)) = (bucket.as_mut(), bucket_out.as_mut()) else {
            return Ok(());
        };
        let entry = &plan.buckets()[b];
        let values = &mut buffer[..*world * entry.shard_numel];
        let received = &mut out[..entry.shard_numel];
        scale_before_sum(options, *world, values);
        comm.reduce_scatter(values, received, ReduceOp::Sum)?;
        scale_after_sum(options, *world, received);
        let shards = plan.shards();
        for (&t, &offset) in entry.tensors.iter().zip(&entry.shard_offsets) {
            grads.accumulate(
                shards.offset(t),
                &received[offset..offset + shards.chunk(t)],
            );
        }
        Ok(())
    }

    /// Re-gathers the persistent tensors from the updated shards.
    pub(super) fn regather_persistent(&mut self) -> Result<(), ZeroError> {
        let persistent: Vec<usize> = self.plan.persistent_tensors().collect();
        let shards = self.plan.shards().clone();
        let contributed: usize = persistent.iter().map(|&t| shards.chunk(t)).sum();
        if contributed == 0 {
            return Ok(());
        }
        let mut input = Tracked::zeros(&self.ledger, Category::Buckets, contributed);
        let mut at = 0;
        for &t in &persistent {
            let chunk = shards.chunk(t);
            self.params
                .read(shards.offset(t), &mut input[at..at + chunk]);
            at += chunk;
        }
        let mut gathered =
            Tracked::zeros(&self.ledger, Category::Buckets, self.world * contributed);
        self.comm.all_gather(&input, &mut gathered)?;
        let Some(store) = self.persistent.as_mut() else {
            return Ok(());
        };
        let mut at = 0;
        for &t in &persistent {
            if let Some(offset) = self.persistent_offset[t] {
                for q in 0..self.world {
                    let piece = shards.piece(t, q);
                    let from = q * contributed + at;
                    store.write(offset + piece.start, &gathered[from..from + piece.len()]);
                }
            }
            at += shards.chunk(t);
        }
        Ok(())
    }
}
