//! [`ShardPlan`]: all the sharding and bucketing arithmetic the ZeRO engines use, in one place.
//!
//! **To be replaced by the plan's shards and buckets** (`planner::plan`, which lays out the flat
//! buffer with DeepSpeed's alignment and padding, the per-rank shards, the gradient buckets and
//! the stage-3 gather schedule). Until it lands, this module computes the same things from the
//! parameter layout; the engines read nothing else, so swapping it is local.
//!
//! What it computes (DeepSpeed 0.19.8, `research/deepspeed-facts.md` §4):
//!
//! * **Stage 1/2 flat partition** ([`FlatPartition`]): the flat buffer of all parameters (in
//!   `model.parameters()` order) padded with zeros to a multiple of `2 * world`, cut into `world`
//!   equal partitions; rank `r` owns `[r P, (r+1) P)`. A tensor may straddle partitions.
//! * **Stage 3 per-parameter shards** ([`ParamShards`]): every tensor is partitioned on its own
//!   into `world` chunks of `ceil(numel / world)` (the last zero-padded); a rank's shard is its
//!   chunk of every tensor, concatenated in tensor order.
//! * **Persistence** (stage 3): in tensor order, a tensor of at most
//!   `param_persistence_threshold` elements stays gathered on every rank unless that would
//!   take the persistent total over `model_persistence_threshold`.
//! * **Gradient buckets** ([`Bucket`], stages 2 and 3): gradients become ready in reverse
//!   tensor order (backward walks the model from the top); they fill a bucket until the next
//!   one would take it over `reduce_bucket_size` elements (a tensor larger than that is reduced
//!   alone), DeepSpeed's IPG rule.
//! * **Fetch units** (stage 3): the contiguous parameter groups of [`ParamUnit`] (embedding,
//!   each block, the final norm), fetched before use and released after.

use std::ops::Range;

use crate::model::{ParamLayout, ParamUnit};
use crate::tensor::Span;

/// The knobs that shape the shards and buckets (from `zero_optimization`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardOptions {
    /// `reduce_bucket_size`: elements per gradient bucket (at least 1).
    pub reduce_bucket_size: usize,
    /// `stage3_param_persistence_threshold`: tensors this small stay gathered.
    pub param_persistence_threshold: u64,
    /// `stage3_model_persistence_threshold`: the cap on all persistent elements.
    pub model_persistence_threshold: u64,
}

/// One fetch unit: where it lives and which tensors it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitEntry {
    /// The unit.
    pub unit: ParamUnit,
    /// Its span of the flat buffer.
    pub span: Span,
    /// Its tensors (indices into [`ShardPlan::tensors`]).
    pub tensors: Range<usize>,
}

/// The stage 1/2 flat partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatPartition {
    /// Elements of real data.
    pub numel: usize,
    /// Elements after padding to a multiple of `2 * world`.
    pub padded: usize,
    /// Elements per rank, `padded / world`.
    pub partition: usize,
}

impl FlatPartition {
    /// The partition of `numel` elements over `world` ranks.
    pub fn new(numel: usize, world: usize) -> Self {
        let align = 2 * world;
        let padded = numel.div_ceil(align) * align;
        Self {
            numel,
            padded,
            partition: padded / world,
        }
    }

    /// The flat range rank `rank` owns (padding included).
    pub fn range(&self, rank: usize) -> Range<usize> {
        rank * self.partition..(rank + 1) * self.partition
    }
}

/// The stage 3 per-tensor shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamShards {
    world: usize,
    numel: Vec<usize>,
    chunk: Vec<usize>,
    offset: Vec<usize>,
    len: usize,
}

impl ParamShards {
    fn new(tensors: &[Span], world: usize) -> Self {
        let numel: Vec<usize> = tensors.iter().map(|t| t.len).collect();
        let chunk: Vec<usize> = numel.iter().map(|n| n.div_ceil(world)).collect();
        let mut offset = Vec::with_capacity(chunk.len());
        let mut len = 0;
        for &c in &chunk {
            offset.push(len);
            len += c;
        }
        Self {
            world,
            numel,
            chunk,
            offset,
            len,
        }
    }

    /// Elements of one rank's shard (the same on every rank).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the shard is empty (a model without parameters).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements of tensor `t` each rank holds, `ceil(numel / world)`.
    pub fn chunk(&self, t: usize) -> usize {
        self.chunk[t]
    }

    /// Where tensor `t`'s chunk starts in a shard.
    pub fn offset(&self, t: usize) -> usize {
        self.offset[t]
    }

