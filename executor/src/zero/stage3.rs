//! Stage 3: parameters are sharded as well. The plan cuts each tensor into `W` slices of
//! `ceil(n / W)` elements; a rank keeps its slice of every tensor (its *shard*), plus the full
//! values of the plan's *persistent* tensors.
//!
//! * **Fetch** (before a unit's forward or backward): the ranks gather their slices of the
//!   unit's fetch list (the non-persistent tensors of the plan's fetch units inside it), one
//!   collective per tensor straight into the unit's `f32` buffer (DeepSpeed coalesces them into
//!   one; the bytes moved are the same): an all-gather, or with
//!   `stage3_use_all_reduce_for_fetch_params` an all-reduce of zeros around each rank's slice.
//!   **Release** (after) frees it. The unit is gathered again for backward, as DeepSpeed does
//!   without prefetching or reuse (the plan's prefetch and reuse decisions are not followed).
//! * **Gradients**: a complete bucket, laid out per destination rank (each tensor's gradient cut
//!   into the same slices, zero-padded), is divided by `W` and reduce-scattered (or, when the
//!   plan says all-reduce, all-reduced and this rank's part kept); each rank adds what it
//!   receives to its gradient shard. Every micro-step.
//! * **After the step** the shard holds the new parameters; the persistent tensors are
//!   re-gathered on every rank.
//! * **Parameter offload to NVMe**: a slice the plan puts on NVMe is read from the rank's swap
//!   file into a parameter swap buffer, and widened, just before its collective; the step
//!   writes the updated slices back (`rank.rs`, `refresh_shard`).

use dsplan_planner::plan::Collective;
use dsplan_planner::plan::stage3::FetchCollective;

use super::ZeroError;
use super::average::{scale_after_sum, scale_before_sum};
use super::partition::EnginePlan;
use super::precision::{Dtype, DtypeVec};
use super::rank::ZeroRank;
use crate::comm::ReduceOp;
use crate::metrics::{Category, Tracked};

/// Rank `rank`'s shard of the full flat parameters `initial`, in `dtype`.
pub(super) fn cut_shard(plan: &EnginePlan, rank: usize, dtype: Dtype, initial: &[f32]) -> DtypeVec {
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
    plan: &EnginePlan,
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
    /// Gathers unit `i` into a new `f32` buffer, tensor by tensor of its fetch list: the ranks'
    /// slices of a tensor, concatenated in rank order, are the tensor itself followed by its
    /// padding, so each collective writes straight into the unit (the padding spills into the
    /// next tensor's place, which is gathered after it, or into `world` spare elements at the
    /// end).
    /// `f32` shards are sent as they are; 16-bit shards, and slices read from NVMe, are widened
    /// into a one-chunk staging buffer first. Persistent tensors are copied from the persistent
    /// store.
    pub(super) fn gather_unit(&mut self, i: usize) -> Result<Tracked<Box<[f32]>>, ZeroError> {
        let entry = self.plan.units()[i].clone();
        let world = self.world;
        let mut unit = Tracked::zeros(&self.ledger, Category::Gathered, entry.span.len + world);
        let largest_chunk = entry
            .fetch
            .iter()
            .map(|&t| self.plan.shards().chunk(t))
            .max()
            .unwrap_or(0);
        let swapped = self
            .param_swap
            .as_ref()
            .is_some_and(|swap| entry.fetch.iter().any(|&t| swap.is_resident(t)));
        let mut staging = ((self.params.dtype() != Dtype::F32 || swapped) && largest_chunk > 0)
            .then(|| Tracked::zeros(&self.ledger, Category::Buckets, largest_chunk));
        let Self {
            plan,
            params,
            param_offset,
            param_swap,
            comm,
            persistent,
            persistent_offset,
            ..
        } = self;
        let shards = plan.shards();
        let collective = plan.fetch_collective();
        let rank = comm.rank();
        for &t in &entry.fetch {
            let base = plan.tensors()[t].offset - entry.span.offset;
            let chunk = shards.chunk(t);
            let output = &mut unit[base..base + world * chunk];
            let offset = param_offset[t];
            let on_nvme = param_swap.as_ref().is_some_and(|swap| swap.is_resident(t));
            let input: &[f32] = match (params.as_f32(), staging.as_mut(), param_swap.as_mut()) {
                (_, Some(staging), Some(swap)) if on_nvme => {
                    swap.read(t, &mut staging[..chunk])?;
                    &staging[..chunk]
                }
                (Some(shard), _, _) => &shard[offset..offset + chunk],
                (None, Some(staging), _) => {
                    params.read(offset, &mut staging[..chunk]);
                    &staging[..chunk]
                }
                (None, None, _) => continue,
            };
            match collective {
                FetchCollective::AllGather => comm.all_gather(input, output)?,
                FetchCollective::AllReduce => {
                    output.fill(0.0);
                    output[rank * chunk..(rank + 1) * chunk].copy_from_slice(input);
                    comm.all_reduce(output, ReduceOp::Sum)?;
                }
            }
        }
        // After the gathers: a gathered tensor's padding may spill over the start of a
        // persistent tensor that follows it.
        if let Some(store) = persistent.as_ref() {
            for t in entry.tensors.clone() {
                if let Some(offset) = persistent_offset[t] {
                    let span = plan.tensors()[t];
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
        if entry.collective == Collective::ReduceScatter {
            comm.reduce_scatter(values, received, ReduceOp::Sum)?;
        } else {
            comm.all_reduce(values, ReduceOp::Sum)?;
            let own = comm.rank() * entry.shard_numel;
            received.copy_from_slice(&values[own..own + entry.shard_numel]);
        }
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
        let Self {
            plan,
            params,
            param_offset,
            persistent,
            persistent_offset,
            comm,
            ledger,
            world,
            ..
        } = self;
        let shards = plan.shards();
        let tensors: Vec<usize> = plan.persistent_tensors().collect();
        let contributed: usize = tensors.iter().map(|&t| shards.chunk(t)).sum();
        if contributed == 0 {
            return Ok(());
        }
        let mut input = Tracked::zeros(ledger, Category::Buckets, contributed);
        let mut at = 0;
        for &t in &tensors {
            let chunk = shards.chunk(t);
            // Persistent tensors never live on NVMe.
            params.read(param_offset[t], &mut input[at..at + chunk]);
            at += chunk;
        }
        let mut gathered = Tracked::zeros(ledger, Category::Buckets, *world * contributed);
        comm.all_gather(&input, &mut gathered)?;
        let Some(store) = persistent.as_mut() else {
            return Ok(());
        };
        let mut at = 0;
        for &t in &tensors {
            if let Some(offset) = persistent_offset[t] {
                for q in 0..*world {
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
