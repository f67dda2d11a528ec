//! The pipeline schedule: which micro-batches each rank holds at once, and the timeline of a
//! step in ticks.
//!
//! Megatron-LM's orders (`megatron/core/pipeline_parallel/schedules.py`), which DeepSpeed's
//! PipelineEngine shares for 1F1B:
//! - **1F1B**: rank `r` of `p` runs `min(p - r - 1, m)` warm-up forwards, then alternates one
//!   forward and one backward, then drains; it holds at most `min(p - r, m)` micro-batches.
//! - **interleaved** (`v` chunks per rank): forwards go through the chunks in groups of `p`
//!   micro-batches; rank `r` warms up with `(p - r - 1)·2 + (v - 1)·p` forwards (capped at all
//!   `m·v`), so it holds up to one more virtual micro-batch than that, each of `L/(p·v)`
//!   layers.
//!
//! A tick is the forward of one model chunk; its backward takes two. The timeline runs every
//! rank's operations in that order, each as soon as its input has arrived; the bubble is the
//! idle share of the step.

use serde::Serialize;

use super::layout::{Layout, PipelineSchedule};

/// Forwards of the interleaved schedule in order, as (micro-batch, chunk): groups of `group`
/// micro-batches go through every chunk (Megatron's `get_schedule_table`).
pub fn forward_order(micro_batches: u64, chunks: u64, group: u64) -> Vec<(u64, u64)> {
    let group = group.max(1);
    let mut order = Vec::new();
    let mut first = 0;
    while first < micro_batches {
        let end = if first + group >= micro_batches {
            micro_batches
        } else {
            first + group
        };
        for chunk in 0..chunks {
            for micro_batch in first..end {
                order.push((micro_batch, chunk));
            }
        }
        first = end;
    }
    order
}

/// Warm-up forwards of pipeline rank `rank`.
pub fn warmup(layout: &Layout, micro_batches: u64, rank: u64) -> u64 {
    let p = layout.pipeline;
    let total = micro_batches * layout.schedule.chunks();
    if p <= 1 {
        return 0;
    }
    let warm = match layout.schedule {
        PipelineSchedule::OneForwardOneBackward => p - rank - 1,
        PipelineSchedule::Interleaved { virtual_stages } => {
            (p - rank - 1) * 2 + (virtual_stages - 1) * p
        }
    };
    warm.min(total)
}

/// The most (virtual) micro-batches rank `rank` holds at once, and how many of them are of
/// each chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InFlight {
    /// Virtual micro-batches held at the peak.
    pub total: u64,
    /// Of those, per model chunk of the rank.
    pub per_chunk: Vec<u64>,
}

/// What rank `rank` holds at its peak: the forwards run before its first backward.
pub fn in_flight(layout: &Layout, micro_batches: u64, rank: u64) -> InFlight {
    let chunks = layout.schedule.chunks();
    let total_ops = micro_batches * chunks;
    let held = (warmup(layout, micro_batches, rank) + 1).min(total_ops);
    let order = forward_order(micro_batches, chunks, layout.pipeline);
    let mut per_chunk = vec![0; chunks as usize];
    for &(_, chunk) in order.iter().take(held as usize) {
        per_chunk[chunk as usize] += 1;
    }
    InFlight {
        total: held,
        per_chunk,
    }
}

/// A forward or a backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    /// Forward.
    Forward,
    /// Backward.
    Backward,
}

/// One operation on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Op {
    /// Forward or backward.
    pub pass: Pass,
    /// The micro-batch.
    pub micro_batch: u64,
    /// The model chunk of the rank (0 without interleaving).
    pub chunk: u64,
    /// First tick.
    pub start: u64,
    /// Tick after the last.
    pub end: u64,
}

/// The timeline of one step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// Ticks of one forward of one chunk (backward: twice that).
    pub ticks_per_forward: u64,
    /// Ticks of the whole step (forward and backward of all micro-batches).
    pub makespan: u64,
    /// Idle share of the step, averaged over the ranks.
    pub bubble_fraction: f64,
    /// Each rank's operations in order.
    pub ranks: Vec<Vec<Op>>,
}

