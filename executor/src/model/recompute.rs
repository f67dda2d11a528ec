//! Activation checkpointing of a stack of layers: what forward keeps for backward, and which
//! layers backward re-runs. Written once for every model of the CPU executor.
//!
//! Under [`Recompute::EachLayer`] (the config's `activation_checkpointing` section, or the
//! Hugging Face Trainer's `gradient_checkpointing`) forward keeps only each layer's input (the
//! previous layer's output) and every layer computes into one working set shared by all of
//! them; backward, walking the layers in reverse, first re-runs layer `l`'s forward from its
//! saved input into the working set, then runs layer `l`'s backward from it. The recomputation
//! is the same arithmetic on the same inputs and parameters as the first forward, so the
//! gradients are bit for bit those of a run without it.
//!
//! A model adopts it with two pieces:
//!
//! * its activation layout asks [`layer_sets`] for the per-layer spans: one working set per
//!   layer, or one shared by all, each joined to the layer's own output span;
//! * its backward calls its own "forward of layer `l` from its saved input" (GPT-2:
//!   `block_forward`) for each layer where [`recomputes`] says so, after fetching the layer's
//!   parameters for its backward (the unit is fetched once for both).
//!
//! [`layers_forward`] and [`layers_backward`] are the walk over the stack every family shares
//! (fetch a layer's unit, run it, release it, report its gradients ready), with the rule above;
//! a model describes its stack to them as a [`LayerStack`].
//!
//! The last layer is not re-run: its working set still holds its forward when backward reaches
//! it (nothing between the loss and the last layer's backward writes there).
//!
//! The arena's size is the planner's (`planner::memory::cpu_arena`), which counts the same
//! working sets.

pub use dsplan_planner::memory::Recompute;

use super::units::{ParamSource, ParamUnit, UnitGrads, UnitParams, UnitSpans};
use crate::tensor::{Span, TensorTable};

/// A model's stack of layers (GPT-2's blocks, the Llama family's decoder layers) as the shared
/// walks see it. Layer `l`'s parameters are the unit [`ParamUnit::Block`]`(l)`.
pub(crate) trait LayerStack {
    /// Number of layers.
    fn layers(&self) -> usize;
    /// What forward keeps of each layer.
    fn recompute(&self) -> Recompute;
    /// Where each parameter unit lives.
    fn unit_spans(&self) -> &UnitSpans;
    /// Where layer `l`'s input is kept (the embedding's output, or layer `l - 1`'s output).
    fn layer_input(&self, l: usize) -> Span;
    /// Layer `l` forward from the residual stream at `input`; returns where its output lives.
    fn layer_forward(&mut self, l: usize, input: Span, p: UnitParams<'_>) -> Span;
    /// Layer `l` backward, from the activations its forward left, adding into `g`.
    fn layer_backward(&mut self, l: usize, p: UnitParams<'_>, g: UnitGrads<'_>);
}

/// Forward through every layer from the residual stream at `input`, fetching each layer's
/// unit from `source` before it runs and releasing it after; returns the last output's span.
pub(crate) fn layers_forward<M: LayerStack, S: ParamSource>(
    model: &mut M,
    source: &mut S,
    input: Span,
) -> Result<Span, S::Error> {
    let mut residual = input;
    for l in 0..model.layers() {
        let unit = ParamUnit::Block(l);
        source.fetch(unit)?;
        let p = model.unit_spans().view(source, unit);
        residual = model.layer_forward(l, residual, p);
        source.release(unit)?;
    }
    Ok(residual)
}

/// Backward through every layer from the last: fetch the layer's unit, re-run its forward
/// where [`recomputes`] says so, run its backward, release it and report its gradients ready.
pub(crate) fn layers_backward<M: LayerStack, S: ParamSource>(
    model: &mut M,
    source: &mut S,
) -> Result<(), S::Error> {
    let layers = model.layers();
    for l in (0..layers).rev() {
        let unit = ParamUnit::Block(l);
        source.fetch(unit)?;
        {
            let base = model.unit_spans().span(unit).offset;
            let (p, g) = source.params_and_grads(unit);
            if recomputes(model.recompute(), l, layers) {
                let input = model.layer_input(l);
                model.layer_forward(l, input, UnitParams::new(base, p));
            }
            model.layer_backward(l, UnitParams::new(base, p), UnitGrads::new(base, g));
        }
        source.release(unit)?;
        source.grads_ready(unit)?;
    }
    Ok(())
}

/// The per-layer activation spans of `layers` layers, pushed onto `table`.
///
/// `working(table, prefix)` pushes one working set (names under `prefix`: `h.{l}` per layer,
/// or `h.recomputed` for the shared one) and returns its spans; `output(table, l)` pushes
/// layer `l`'s output (the next layer's input, kept under either mode); `join` makes layer
/// `l`'s entry from its working set and its output. Without recomputation each layer's
/// working set precedes its output in the arena.
pub fn layer_sets<W: Copy, B>(
    table: &mut TensorTable,
    layers: usize,
    recompute: Recompute,
    mut working: impl FnMut(&mut TensorTable, &str) -> W,
    mut output: impl FnMut(&mut TensorTable, usize) -> Span,
    join: impl Fn(W, Span) -> B,
) -> Vec<B> {
    match recompute {
        Recompute::Nothing => (0..layers)
            .map(|l| {
                let set = working(table, &format!("h.{l}"));
                join(set, output(table, l))
            })
            .collect(),
        Recompute::EachLayer if layers == 0 => Vec::new(),
        Recompute::EachLayer => {
            let shared = working(table, "h.recomputed");
            (0..layers)
                .map(|l| join(shared, output(table, l)))
                .collect()
        }
    }
}

/// Whether backward re-runs layer `l`'s forward (of `layers`) before its backward: under
/// [`Recompute::EachLayer`], every layer but the last, whose forward is still in the shared
/// working set.
pub fn recomputes(recompute: Recompute, l: usize, layers: usize) -> bool {
    recompute == Recompute::EachLayer && l + 1 < layers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(recompute: Recompute) -> (Vec<(Span, Span)>, TensorTable) {
        let mut table = TensorTable::new();
        let sets = layer_sets(
            &mut table,
            3,
            recompute,
            |t, prefix| t.push(format!("{prefix}.x"), &[4]),
            |t, l| t.push(format!("h.{l}.out"), &[2]),
            |w, out| (w, out),
        );
        (sets, table)
    }

    #[test]
    fn recomputed_layers_share_one_working_set_and_keep_their_outputs() {
        let (kept, kept_table) = sets(Recompute::Nothing);
        let (shared, shared_table) = sets(Recompute::EachLayer);
        assert_eq!(kept_table.total_len(), 3 * (4 + 2));
        assert_eq!(shared_table.total_len(), 4 + 3 * 2);
        assert!(kept.windows(2).all(|w| w[0].0 != w[1].0));
        assert!(shared.windows(2).all(|w| w[0].0 == w[1].0));
        assert!(shared.windows(2).all(|w| w[0].1 != w[1].1));
        assert!(shared_table.get("h.recomputed.x").is_some());
        assert!(kept_table.get("h.2.x").is_some());
    }

    #[test]
    fn every_layer_but_the_last_is_recomputed() {
        let layers = 4;
        let rerun: Vec<usize> = (0..layers)
            .filter(|&l| recomputes(Recompute::EachLayer, l, layers))
            .collect();
        assert_eq!(rerun, [0, 1, 2]);
        assert!((0..layers).all(|l| !recomputes(Recompute::Nothing, l, layers)));
    }
}
