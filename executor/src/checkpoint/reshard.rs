//! [`SavedLayout`]: how a plan spreads the flat parameter vector over the ranks, saved with a
//! checkpoint so that every rank's partition (master weights, Adam's moments, stage 3
//! parameter shards) can be put back together into full flat vectors
//! ([`SavedLayout::consolidate`], padding dropped, as `zero_to_fp32` does) and cut again for
//! another world size or stage ([`SavedLayout::slice`]): what DeepSpeed's universal checkpoint
//! conversion does, done directly because the layout is in the plan.
//!
//! * stages 0-2 (flat layout): rank `r` owns the flat range `owned[r]`; the padding at the end
//!   is zero;
//! * stage 3 (per-parameter layout): rank `r` owns `pieces[r]` of every tensor, stored at the
//!   tensor's `shard_offset` in its shard, followed by zero padding up to the tensor's chunk.

use serde::{Deserialize, Serialize};

use crate::model::ParamTable;
use crate::zero::EnginePlan;

/// A plan's layout of the flat parameters over the ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedLayout {
    /// The stage the engines ran, 0-3.
    pub engine_stage: u8,
    /// Ranks.
    pub world: usize,
    /// Elements of real data.
    pub numel: usize,
    /// Elements after padding (stages 1/2).
    pub padded: usize,
    /// Elements per rank (stages 1/2).
    pub partition: usize,
    /// Elements of each rank's optimizer partition.
    pub owned_len: usize,
    /// Stages 0-2: each rank's flat range `[start, end)`.
    pub owned: Vec<[usize; 2]>,
    /// The parameter tensors, in buffer order.
    pub tensors: Vec<SavedTensor>,
}

/// One parameter tensor in a [`SavedLayout`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedTensor {
    /// Its Hugging Face name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Where it starts in the flat buffer.
    pub offset: usize,
    /// Its elements.
    pub numel: usize,
    /// Stage 3: where its slice starts in a shard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_offset: Option<usize>,
    /// Stage 3: the elements (within the tensor) each rank owns, `[start, end)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pieces: Vec<[usize; 2]>,
}

