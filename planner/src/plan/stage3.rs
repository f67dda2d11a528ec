//! [`Stage3Schedule`]: stage 3's parameter fetch schedule for one micro-step, replayed the way
//! DeepSpeed's `PartitionedParameterCoordinator` runs it once its trace is complete (from the
//! second forward on; the first forward records the trace and prefetches nothing).
//!
//! The trace is every fetch unit (a module's directly owned parameters) in forward order, then
//! in backward (reverse) order. At each step:
//! 1. **fetch**: the unit's tensors that are not gathered are all-gathered on demand;
//! 2. its own entries are popped off the front of the parameter queue;
//! 3. **prefetch**: entries are popped while the elements being prefetched stay below
//!    min(`stage3_max_live_parameters` − gathered elements, `stage3_prefetch_bucket_size`);
//!    tensors not gathered are all-gathered, the others only marked as "fetched for" that later
//!    use. Prefetching stops at an NVMe-resident partition;
//! 4. the module computes;
//! 5. **release**: its non-persistent tensors are released unless already claimed by the
//!    prefetcher for a later use, or used again by a module within the next
//!    `stage3_max_reuse_distance` elements of the trace.
//!
//! Persistent tensors are gathered throughout. Whatever is still gathered at the end of
//! backward is released there. Modelled at tensor granularity, with steps counted over units
//! only (DeepSpeed also counts modules that own no parameters; that matters only when
//! `stage3_max_reuse_distance` is 0).

use serde::Serialize;

use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::settings::Stage3Settings;
use super::shards::PersistentSet;
use super::stage3_arena::{GatheredInterval, Stage3Arena};

/// Forward or backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// The forward pass.
    Forward,
    /// The backward pass.
    Backward,
}

/// The collective that gathers a unit's parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FetchCollective {
    /// `all_gather_into_tensor` of the coalesced partitions (the default).
    AllGather,
    /// `stage3_use_all_reduce_for_fetch_params`.
    AllReduce,
}

/// One step of the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScheduleStep {
    /// Position in the trace.
    pub step: usize,
    /// Fetch unit (index into [`ModelGraph::units`]).
    pub unit: usize,
    /// Forward or backward.
    pub pass: Pass,
    /// Tensors gathered on demand before the module runs.
    pub on_demand: Vec<usize>,
    /// Tensors prefetched here for later modules.
    pub prefetch: Vec<usize>,
    /// Gathered elements (persistent included) while the module runs.
    pub live_numel: u64,
    /// Gathered elements just before the prefetch was issued.
    pub live_before_prefetch: u64,
    /// Tensors released after the module.
    pub released: Vec<usize>,
    /// Tensors of the unit kept gathered after it (reused soon, or already prefetched).
    pub kept: Vec<usize>,
}

/// The stage-3 schedule of one micro-step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage3Schedule {
    /// The fetch collective.
    pub collective: FetchCollective,
    /// Every step, forward then backward.
    pub steps: Vec<ScheduleStep>,
    /// Tensors still gathered after the last step, released there.
    pub released_at_end: Vec<usize>,
    /// Elements of the persistent tensors (gathered throughout).
    pub persistent_numel: u64,
    /// Largest gathered element count while a module runs.
    pub peak_live_numel: u64,
    /// Every gathered interval of a non-persistent tensor.
    pub intervals: Vec<GatheredInterval>,
    /// dsplan's CUDA step at world sizes above 1: every gathered tensor's place in the
    /// device's parameter arena ([`super::stage3_arena`]; `None` for other backends).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arena: Option<Stage3Arena>,
}

impl Stage3Schedule {
    /// Number of units; the trace has twice as many steps.
    pub fn unit_count(&self) -> usize {
        self.steps.len() / 2
    }
}

/// The unit and pass of trace step `step` for `units` units.
pub fn trace_step(units: usize, step: usize) -> (usize, Pass) {
    if step < units {
        (step, Pass::Forward)
    } else {
        (2 * units - 1 - step, Pass::Backward)
    }
}