/// The ops of rank `rank`, in execution order, without times.
fn rank_order(layout: &Layout, micro_batches: u64, rank: u64) -> Vec<(Pass, u64, u64)> {
    let chunks = layout.schedule.chunks();
    let forwards = forward_order(micro_batches, chunks, layout.pipeline);
    let backwards: Vec<(u64, u64)> = forwards
        .iter()
        .map(|&(mb, c)| (mb, chunks - 1 - c))
        .collect();
    let warm = warmup(layout, micro_batches, rank) as usize;
    let total = forwards.len();
    let mut ops = Vec::with_capacity(2 * total);
    for &(mb, c) in &forwards[..warm] {
        ops.push((Pass::Forward, mb, c));
    }
    for k in 0..total - warm {
        let (mb, c) = forwards[warm + k];
        ops.push((Pass::Forward, mb, c));
        let (mb, c) = backwards[k];
        ops.push((Pass::Backward, mb, c));
    }
    for &(mb, c) in &backwards[total - warm..] {
        ops.push((Pass::Backward, mb, c));
    }
    ops
}

/// Simulates one step; `None` when it is too large to draw (over `limit` operations).
pub fn timeline(layout: &Layout, micro_batches: u64, limit: u64) -> Option<Timeline> {
    let p = layout.pipeline;
    let chunks = layout.schedule.chunks();
    if micro_batches == 0 || p * micro_batches * chunks * 2 > limit {
        return None;
    }
    let orders: Vec<Vec<(Pass, u64, u64)>> = (0..p)
        .map(|r| rank_order(layout, micro_batches, r))
        .collect();
    let index = |mb: u64, c: u64| (mb * chunks + c) as usize;
    let slots = (micro_batches * chunks) as usize;
    // End tick of each (rank, pass, micro-batch, chunk).
    let mut forward_end = vec![vec![None; slots]; p as usize];
    let mut backward_end = vec![vec![None; slots]; p as usize];
    let mut next = vec![0usize; p as usize];
    let mut free = vec![0u64; p as usize];
    let mut ranks: Vec<Vec<Op>> = vec![Vec::new(); p as usize];
    loop {
        let mut progressed = false;
        for r in 0..p as usize {
            while let Some(&(pass, mb, c)) = orders[r].get(next[r]) {
                let ready = match pass {
                    Pass::Forward => {
                        if r > 0 {
                            forward_end[r - 1][index(mb, c)]
                        } else if c > 0 {
                            forward_end[p as usize - 1][index(mb, c - 1)]
                        } else {
                            Some(0)
                        }
                    }
                    Pass::Backward => {
                        if r + 1 < p as usize {
                            backward_end[r + 1][index(mb, c)]
                        } else if c + 1 < chunks {
                            backward_end[0][index(mb, c + 1)]
                        } else {
                            forward_end[r][index(mb, c)]
                        }
                    }
                };
                let Some(ready) = ready else { break };
                let start = ready.max(free[r]);
                let end = start + if pass == Pass::Forward { 1 } else { 2 };
                free[r] = end;
                match pass {
                    Pass::Forward => forward_end[r][index(mb, c)] = Some(end),
                    Pass::Backward => backward_end[r][index(mb, c)] = Some(end),
                }
                ranks[r].push(Op {
                    pass,
                    micro_batch: mb,
                    chunk: c,
                    start,
                    end,
                });
                next[r] += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    if next.iter().zip(&orders).any(|(n, o)| *n < o.len()) {
        return None;
    }
    let makespan = free.iter().copied().max().unwrap_or(0);
    let busy = 3 * micro_batches * chunks * p;
    let bubble_fraction = if makespan == 0 {
        0.0
    } else {
        1.0 - busy as f64 / (makespan * p) as f64
    };
    Some(Timeline {
        ticks_per_forward: 1,
        makespan,
        bubble_fraction,
        ranks,
    })
}

/// The bubble without simulating: `(p - 1) / (v·m + p - 1)` of the step.
pub fn bubble_fraction(layout: &Layout, micro_batches: u64) -> f64 {
    let p = layout.pipeline as f64;
    let vm = (layout.schedule.chunks() * micro_batches) as f64;
    (p - 1.0) / (vm + p - 1.0)
}

/// The layers of rank `rank`'s chunks, as half-open ranges.
pub fn layer_ranges(layout: &Layout, layers: u64, rank: u64) -> Vec<(u64, u64)> {
    let chunks = layout.schedule.chunks();
    let per_chunk = layers / (layout.pipeline * chunks);
    (0..chunks)
        .map(|c| {
            let start = (c * layout.pipeline + rank) * per_chunk;
            (start, start + per_chunk)
        })
        .collect()
}
