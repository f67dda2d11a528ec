//! Stage 3, per-tensor shards: [`Stage3`]. The plan cuts each tensor into `W` slices of
//! `ceil(n / W)` elements; a rank keeps its slice of every tensor (its *shard*), plus the full
//! values of the plan's *persistent* tensors, and owns its shard for the optimizer.
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
//!   writes the updated slices back ([`Stage::write_owned`]). The other slices sit back to back
//!   in `params`, each at its `param_offset`.

use std::ops::Range;

use dsplan_planner::plan::stage3::FetchCollective;
use dsplan_planner::plan::{BufferKind, Collective};

use super::ZeroError;
use super::average::{scale_after_sum, scale_before_sum};
use super::bucket::GradBuckets;
use super::listed::ListedBuffers;
use super::optimizer::{MasterCopy, Optimizer};
use super::partition::EnginePlan;
use super::precision::{Dtype, DtypeVec};
use super::state::{Buffer, Group, Stage, widened};
use super::swap::ParamSwap;
use crate::comm::ReduceOp;
use crate::metrics::{Category, Tracked};

/// A stage 3 rank's shard, persistent tensors and gradient bucket.
pub(super) struct Stage3 {
    /// The shard in the model dtype, without the slices on NVMe.
    params: Tracked<DtypeVec>,
    /// Where each tensor's slice sits in `params` (its shard offset unless parameters are
    /// offloaded to NVMe; unused for the slices that live there).
    param_offset: Vec<usize>,
    /// Parameter offload to NVMe.
    param_swap: Option<ParamSwap>,
    /// The persistent tensors' full values, back to back.
    persistent: Tracked<DtypeVec>,
    /// Where each persistent tensor starts in `persistent`.
    persistent_offset: Vec<Option<usize>>,
    /// The gradient bucket, in its per-rank interleaved layout.
    buckets: GradBuckets,
    /// The reduce-scatter output.
    received: Buffer,
}

impl Stage3 {
    /// The state of `group`'s rank for the flat parameters `initial` (every rank can read them,
    /// like a checkpoint on disk; it copies only its shard and the persistent tensors), and its
    /// optimizer. Under parameter offload to NVMe it creates the rank's swap file.
    pub(super) fn new(
        group: &Group,
        initial: &[f32],
        listed: &ListedBuffers,
    ) -> Result<(Self, Optimizer), ZeroError> {
        let plan = &group.plan;
        let ledger = &group.ledger;
        let dtype = group.options.model_dtype;
        let shard = cut_shard(plan, group.rank, dtype, initial);
        let persistent_len = listed.take(
            BufferKind::PersistentParameters,
            plan.persistent_numel(),
            "stage 3's persistent tensors, whole",
        )?;
        let (store, persistent_offset) = persistent_store(plan, dtype, initial, persistent_len);
        let persistent = Tracked::new(ledger, Category::Params, store);
        let optimizer = Optimizer::new(group, &shard, MasterCopy::Separate, listed)?;
        let shards = plan.shards();
        let mut param_offset: Vec<usize> = (0..plan.tensors().len())
            .map(|t| {
                if shards.is_empty() {
                    0
                } else {
                    shards.offset(t)
                }
            })
            .collect();
        let (params, param_swap) = match &plan.nvme().params {
            Some(layout) => {
                listed.take(
                    BufferKind::ParamSwapBuffers,
                    layout.buffer_count * layout.buffer_size,
                    "the parameter swap buffers, buffer_count times buffer_size",
                )?;
                let swap = ParamSwap::create(layout, group.rank, shards, &shard, ledger)?;
                let kept: usize = (0..param_offset.len())
                    .filter(|&t| !swap.is_resident(t))
                    .map(|t| shards.chunk(t))
                    .sum();
                let kept = listed.take(
                    BufferKind::Parameters,
                    kept,
                    "stage 3's shard less its slices on NVMe",
                )?;
                let mut compact = DtypeVec::zeros(dtype, kept);
                let mut at = 0;
                let mut values = Vec::new();
                for (t, offset) in param_offset.iter_mut().enumerate() {
                    if swap.is_resident(t) {
                        continue;
                    }
                    values.resize(shards.chunk(t), 0.0);
                    shard.read(shards.offset(t), &mut values);
                    compact.write(at, &values);
                    *offset = at;
                    at += values.len();
                }
                (compact, Some(swap))
            }
            None => {
                listed.take(BufferKind::Parameters, shard.len(), "stage 3's shard")?;
                (shard, None)
            }
        };
        let params = Tracked::new(ledger, Category::Params, params);
        let bucket_len = listed.take(
            BufferKind::GradientBuckets,
            group.world * plan.max_bucket_shard_numel(),
            "stage 3's gradient bucket, W times the largest bucket's per-rank part",
        )?;
        let buckets = GradBuckets::new(ledger, bucket_len, plan.buckets().len());
        let received_len = listed.take(
            BufferKind::ReduceScatterStaging,
            plan.max_bucket_shard_numel(),
            "stage 3's reduce-scatter output, the largest bucket's per-rank part",
        )?;
        let received = Tracked::zeros(ledger, Category::Buckets, received_len);
        let state = Self {
            params,
            param_offset,
            param_swap,
            persistent,
            persistent_offset,
            buckets,
            received,
        };
        Ok((state, optimizer))
    }
}