/// Replays the coordinator. `nvme_resident[t]`: tensor t's partition lives on NVMe (prefetch
/// stops there).
pub fn schedule(
    model: &ModelGraph,
    layout: &Layout,
    persistent: &PersistentSet,
    settings: &Stage3Settings,
    nvme_resident: &[bool],
) -> Stage3Schedule {
    let tensor_count = model.tensors.len();
    let numel: Vec<u64> = model.tensors.iter().map(|t| t.numel).collect();
    let mut is_persistent = vec![false; tensor_count];
    for &entry in &persistent.entries {
        is_persistent[layout.entries[entry].tensor] = true;
    }
    let units = model.units.len();
    let steps = 2 * units;
    let unit_of = |step: usize| trace_step(units, step).0;
    let queue: Vec<(usize, usize)> = (0..steps)
        .flat_map(|s| model.units[unit_of(s)].tensors.iter().map(move |&t| (t, s)))
        .collect();
    let reuse = ReuseIndex::new(model, &numel);
    let mut replay = Replay {
        gathered: is_persistent.clone(),
        gathered_since: vec![0; tensor_count],
        live: persistent.numel,
        most_recent: vec![i64::MIN; tensor_count],
        next: 0,
        intervals: Vec::new(),
    };
    let mut records = Vec::with_capacity(steps);
    let mut peak = persistent.numel;
    for step in 0..steps {
        let (unit, pass) = trace_step(units, step);
        let tensors = &model.units[unit].tensors;
        let on_demand: Vec<usize> = tensors
            .iter()
            .copied()
            .filter(|&t| !replay.gathered[t])
            .collect();
        for &t in &on_demand {
            replay.gather(t, numel[t], step);
        }
        replay.pop_own(tensors, step, &queue);
        let live_before_prefetch = replay.live;
        let prefetch = replay.prefetch(settings, &queue, &numel, nvme_resident, step);
        peak = peak.max(replay.live);
        let live_numel = replay.live;
        let (released, kept) =
            replay.release(&reuse, tensors, &is_persistent, settings, &numel, step);
        records.push(ScheduleStep {
            step,
            unit,
            pass,
            on_demand,
            prefetch,
            live_numel,
            live_before_prefetch,
            released,
            kept,
        });
    }
    let last = steps.saturating_sub(1);
    let released_at_end: Vec<usize> = (0..tensor_count)
        .filter(|&t| replay.gathered[t] && !is_persistent[t])
        .collect();
    for &t in &released_at_end {
        replay.release_one(t, numel[t], last);
    }
    Stage3Schedule {
        collective: if settings.fetch_with_all_reduce {
            FetchCollective::AllReduce
        } else {
            FetchCollective::AllGather
        },
        steps: records,
        released_at_end,
        persistent_numel: persistent.numel,
        peak_live_numel: peak,
        intervals: replay.intervals,
        arena: None,
    }
}

/// Where along the trace each tensor is used, and how many elements the trace has traversed
/// before each step: whether a tensor is used again within the reuse distance is then a binary
/// search, not a walk down the trace (which made a schedule quadratic in the layer count).
struct ReuseIndex {
    /// Per tensor, the trace steps whose unit holds it, ascending.
    uses: Vec<Vec<usize>>,
    /// `before[k]`: the elements of the tensors of trace steps `0..k` (each listing counted).
    before: Vec<u64>,
}

impl ReuseIndex {
    fn new(model: &ModelGraph, numel: &[u64]) -> Self {
        let units = model.units.len();
        let mut uses = vec![Vec::new(); numel.len()];
        let mut before = Vec::with_capacity(2 * units + 1);
        let mut total = 0u64;
        for step in 0..2 * units {
            before.push(total);
            for &t in &model.units[trace_step(units, step).0].tensors {
                uses[t].push(step);
                total = total.saturating_add(numel[t]);
            }
        }
        before.push(total);
        Self { uses, before }
    }

