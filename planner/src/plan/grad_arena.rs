//! The gradient arena of dsplan's CUDA step at ZeRO stages 2 and 3 (`W > 1`): backward writes
//! each gradient into a place of one arena instead of a whole-model gradient buffer, and the
//! place is free again once the gradient's bucket has been packed for its reduction. A rank
//! keeps the arena (the gradients in flight) and its gradient partition, as DeepSpeed keeps
//! its IPG bucket, the gradients of the modules whose hooks have not fired, and its
//! partition.
//!
//! Each gradient is live over backward trace steps `from..=to`:
//! - `from`: the first backward step whose unit holds the tensor (a tied embedding: the LM
//!   head's), or earlier where one device op writes it together with another tensor's gradient
//!   and runs at the first of their steps ([`fused_writes`]);
//! - `to`: the step whose gradient hook flushes its bucket (the last step for the buckets of
//!   the backward epilogue).
//!
//! The places are packed by the stage-3 arena's first fit ([`Stage3Arena::place`]): two
//! gradients live at a common step never share an element. The executor reads the placement and
//! decides nothing; it zeroes a place before its tensor's first write of a micro-step, after
//! the previous occupant's bucket has been packed.

use super::buckets::{FlushPoint, ReduceBucket};
use super::model_graph::ModelGraph;
use super::stage3::trace_step;
use super::stage3_arena::{GatheredInterval, Stage3Arena};

/// The gradient arena of one micro-step's backward, from the plan's `buckets` (reduced every
/// micro-step).
pub fn place_gradients(model: &ModelGraph, buckets: &[ReduceBucket]) -> Stage3Arena {
    let units = model.units.len();
    let last = (2 * units).saturating_sub(1);
    let mut first_write: Vec<Option<usize>> = vec![None; model.tensors.len()];
    for step in units..2 * units {
        for &t in &model.units[trace_step(units, step).0].tensors {
            if let Some(slot) = first_write.get_mut(t) {
                slot.get_or_insert(step);
            }
        }
    }
    for group in fused_writes(model) {
        let earliest = group.iter().filter_map(|&t| first_write[t]).min();
        for &t in &group {
            first_write[t] = earliest;
        }
    }
    let mut intervals = Vec::new();
    for bucket in buckets {
        let to = match bucket.flush {
            FlushPoint::BackwardStep { step } => step,
            FlushPoint::Epilogue => last,
        };
        for &t in &bucket.tensors {
            let from = first_write.get(t).copied().flatten().unwrap_or(units);
            intervals.push(GatheredInterval {
                tensor: t,
                from: from.min(to),
                to,
            });
        }
    }
    Stage3Arena::place(model, (&intervals, 2 * units), &[], &[])
}

/// The groups of gradients one device op writes together, at the first of their tensors'
/// backward steps: GPT-2's embedding backward (`wte` and `wpe`), and the Llama family's q, k
/// and v bias gradients (one pass of column sums over `dqkv`).
pub fn fused_writes(model: &ModelGraph) -> Vec<Vec<usize>> {
    let index = |name: &str| model.tensors.iter().position(|t| t.name == name);
    let mut groups = Vec::new();
    if let (Some(wte), Some(wpe)) = (
        index("transformer.wte.weight"),
        index("transformer.wpe.weight"),
    ) {
        groups.push(vec![wte, wpe]);
    }
    for (t, tensor) in model.tensors.iter().enumerate() {
        if let Some(layer) = tensor.name.strip_suffix(".self_attn.q_proj.bias") {
            let group: Vec<usize> = ["q", "k", "v"]
                .iter()
                .filter_map(|p| index(&format!("{layer}.self_attn.{p}_proj.bias")))
                .collect();
            if group.len() == 3 && group[0] == t {
                groups.push(group);
            }
        }
    }
    groups
}