    /// The elements of tensor `t` (indices within the tensor) that `rank`'s chunk holds; the
    /// rest of the chunk is padding.
    pub fn piece(&self, t: usize, rank: usize) -> Range<usize> {
        let (c, n) = (self.chunk[t], self.numel[t]);
        let start = (rank * c).min(n);
        start..((rank + 1) * c).min(n)
    }

    /// The world size the shards were cut for.
    pub fn world(&self) -> usize {
        self.world
    }
}

/// One gradient bucket: tensors reduced together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Its tensors, in the order their gradients become ready (descending index).
    pub tensors: Vec<usize>,
    /// Where each tensor's gradient sits in the bucket (stage 2 layout: back to back).
    pub offsets: Vec<usize>,
    /// Elements of all its tensors.
    pub numel: usize,
    /// Where each tensor's chunk sits in one rank's slice of the stage 3 layout.
    pub shard_offsets: Vec<usize>,
    /// Elements of one rank's slice in the stage 3 layout (sum of the tensors' chunks).
    pub shard_numel: usize,
}

/// Shards, partitions, buckets and fetch units of one model over `world` ranks; see the
/// [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlan {
    world: usize,
    tensors: Vec<Span>,
    units: Vec<UnitEntry>,
    flat: FlatPartition,
    shards: ParamShards,
    buckets: Vec<Bucket>,
    bucket_of: Vec<usize>,
    persistent: Vec<bool>,
}

impl ShardPlan {
    /// The plan for `layout` over `world >= 1` ranks.
    pub fn new(layout: &ParamLayout, world: usize, options: ShardOptions) -> Self {
        let world = world.max(1);
        let tensors: Vec<Span> = layout.table().entries().iter().map(|e| e.span).collect();
        let units = layout
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
                }
            })
            .collect();
        let shards = ParamShards::new(&tensors, world);
        let (buckets, bucket_of) = buckets(&tensors, &shards, options.reduce_bucket_size.max(1));
        let persistent = persistence(&tensors, options);
        Self {
            world,
            flat: FlatPartition::new(layout.num_params(), world),
            tensors,
            units,
            shards,
            buckets,
            bucket_of,
            persistent,
        }
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Every parameter tensor's span, in buffer order.
    pub fn tensors(&self) -> &[Span] {
        &self.tensors
    }

    /// The fetch units, in buffer order.
    pub fn units(&self) -> &[UnitEntry] {
        &self.units
    }

    /// The position of `unit` in [`ShardPlan::units`] (an out-of-range block maps past the
    /// end).
    pub fn unit_index(&self, unit: ParamUnit) -> usize {
        match unit {
            ParamUnit::Embedding => 0,
            ParamUnit::Block(l) => (l + 1).min(self.units.len()),
            ParamUnit::FinalNorm => self.units.len().saturating_sub(1),
        }
    }

    /// The stage 1/2 flat partition.
    pub fn flat(&self) -> &FlatPartition {
        &self.flat
    }

    /// The stage 3 shards.
    pub fn shards(&self) -> &ParamShards {
        &self.shards
    }

    /// The gradient buckets, in the order they fill.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket of tensor `t`.
    pub fn bucket_of(&self, t: usize) -> usize {
        self.bucket_of[t]
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

    /// The largest bucket's elements (stage 2's bucket buffer).
    pub fn max_bucket_numel(&self) -> usize {
        self.buckets.iter().map(|b| b.numel).max().unwrap_or(0)
    }

    /// The largest bucket's per-rank slice in the stage 3 layout.
    pub fn max_bucket_shard_numel(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.shard_numel)
            .max()
            .unwrap_or(0)
    }

    /// Elements one rank contributes to gathering `unit` under stage 3 (its chunks of the
    /// unit's non-persistent tensors).
    pub fn gather_numel(&self, unit: &UnitEntry) -> usize {
        unit.tensors
            .clone()
            .filter(|&t| !self.persistent[t])
            .map(|t| self.shards.chunk(t))
            .sum()
    }
}