/// Rank `rank`'s shard of the full flat parameters `initial`, in `dtype`.
fn cut_shard(plan: &EnginePlan, rank: usize, dtype: Dtype, initial: &[f32]) -> DtypeVec {
    let shards = plan.shards();
    let mut shard = DtypeVec::zeros(dtype, shards.len());
    for (t, span) in plan.tensors().iter().enumerate() {
        let piece = shards.piece(t, rank);
        let values = &initial[span.offset + piece.start..span.offset + piece.end];
        shard.write(shards.offset(t), values);
    }
    shard
}

/// The persistent tensors' full values, back to back in a store of `len` elements, and where
/// each starts.
fn persistent_store(
    plan: &EnginePlan,
    dtype: Dtype,
    initial: &[f32],
    len: usize,
) -> (DtypeVec, Vec<Option<usize>>) {
    let mut offsets = vec![None; plan.tensors().len()];
    let mut store = DtypeVec::zeros(dtype, len);
    let mut next = 0;
    for t in plan.persistent_tensors() {
        let span = plan.tensors()[t];
        store.write(next, span.of(initial));
        offsets[t] = Some(next);
        next += span.len;
    }
    (store, offsets)
}

impl Stage for Stage3 {
    fn params(&self) -> &Tracked<DtypeVec> {
        &self.params
    }

    fn params_mut(&mut self) -> &mut Tracked<DtypeVec> {
        &mut self.params
    }

    fn grads_len(&self, plan: &EnginePlan) -> usize {
        plan.shards().len()
    }

    fn norm_pieces(&self, plan: &EnginePlan, rank: usize) -> Vec<Range<usize>> {
        (0..plan.tensors().len())
            .map(|t| {
                let offset = plan.shards().offset(t);
                offset..offset + plan.shards().piece(t, rank).len()
            })
            .filter(|r| !r.is_empty())
            .collect()
    }

    fn fetch(&mut self, group: &mut Group, i: usize) -> Result<Option<Buffer>, ZeroError> {
        self.gather_unit(group, i).map(Some)
    }

    fn grads_ready(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
        i: usize,
        values: &[f32],
    ) -> Result<(), ZeroError> {
        let entry = &group.plan.units()[i];
        let (unit_start, tensors) = (entry.span.offset, entry.tensors.clone());
        for t in group.plan.in_reduction_order(tensors) {
            let span = group.plan.tensors()[t];
            let start = span.offset - unit_start;
            let values = &values[start..start + span.len];
            let b = group.plan.bucket_of(t);
            let entry = &group.plan.buckets()[b];
            let Some(j) = entry.tensors.iter().position(|&x| x == t) else {
                continue;
            };
            let shards = group.plan.shards();
            let chunk = shards.chunk(t);
            let bucket = &mut self.buckets.buffer;
            for q in 0..group.world {
                let piece = shards.piece(t, q);
                let dst = q * entry.shard_numel + entry.shard_offsets[j];
                bucket[dst..dst + piece.len()].copy_from_slice(&values[piece.clone()]);
                bucket[dst + piece.len()..dst + chunk].fill(0.0);
            }
            if self.buckets.arrive(b, entry.tensors.len()) {
                self.flush_bucket(group, grads, b)?;
            }
        }
        Ok(())
    }