impl SavedLayout {
    /// The layout `plan` gives the parameters of `params`.
    pub fn of(plan: &EnginePlan, params: &(impl ParamTable + ?Sized)) -> Self {
        let flat = plan.flat();
        let stage = plan.stage() as u8;
        let world = plan.world();
        let sharded = stage == 3;
        let shards = plan.shards();
        let tensors = params
            .tensors()
            .entries()
            .iter()
            .zip(plan.tensors())
            .enumerate()
            .map(|(t, (entry, span))| SavedTensor {
                name: entry.name.clone(),
                shape: entry.shape.clone(),
                offset: span.offset,
                numel: span.len,
                shard_offset: sharded.then(|| shards.offset(t)),
                pieces: if sharded {
                    (0..world)
                        .map(|r| {
                            let p = shards.piece(t, r);
                            [p.start, p.end]
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            })
            .collect();
        Self {
            engine_stage: stage,
            world,
            numel: flat.numel,
            padded: flat.padded,
            partition: flat.partition,
            owned_len: plan.owned(0).len(),
            owned: (0..world)
                .map(|r| {
                    let o = plan.owned(r);
                    [o.start, o.end]
                })
                .collect(),
            tensors,
        }
    }

    /// How many ranks hold distinct partitions (stage 0 replicates: one).
    pub fn partition_count(&self) -> usize {
        if self.engine_stage == 0 {
            1
        } else {
            self.world
        }
    }

    /// Whether the layout is stage 3's per-parameter sharding.
    pub fn is_sharded(&self) -> bool {
        self.engine_stage == 3
    }

    /// The full flat vector (`numel` elements, padding dropped) from the partitions of ranks
    /// `0..partition_count()`, each `owned_len` long. `Err` names the rank whose partition
    /// has the wrong length or a layout that does not add up.
    pub fn consolidate(&self, parts: &[Vec<f32>]) -> Result<Vec<f32>, String> {
        if parts.len() != self.partition_count() {
            return Err(format!(
                "{} partition(s) given, the layout has {}",
                parts.len(),
                self.partition_count()
            ));
        }
        if let Some((rank, part)) = parts
            .iter()
            .enumerate()
            .find(|(_, p)| p.len() != self.owned_len)
        {
            return Err(format!(
                "rank {rank}'s partition has {} elements, the layout gives it {}",
                part.len(),
                self.owned_len
            ));
        }
        let mut full = vec![0.0f32; self.numel];
        if self.is_sharded() {
            for tensor in &self.tensors {
                let base = tensor.shard_offset.unwrap_or(0);
                for (part, &[start, end]) in parts.iter().zip(&tensor.pieces) {
                    let (Some(to), Some(from)) = (
                        full.get_mut(tensor.offset + start..tensor.offset + end),
                        part.get(base..base + end - start),
                    ) else {
                        return Err(format!("tensor `{}` lies outside the buffers", tensor.name));
                    };
                    to.copy_from_slice(from);
                }
            }
        } else {
            for (part, &[start, end]) in parts.iter().zip(&self.owned) {
                let end = end.min(self.numel);
                if start < end {
                    let Some(from) = part.get(..end - start) else {
                        return Err(format!("the range [{start}, {end}) exceeds a partition"));
                    };
                    full[start..end].copy_from_slice(from);
                }
            }
        }
        Ok(full)
    }

    /// Rank `rank`'s partition of the full flat vector `full` (`numel` elements): its owned
    /// range or its shard, zero where the layout pads.
    pub fn slice(&self, rank: usize, full: &[f32]) -> Vec<f32> {
        let mut part = vec![0.0f32; self.owned_len];
        if self.is_sharded() {
            for tensor in &self.tensors {
                let base = tensor.shard_offset.unwrap_or(0);
                if let Some(&[start, end]) = tensor.pieces.get(rank) {
                    part[base..base + end - start]
                        .copy_from_slice(&full[tensor.offset + start..tensor.offset + end]);
                }
            }
        } else if let Some(&[start, end]) = self.owned.get(rank) {
            let end = end.min(full.len());
            if start < end {
                part[..end - start].copy_from_slice(&full[start..end]);
            }
        }
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sharded() -> SavedLayout {
        // Two tensors of 3 and 2 elements over 2 ranks: chunks of 2 and 1.
        SavedLayout {
            engine_stage: 3,
            world: 2,
            numel: 5,
            padded: 5,
            partition: 3,
            owned_len: 3,
            owned: vec![[0, 3], [0, 3]],
            tensors: vec![
                SavedTensor {
                    name: "a".into(),
                    shape: vec![3],
                    offset: 0,
                    numel: 3,
                    shard_offset: Some(0),
                    pieces: vec![[0, 2], [2, 3]],
                },
                SavedTensor {
                    name: "b".into(),
                    shape: vec![2],
                    offset: 3,
                    numel: 2,
                    shard_offset: Some(2),
                    pieces: vec![[0, 1], [1, 2]],
                },
            ],
        }
    }

    #[test]
    fn shards_are_cut_and_put_back() {
        let layout = sharded();
        let full = [1.0, 2.0, 3.0, 4.0, 5.0];
        let parts: Vec<Vec<f32>> = (0..2).map(|r| layout.slice(r, &full)).collect();
        assert_eq!(parts, vec![vec![1.0, 2.0, 4.0], vec![3.0, 0.0, 5.0]]);
        assert_eq!(layout.consolidate(&parts).expect("fits"), full);
        let error = layout
            .consolidate(&parts[..1])
            .expect_err("one rank missing");
        assert!(error.contains("1 partition"), "{error}");
    }

    #[test]
    fn flat_partitions_drop_their_padding() {
        let layout = SavedLayout {
            engine_stage: 2,
            world: 2,
            numel: 3,
            padded: 4,
            partition: 2,
            owned_len: 2,
            owned: vec![[0, 2], [2, 4]],
            tensors: Vec::new(),
        };
        let full = [1.0, 2.0, 3.0];
        let parts: Vec<Vec<f32>> = (0..2).map(|r| layout.slice(r, &full)).collect();
        assert_eq!(parts, vec![vec![1.0, 2.0], vec![3.0, 0.0]]);
        assert_eq!(layout.consolidate(&parts).expect("fits"), full);
    }
}
