//! [`Stage3Arena`]: where dsplan's CUDA step keeps stage 3's gathered parameters. Instead of
//! one buffer the size of the whole model, a rank keeps one arena and the plan places every
//! gathered tensor of every trace step in it, from the stage-3 schedule's live intervals
//! (`Stage3Schedule::intervals`): two tensors gathered at the same time never share an
//! element, and a tensor released by the schedule leaves its place to a later gather. The
//! arena is what the schedule's releases save on the device.
//!
//! Placement:
//! 1. the persistent tensors (gathered throughout) first, back to back, in model order;
//! 2. every gathered interval at the lowest offset free for the whole interval (first fit),
//!    in two orders, keeping the smaller arena: by the step that gathers it (larger tensors
//!    first within a step), and by size (largest first). A tensor gathered twice in a
//!    micro-step (forward, then again for backward) is placed once per interval and may land
//!    elsewhere the second time;
//! 3. if first fit needs more than the whole model (fragmentation), every tensor takes its
//!    place in model order instead ([`ArenaPacking::ModelOrder`]): never larger than the model.
//!
//! The device step fuses one pair of modules DeepSpeed runs apart: GPT-2's encoder kernel
//! reads `wte` and `wpe` in one op, at `wpe`'s forward step ([`fused_reads`]). Where the
//! schedule released `wte` before that step, its interval is extended through it, so the
//! arena holds every tensor for every step the device reads it in. The executor releases a
//! tensor after the last step of its place ([`Stage3Arena::released_after`]).
//!
//! The executor reads the placement ([`Stage3Arena::span_at`]) and decides nothing.

use serde::Serialize;

use super::model_graph::ModelGraph;
use std::cmp::Reverse;

/// One tensor's gathered interval, in trace steps (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GatheredInterval {
    /// Model tensor.
    pub tensor: usize,
    /// Step whose fetch or prefetch gathered it.
    pub from: usize,
    /// Last step it stays gathered through.
    pub to: usize,
}

/// How a tensor stays in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Residency {
    /// Gathered throughout (the persistent set): one place for the whole step.
    Persistent,
    /// Gathered by the schedule's fetch or prefetch, released after its last step.
    Gathered,
}

/// How the arena was packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ArenaPacking {
    /// First fit over the schedule's live intervals.
    FirstFit,
    /// Every tensor at its place in model order (first fit would have needed more).
    ModelOrder,
}

/// One tensor's place in the arena over trace steps `from..=to`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArenaSpan {
    /// Model tensor (index into [`ModelGraph::tensors`]).
    pub tensor: usize,
    /// Persistent or gathered.
    pub residency: Residency,
    /// The trace step whose fetch or prefetch gathers it (0 for a persistent tensor).
    pub from: usize,
    /// The last trace step it stays gathered through.
    pub to: usize,
    /// First element in the arena (model dtype).
    pub offset: u64,
    /// Elements (the whole tensor).
    pub numel: u64,
}

impl ArenaSpan {
    /// One past its last element.
    pub fn end(&self) -> u64 {
        self.offset + self.numel
    }

    /// Whether it is gathered at trace step `step`.
    pub fn live_at(&self, step: usize) -> bool {
        self.from <= step && step <= self.to
    }

    /// Whether the two are gathered at a common trace step.
    pub fn meets(&self, other: &ArenaSpan) -> bool {
        self.from <= other.to && other.from <= self.to
    }

    /// Whether the two share an element of the arena.
    pub fn overlaps(&self, other: &ArenaSpan) -> bool {
        self.offset < other.end() && other.offset < self.end()
    }
}

/// The placement of every gathered tensor of a stage-3 micro-step in one device arena (see
/// the [module documentation](self)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stage3Arena {
    /// The arena's elements (model dtype).
    pub numel: u64,
    /// How it was packed.
    pub packing: ArenaPacking,
    /// Every place: the persistent tensors, then the gathered intervals in placement order.
    pub spans: Vec<ArenaSpan>,
}

impl Stage3Arena {
    /// Places the tensors of `model` gathered over `gathered` (a stage-3 schedule's intervals
    /// over its `steps` trace steps); `persistent` are the persistent tensors (model tensor
    /// indices); `reads` the device's reads outside a tensor's own units,
    /// `(tensor, trace step)` ([`fused_reads`]).
    pub fn place(
        model: &ModelGraph,
        (gathered, steps): (&[GatheredInterval], usize),
        persistent: &[usize],
        reads: &[(usize, usize)],
    ) -> Self {
        let numel = |t: usize| model.tensors.get(t).map_or(0, |p| p.numel);
        let last = steps.saturating_sub(1);
        let mut spans: Vec<ArenaSpan> = Vec::new();
        let mut offset = 0;
        let mut persistent = persistent.to_vec();
        persistent.sort_unstable();
        persistent.dedup();
        for &tensor in &persistent {
            spans.push(ArenaSpan {
                tensor,
                residency: Residency::Persistent,
                from: 0,
                to: last,
                offset,
                numel: numel(tensor),
            });
            offset += numel(tensor);
        }
        let mut intervals = gathered.to_vec();
        for &(tensor, step) in reads {
            let held = intervals
                .iter()
                .any(|i| i.tensor == tensor && i.from <= step && step <= i.to);
            let before = intervals
                .iter_mut()
                .filter(|i| i.tensor == tensor && i.to < step)
                .max_by_key(|i| i.to);
            if let (false, Some(interval)) = (held, before) {
                interval.to = step;
            }
        }
        let by_step = |i: &GatheredInterval| (i.from, Reverse(numel(i.tensor)), i.tensor);
        let by_size = |i: &GatheredInterval| (Reverse(numel(i.tensor)), i.from, i.tensor);
        let mut in_step_order = intervals.clone();
        in_step_order.sort_by_key(by_step);
        intervals.sort_by_key(by_size);
        let mut spans = [in_step_order, intervals]
            .into_iter()
            .map(|order| first_fit_all(spans.clone(), order, numel))
            .min_by_key(|placed| placed.iter().map(ArenaSpan::end).max().unwrap_or(0))
            .unwrap_or_default();
        let needed = spans.iter().map(ArenaSpan::end).max().unwrap_or(0);
        if needed <= model.total_params() {
            return Self {
                numel: needed,
                packing: ArenaPacking::FirstFit,
                spans,
            };
        }
        let mut model_offset = Vec::with_capacity(model.tensors.len());
        let mut at = 0;
        for tensor in &model.tensors {
            model_offset.push(at);
            at += tensor.numel;
        }
        for span in &mut spans {
            span.offset = model_offset.get(span.tensor).copied().unwrap_or(0);
        }
        Self {
            numel: model.total_params(),
            packing: ArenaPacking::ModelOrder,
            spans,
        }
    }