    /// Writes the new values of whole tensor slices to where each slice lives: `params`, or
    /// the NVMe file.
    fn write_owned(
        &mut self,
        group: &Group,
        start: usize,
        values: &[f32],
    ) -> Result<(), ZeroError> {
        let end = start + values.len();
        let shards = group.plan.shards();
        for t in 0..group.plan.tensors().len() {
            let (offset, chunk) = (shards.offset(t), shards.chunk(t));
            if offset < start || offset + chunk > end || chunk == 0 {
                continue;
            }
            let slice = &values[offset - start..offset - start + chunk];
            match &mut self.param_swap {
                Some(swap) if swap.is_resident(t) => swap.write(t, slice)?,
                _ => self.params.write(self.param_offset[t], slice),
            }
        }
        Ok(())
    }

    fn after_step(&mut self, group: &mut Group) -> Result<(), ZeroError> {
        self.regather_persistent(group)
    }

    fn held_params(&mut self, group: &Group) -> Result<Vec<f32>, ZeroError> {
        let Some(swap) = self.param_swap.as_mut() else {
            return Ok(widened(&self.params));
        };
        let shards = group.plan.shards();
        let mut values = vec![0.0f32; shards.len()];
        for t in 0..group.plan.tensors().len() {
            let (offset, chunk) = (shards.offset(t), shards.chunk(t));
            let slice = &mut values[offset..offset + chunk];
            if swap.is_resident(t) {
                swap.read(t, slice)?;
            } else {
                self.params.read(self.param_offset[t], slice);
            }
        }
        Ok(values)
    }

    fn param_swap(&self) -> Option<&ParamSwap> {
        self.param_swap.as_ref()
    }
}

impl Stage3 {
    /// Gathers unit `i` into a new `f32` buffer, tensor by tensor of its fetch list: the ranks'
    /// slices of a tensor, concatenated in rank order, are the tensor itself followed by its
    /// padding, so each collective writes straight into the unit (the padding spills into the
    /// next tensor's place, which is gathered after it, or into `world` spare elements at the
    /// end).
    /// `f32` shards are sent as they are; 16-bit shards, and slices read from NVMe, are widened
    /// into a one-chunk staging buffer first. Persistent tensors are copied from the persistent
    /// store.
    fn gather_unit(&mut self, group: &mut Group, i: usize) -> Result<Buffer, ZeroError> {
        let Group {
            plan,
            world,
            comm,
            ledger,
            ..
        } = group;
        let world = *world;
        let entry = &plan.units()[i];
        let mut unit = Tracked::zeros(ledger, Category::Gathered, entry.span.len + world);
        let largest_chunk = entry
            .fetch
            .iter()
            .map(|&t| plan.shards().chunk(t))
            .max()
            .unwrap_or(0);
        let swapped = self
            .param_swap
            .as_ref()
            .is_some_and(|swap| entry.fetch.iter().any(|&t| swap.is_resident(t)));
        let mut staging = ((self.params.dtype() != Dtype::F32 || swapped) && largest_chunk > 0)
            .then(|| Tracked::zeros(ledger, Category::Buckets, largest_chunk));
        let Self {
            params,
            param_offset,
            param_swap,
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
        for t in entry.tensors.clone() {
            if let Some(offset) = persistent_offset[t] {
                let span = plan.tensors()[t];
                let base = span.offset - entry.span.offset;
                persistent.read(offset, &mut unit[base..base + span.len]);
            }
        }
        Ok(unit)
    }

    /// Reduce-scatters bucket `b` and adds this rank's chunks to the gradient shard `grads`.
    fn flush_bucket(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
        b: usize,
    ) -> Result<(), ZeroError> {
        let Group {
            plan,
            comm,
            options,
            world,
            ..
        } = group;
        let entry = &plan.buckets()[b];
        let values = &mut self.buckets.buffer[..*world * entry.shard_numel];
        let received = &mut self.received[..entry.shard_numel];
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
    fn regather_persistent(&mut self, group: &mut Group) -> Result<(), ZeroError> {
        let Group {
            plan,
            comm,
            ledger,
            world,
            ..
        } = group;
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
            self.params
                .read(self.param_offset[t], &mut input[at..at + chunk]);
            at += chunk;
        }
        let mut gathered = Tracked::zeros(ledger, Category::Buckets, *world * contributed);
        comm.all_gather(&input, &mut gathered)?;
        let mut at = 0;
        for &t in &tensors {
            if let Some(offset) = self.persistent_offset[t] {
                for q in 0..*world {
                    let piece = shards.piece(t, q);
                    let from = q * contributed + at;
                    self.persistent
                        .write(offset + piece.start, &gathered[from..from + piece.len()]);
                }
            }
            at += shards.chunk(t);
        }
        Ok(())
    }
}