    /// Whether tensor `t`, used at `step`, is used again by a later step that the coordinator
    /// reaches before `max_distance` elements of the trace after `step` have gone by.
    fn used_again_within(&self, t: usize, step: usize, max_distance: u64) -> bool {
        let uses = &self.uses[t];
        let next = uses.partition_point(|&u| u <= step);
        uses.get(next)
            .is_some_and(|&u| self.before[u] - self.before[step + 1] < max_distance)
    }
}

/// The coordinator's state.
struct Replay {
    gathered: Vec<bool>,
    gathered_since: Vec<usize>,
    live: u64,
    most_recent: Vec<i64>,
    next: usize,
    intervals: Vec<GatheredInterval>,
}

impl Replay {
    fn gather(&mut self, tensor: usize, numel: u64, step: usize) {
        self.gathered[tensor] = true;
        self.gathered_since[tensor] = step;
        self.live += numel;
    }

    fn release_one(&mut self, tensor: usize, numel: u64, step: usize) {
        self.gathered[tensor] = false;
        self.live -= numel;
        self.intervals.push(GatheredInterval {
            tensor,
            from: self.gathered_since[tensor],
            to: step,
        });
    }

    /// Pops this step's own entries that no prefetch has popped already.
    fn pop_own(&mut self, tensors: &[usize], step: usize, queue: &[(usize, usize)]) {
        let wanted = tensors
            .iter()
            .filter(|&&t| self.most_recent[t] < step as i64)
            .count();
        let mut popped: Vec<usize> = Vec::with_capacity(wanted);
        while self.next < queue.len() && popped.len() < wanted {
            let (t, s) = queue[self.next];
            self.next += 1;
            self.most_recent[t] = s as i64;
            if !popped.contains(&t) {
                popped.push(t);
            }
        }
    }

    fn prefetch(
        &mut self,
        settings: &Stage3Settings,
        queue: &[(usize, usize)],
        numel: &[u64],
        nvme_resident: &[bool],
        step: usize,
    ) -> Vec<usize> {
        let mut batch = Vec::new();
        if settings.prefetch_bucket_size == 0 {
            return batch;
        }
        let headroom = i128::from(settings.max_live_parameters) - i128::from(self.live);
        let limit = headroom.min(i128::from(settings.prefetch_bucket_size));
        let mut prefetching: i128 = 0;
        while self.next < queue.len() && prefetching < limit {
            let (t, s) = queue[self.next];
            if nvme_resident.get(t).copied().unwrap_or(false) && !self.gathered[t] {
                break;
            }
            self.next += 1;
            self.most_recent[t] = self.most_recent[t].max(s as i64);
            // Gathered as it joins the batch (a search of the batch was quadratic in its
            // length); an NVMe-resident tensor never joins, so the check above is unchanged.
            if !self.gathered[t] {
                self.gather(t, numel[t], step);
                batch.push(t);
                prefetching += i128::from(numel[t]);
            }
        }
        batch
    }

    /// The step's non-persistent tensors split into those released and those kept: kept when
    /// the prefetcher claimed them for a later use, or when the trace uses them again before
    /// `max_reuse_distance` elements of it have gone by ([`ReuseIndex`]).
    fn release(
        &mut self,
        reuse: &ReuseIndex,
        tensors: &[usize],
        is_persistent: &[bool],
        settings: &Stage3Settings,
        numel: &[u64],
        step: usize,
    ) -> (Vec<usize>, Vec<usize>) {
        let next_step = step as i64 + 1;
        let (mut kept, mut candidates): (Vec<usize>, Vec<usize>) = tensors
            .iter()
            .copied()
            .filter(|&t| !is_persistent[t])
            .partition(|&t| {
                self.most_recent[t] > next_step
                    || reuse.used_again_within(t, step, settings.max_reuse_distance)
            });
        candidates.sort_unstable();
        kept.sort_unstable();
        let mut released = Vec::new();
        for t in candidates {
            if self.gathered[t] {
                self.release_one(t, numel[t], step);
                released.push(t);
            }
        }
        (released, kept)
    }
}