    /// Where `tensor` is while trace step `step` runs (`None`: not gathered then).
    pub fn span_at(&self, tensor: usize, step: usize) -> Option<&ArenaSpan> {
        self.spans
            .iter()
            .find(|s| s.tensor == tensor && s.live_at(step))
    }

    /// The gathered tensors whose places end with trace step `step`: released after it.
    pub fn released_after(&self, step: usize) -> Vec<usize> {
        self.spans
            .iter()
            .filter(|s| s.residency == Residency::Gathered && s.to == step)
            .map(|s| s.tensor)
            .collect()
    }

    /// The persistent tensors' places.
    pub fn persistent(&self) -> impl Iterator<Item = &ArenaSpan> {
        self.spans
            .iter()
            .filter(|s| s.residency == Residency::Persistent)
    }

    /// The largest number of elements gathered at one trace step (persistent included): the
    /// least any placement needs.
    pub fn peak_live_numel(&self) -> u64 {
        let steps = self.spans.iter().map(|s| s.to + 1).max().unwrap_or(0);
        (0..steps)
            .map(|step| {
                self.spans
                    .iter()
                    .filter(|s| s.live_at(step))
                    .map(|s| s.numel)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0)
    }
}

/// The device's parameter reads outside a tensor's own fetch units, `(tensor, trace step)`:
/// GPT-2's encoder kernel reads `transformer.wte.weight` together with
/// `transformer.wpe.weight`, at the forward step of `wpe`'s unit (its trace step is the
/// unit's index). Empty for models without both.
pub fn fused_reads(model: &ModelGraph) -> Vec<(usize, usize)> {
    let tensor = |name: &str| model.tensors.iter().position(|t| t.name == name);
    let unit_of = |t: usize| model.units.iter().position(|u| u.tensors.contains(&t));
    match (
        tensor("transformer.wte.weight"),
        tensor("transformer.wpe.weight"),
    ) {
        (Some(wte), Some(wpe)) => unit_of(wpe).map(|u| vec![(wte, u)]).unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// `placed` and every interval of `order` placed after them by first fit, in that order.
fn first_fit_all(
    mut placed: Vec<ArenaSpan>,
    order: Vec<GatheredInterval>,
    numel: impl Fn(usize) -> u64,
) -> Vec<ArenaSpan> {
    for interval in order {
        let mut span = ArenaSpan {
            tensor: interval.tensor,
            residency: Residency::Gathered,
            from: interval.from,
            to: interval.to,
            offset: 0,
            numel: numel(interval.tensor),
        };
        span.offset = first_fit(&placed, &span);
        placed.push(span);
    }
    placed
}

/// The lowest offset where `span` overlaps no placed span gathered at a common step.
fn first_fit(placed: &[ArenaSpan], span: &ArenaSpan) -> u64 {
    let mut busy: Vec<(u64, u64)> = placed
        .iter()
        .filter(|p| p.meets(span) && p.numel > 0)
        .map(|p| (p.offset, p.end()))
        .collect();
    busy.sort_unstable();
    let mut candidate = 0;
    for (start, end) in busy {
        if start >= candidate + span.numel {
            break;
        }
        candidate = candidate.max(end);
    }
    candidate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_a_released_place_and_keeps_live_ones_apart() {
        let placed = vec![
            ArenaSpan {
                tensor: 0,
                residency: Residency::Gathered,
                from: 0,
                to: 1,
                offset: 0,
                numel: 10,
            },
            ArenaSpan {
                tensor: 1,
                residency: Residency::Gathered,
                from: 1,
                to: 2,
                offset: 10,
                numel: 5,
            },
        ];
        let later = ArenaSpan {
            tensor: 2,
            residency: Residency::Gathered,
            from: 2,
            to: 3,
            offset: 0,
            numel: 10,
        };
        assert_eq!(
            first_fit(&placed, &later),
            0,
            "tensor 0 was released at step 1"
        );
        let meanwhile = ArenaSpan { from: 1, ..later };
        assert_eq!(
            first_fit(&placed, &meanwhile),
            15,
            "both are live at step 1"
        );
        let small = ArenaSpan {
            numel: 3,
            from: 2,
            ..later
        };
        assert_eq!(first_fit(&placed, &small), 0);
    }
}