/// Greedy buckets over tensors in reverse order.
fn buckets(tensors: &[Span], shards: &ParamShards, size: usize) -> (Vec<Bucket>, Vec<usize>) {
    let mut buckets: Vec<Bucket> = Vec::new();
    let mut bucket_of = vec![0; tensors.len()];
    for t in (0..tensors.len()).rev() {
        let numel = tensors[t].len;
        let start_new = match buckets.last() {
            None => true,
            Some(current) => current.numel > 0 && current.numel + numel > size,
        };
        if start_new {
            buckets.push(Bucket {
                tensors: Vec::new(),
                offsets: Vec::new(),
                numel: 0,
                shard_offsets: Vec::new(),
                shard_numel: 0,
            });
        }
        let index = buckets.len() - 1;
        let bucket = &mut buckets[index];
        bucket.tensors.push(t);
        bucket.offsets.push(bucket.numel);
        bucket.numel += numel;
        bucket.shard_offsets.push(bucket.shard_numel);
        bucket.shard_numel += shards.chunk(t);
        bucket_of[t] = index;
    }
    (buckets, bucket_of)
}

/// DeepSpeed's persistence rule, in tensor order.
fn persistence(tensors: &[Span], options: ShardOptions) -> Vec<bool> {
    let mut total: u64 = 0;
    tensors
        .iter()
        .map(|t| {
            let numel = t.len as u64;
            let fits = numel <= options.param_persistence_threshold
                && total + numel <= options.model_persistence_threshold;
            if fits {
                total += numel;
            }
            fits
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Gpt2Config;

    fn layout() -> ParamLayout {
        ParamLayout::new(&Gpt2Config {
            vocab_size: 50,
            n_positions: 8,
            n_embd: 12,
            n_layer: 2,
            n_head: 3,
            layer_norm_epsilon: 1e-5,
        })
    }

    fn options(bucket: usize, persist: u64) -> ShardOptions {
        ShardOptions {
            reduce_bucket_size: bucket,
            param_persistence_threshold: persist,
            model_persistence_threshold: u64::MAX,
        }
    }

    #[test]
    fn flat_partitions_are_padded_to_twice_the_world() {
        let flat = FlatPartition::new(10, 4);
        assert_eq!((flat.padded, flat.partition), (16, 4));
        assert_eq!(flat.range(3), 12..16);
        let plan = ShardPlan::new(&layout(), 3, options(100, 0));
        let numel = layout().num_params();
        let covered: usize = (0..3)
            .flat_map(|r| plan.flat_pieces(r))
            .map(|(_, range)| range.len())
            .sum();
        assert_eq!(covered, numel);
        assert_eq!(plan.flat().padded % 6, 0);
    }

    #[test]
    fn stage3_chunks_cover_every_tensor_once() {
        let plan = ShardPlan::new(&layout(), 4, options(100, 0));
        for (t, span) in plan.tensors().iter().enumerate() {
            let mut next = 0;
            for rank in 0..4 {
                let piece = plan.shards().piece(t, rank);
                assert_eq!(piece.start, next.min(span.len));
                assert!(piece.len() <= plan.shards().chunk(t));
                next = piece.end.max(next);
            }
            assert_eq!(next, span.len);
        }
    }

    #[test]
    fn buckets_fill_in_reverse_order_up_to_the_size() {
        let plan = ShardPlan::new(&layout(), 2, options(500, 0));
        let mut seen: Vec<usize> = Vec::new();
        for bucket in plan.buckets() {
            assert!(bucket.numel <= 500 || bucket.tensors.len() == 1);
            seen.extend(&bucket.tensors);
        }
        let expected: Vec<usize> = (0..plan.tensors().len()).rev().collect();
        assert_eq!(seen, expected);
        // wte (50 x 12 = 600) exceeds the bucket: alone.
        let wte_bucket = &plan.buckets()[plan.bucket_of(0)];
        assert_eq!(wte_bucket.tensors, vec![0]);
    }

    #[test]
    fn persistence_takes_small_tensors_in_order() {
        let plan = ShardPlan::new(&layout(), 2, options(500, 12));
        let persistent: Vec<usize> = plan.persistent_tensors().collect();
        assert!(!persistent.is_empty());
        assert!(persistent.iter().all(|&t| plan.tensors()[t].len <= 12));
        let capped = ShardPlan::new(
            &layout(),
            2,
            ShardOptions {
                model_persistence_threshold: 24,
                ..options(500, 12)
            },
        );
        assert_eq!(capped.persistent_numel(), 24);
    }

    #[test]
    fn units_know_their_tensors() {
        let plan = ShardPlan::new(&layout(), 2, options(500, 0));
        let units = plan.units();
        assert_eq!(units[0].tensors, 0..2);
        assert_eq!(units[1].tensors, 2..14);
        assert_eq!(units.last().map(|u| u.tensors.clone()), Some(26..28));
        assert_eq!(plan.unit_index(ParamUnit::FinalNorm), 3);
    }
}
