//! [`Shards`]: which elements of optimizer state, gradients and parameters each rank owns, as
//! rules rather than lists, plus the stage-3 persistent set and the optimizer's sub-groups.
//!
//! Ownership is arithmetic ([`ShardRule`]): at 1,024 ranks and thousands of tensors a listing
//! would have millions of rows. [`Shards::owned_ranges`] answers for one rank; the per-rank
//! table ([`Shards::ranks`]) is materialised only for worlds of at most
//! [`LISTED_RANKS_LIMIT`] ranks.
//!
//! Element ranges are in *model element space*: the tensors of the layout, in buffer order,
//! back to back without padding (`0..numel`).

use serde::Serialize;

use super::dtype::Device;
use super::layout::{Layout, LayoutScheme};
use super::settings::{OffloadTarget, Settings};
use crate::config::ZeroStage;

/// Worlds up to this size get a per-rank table in the plan.
pub const LISTED_RANKS_LIMIT: u64 = 64;

/// How one kind of state is divided among ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum ShardRule {
    /// Every rank holds everything.
    Replicated,
    /// Rank r owns [r·P, (r+1)·P) of the padded flat buffer.
    FlatEqual {
        /// P.
        partition_numel: u64,
    },
    /// Rank r owns [r·p, (r+1)·p) of every tensor, p = ⌈numel/N⌉.
    PerParameter,
}

/// A half-open range of elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ElementRange {
    /// First element.
    pub start: u64,
    /// One past the last.
    pub end: u64,
}

impl ElementRange {
    /// Elements in the range.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

/// One rank's share, for display.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RankShard {
    /// The rank.
    pub rank: u64,
    /// Real (non-padding) elements it owns.
    pub owned_numel: u64,
    /// Padding elements in its partition.
    pub padding: u64,
    /// First tensor its partition touches, and the offset into that tensor (stages 1/2).
    pub first: Option<(String, u64)>,
    /// Last tensor its partition touches.
    pub last: Option<String>,
}

/// Stage 3's persistent parameters: kept whole on every rank, never released.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PersistentSet {
    /// Layout entries (indices into [`Layout::entries`]).
    pub entries: Vec<usize>,
    /// Their elements.
    pub numel: u64,
}

/// A group of parameters the optimizer steps together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubGroup {
    /// Position.
    pub index: usize,
    /// First layout entry.
    pub first_entry: usize,
    /// One past the last layout entry.
    pub end_entry: usize,
    /// Elements each rank steps in this group (its partition of the group).
    pub partition_numel: u64,
    /// Where its master weights and optimizer state live and the step runs.
    pub device: Device,
}

/// Ownership of every kind of state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shards {
    /// Ranks.
    pub world_size: u64,
    /// Optimizer states and master weights.
    pub optimizer_states: ShardRule,
    /// Gradients after reduction.
    pub gradients: ShardRule,
    /// Parameters at rest.
    pub parameters: ShardRule,
    /// Stage 3's persistent tensors.
    pub persistent: Option<PersistentSet>,
    /// Optimizer sub-groups (one group below stage 3).
    pub sub_groups: Vec<SubGroup>,
    /// Per-rank table, for worlds of at most [`LISTED_RANKS_LIMIT`] ranks.
    pub ranks: Option<Vec<RankShard>>,
}

impl Shards {
    /// The shards of `layout` under `settings`.
    pub fn new(layout: &Layout, settings: &Settings) -> Shards {
        let world = settings.world_size;
        let partitioned = match layout.scheme {
            LayoutScheme::Flat => ShardRule::FlatEqual {
                partition_numel: layout.partition_numel,
            },
            LayoutScheme::PerParameter => ShardRule::PerParameter,
        };
        let rule_if = |on: bool| {
            if on {
                partitioned
            } else {
                ShardRule::Replicated
            }
        };
        let persistent = settings.stage3.map(|s3| persistent_set(layout, &s3));
        let mut shards = Shards {
            world_size: world,
            optimizer_states: rule_if(settings.partitions_optimizer()),
            gradients: rule_if(settings.partitions_gradients()),
            parameters: rule_if(settings.partitions_params()),
            persistent,
            sub_groups: sub_groups(layout, settings),
            ranks: None,
        };
        if world <= LISTED_RANKS_LIMIT && settings.stage != ZeroStage::Disabled {
            shards.ranks = Some((0..world).map(|r| shards.rank_shard(layout, r)).collect());
        }
        shards
    }

    /// The elements (model element space) rank `rank` owns under `rule`.
    pub fn owned_ranges(
        layout: &Layout,
        rule: ShardRule,
        world: u64,
        rank: u64,
    ) -> Vec<ElementRange> {
        match rule {
            ShardRule::Replicated => vec![ElementRange {
                start: 0,
                end: layout.numel,
            }],
            ShardRule::FlatEqual { partition_numel } => {
                let start = (rank * partition_numel).min(layout.numel);
                let end = ((rank + 1) * partition_numel).min(layout.numel);
                vec![ElementRange { start, end }]
            }
            ShardRule::PerParameter => {
                let mut ranges = Vec::with_capacity(layout.entries.len());
                let mut base = 0;
                for entry in &layout.entries {
                    let p = entry.numel.div_ceil(world);
                    let start = (rank * p).min(entry.numel);
                    let end = ((rank + 1) * p).min(entry.numel);
                    if end > start {
                        ranges.push(ElementRange {
                            start: base + start,
                            end: base + end,
                        });
                    }
                    base += entry.numel;
                }
                ranges
            }
        }
    }

    /// The widest rule in force (parameters, else gradients, else optimizer state).
    pub fn finest_rule(&self) -> ShardRule {
        [self.parameters, self.gradients, self.optimizer_states]
            .into_iter()
            .find(|r| *r != ShardRule::Replicated)
            .unwrap_or(ShardRule::Replicated)
    }

    fn rank_shard(&self, layout: &Layout, rank: u64) -> RankShard {
        let rule = self.finest_rule();
        let owned: u64 = Self::owned_ranges(layout, rule, self.world_size, rank)
            .iter()
            .map(ElementRange::len)
            .sum();
        let (first, last) = match rule {
            ShardRule::FlatEqual { partition_numel } => {
                let start = rank * partition_numel;
                let end = (start + partition_numel).min(layout.numel);
                let touching =
                    |e: &&super::layout::LayoutEntry| e.offset < end && e.offset + e.numel > start;
                let first = layout
                    .entries
                    .iter()
                    .find(touching)
                    .map(|e| (e.name.clone(), start.saturating_sub(e.offset)));
                let last = layout
                    .entries
                    .iter()
                    .rev()
                    .find(touching)
                    .map(|e| e.name.clone());
                (first, last)
            }
            _ => (None, None),
        };
        RankShard {
            rank,
            owned_numel: owned,
            padding: layout.partition_numel - owned.min(layout.partition_numel),
            first,
            last,
        }
    }
}

/// Tensors under the persistence threshold, in parameter order, within the model-wide cap.
fn persistent_set(layout: &Layout, s3: &super::settings::Stage3Settings) -> PersistentSet {
    let mut entries = Vec::new();
    let mut numel = 0u64;
    let mut by_model_order: Vec<usize> = (0..layout.entries.len()).collect();
    by_model_order.sort_by_key(|&i| layout.entries[i].tensor);
    for index in by_model_order {
        let n = layout.entries[index].numel;
        if n <= s3.param_persistence_threshold
            && numel.saturating_add(n) <= s3.model_persistence_threshold
        {
            entries.push(index);
            numel += n;
        }
    }
    entries.sort_unstable();
    PersistentSet { entries, numel }
}

/// Sub-groups: stage 3 accumulates tensors until their partitions reach `sub_group_size`
/// (the last tensor may overshoot); below stage 3 the whole partition is one group.
fn sub_groups(layout: &Layout, settings: &Settings) -> Vec<SubGroup> {
    let device = match settings.offload_optimizer {
        OffloadTarget::None => Device::Gpu,
        OffloadTarget::Cpu { .. } => Device::Cpu,
        OffloadTarget::Nvme { .. } => Device::Nvme,
    };
    let Some(s3) = settings.stage3 else {
        return vec![SubGroup {
            index: 0,
            first_entry: 0,
            end_entry: layout.entries.len(),
            partition_numel: layout.partition_numel,
            device,
        }];
    };
    let mut groups = Vec::new();
    let mut first = 0;
    let mut size = 0;
    for (index, entry) in layout.entries.iter().enumerate() {
        size += entry.partition_numel;
        if size >= s3.sub_group_size || index + 1 == layout.entries.len() {
            groups.push(SubGroup {
                index: groups.len(),
                first_entry: first,
                end_entry: index + 1,
                partition_numel: size,
                device,
            });
            first = index + 1;
            size = 0;
        }
    }
    // Partial offload: the first ⌊ratio × groups⌋ run on the CPU, the rest on the GPU.
    if device != Device::Gpu && settings.offload_ratio < 1.0 {
        let offloaded = (settings.offload_ratio * groups.len() as f64) as usize;
        for group in groups.iter_mut().skip(offloaded) {
            group.device = Device::Gpu;
        }
    }
    groups
}
