//! Parameter units: the groups of parameters a pass reads together, and [`ParamSource`], through
//! which forward and backward reach them.
//!
//! The flat parameter buffer (see [`ParamLayout`]) splits into contiguous *units*: the embedding
//! (`wte` and `wpe`, side by side at the start), one per transformer block, and the final
//! LayerNorm. Forward and backward ask a [`ParamSource`] for one unit at a time, in pass order,
//! and tell it when a unit's parameters are no longer needed and when its gradients are final.
//! A plain model ([`crate::model::Gpt2`]) answers from the buffers it owns; a ZeRO-3 rank answers
//! by all-gathering the unit's shards before use and releasing them after, and reduces each
//! unit's gradients as soon as they are complete (ZeRO-3's fetch units and gradient hooks).
//!
//! Inside a unit, tensors are still addressed by their spans in the *full* layout:
//! [`UnitParams::of`] and [`UnitGrads::split`] subtract the unit's start.
//!
//! # Order of calls (what a source can rely on)
//!
//! Forward: `fetch(Embedding)`, read, `release(Embedding)`; for each block `l`: `fetch(Block(l))`,
//! read, `release(Block(l))`; `fetch(FinalNorm)`, `fetch(Embedding)` (the tied `lm_head`), read,
//! `release(FinalNorm)`, `release(Embedding)`.
//!
//! Backward: `fetch(Embedding)` and `params_and_grads(Embedding)` (the `lm_head`'s `wte`
//! gradient), `release(Embedding)`; `fetch(FinalNorm)`, `params_and_grads(FinalNorm)`,
//! `release(FinalNorm)`, `grads_ready(FinalNorm)`; for each block from the last:
//! `fetch`, `params_and_grads`, `release`, `grads_ready`; finally `grads(Embedding)` (the
//! embedding lookup's gradient, added to the same buffer) and `grads_ready(Embedding)`.
//! Gradients are *added* to what the buffer holds; a source hands out a zeroed buffer when it
//! wants a fresh gradient.

use super::{ModelError, ParamLayout};
use crate::tensor::{Span, TensorTable, split_spans_mut};

/// One contiguous group of parameters of the flat buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ParamUnit {
    /// `transformer.wte.weight` and `transformer.wpe.weight` (`wte` is also the `lm_head`).
    Embedding,
    /// The parameters of transformer block `l`.
    Block(usize),
    /// `transformer.ln_f.weight` and `.bias`.
    FinalNorm,
}

impl ParamLayout {
    /// Every unit, in buffer order: embedding, blocks `0..L`, final norm.
    pub fn units(&self) -> Vec<ParamUnit> {
        std::iter::once(ParamUnit::Embedding)
            .chain((0..self.blocks.len()).map(ParamUnit::Block))
            .chain(std::iter::once(ParamUnit::FinalNorm))
            .collect()
    }

    /// Where `unit` lives in the flat buffer (an empty span for a block that does not exist).
    pub fn unit_span(&self, unit: ParamUnit) -> Span {
        let covering = |first: Span, last: Span| Span::new(first.offset, last.end() - first.offset);
        match unit {
            ParamUnit::Embedding => covering(self.wte, self.wpe),
            ParamUnit::Block(l) => match self.blocks.get(l) {
                Some(block) => covering(block.ln_1_weight, block.mlp_proj_bias),
                None => Span::new(0, 0),
            },
            ParamUnit::FinalNorm => covering(self.ln_f_weight, self.ln_f_bias),
        }
    }
}

/// Every unit's span, looked up without the layout (a small copy a source can keep).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitSpans {
    /// `[Embedding, Block(0), .., Block(L-1), FinalNorm]`.
    spans: Vec<Span>,
}

impl UnitSpans {
    /// The spans of `layout`'s units.
    pub fn new<L: ParamTable + ?Sized>(layout: &L) -> Self {
        Self {
            spans: layout
                .units()
                .into_iter()
                .map(|u| layout.unit_span(u))
                .collect(),
        }
    }

    /// Where `unit` lives (an empty span for a block that does not exist).
    pub fn span(&self, unit: ParamUnit) -> Span {
        let index = match unit {
            ParamUnit::Embedding => Some(0),
            ParamUnit::Block(l) => (l + 2 < self.spans.len()).then_some(l + 1),
            ParamUnit::FinalNorm => self.spans.len().checked_sub(1),
        };
        index
            .and_then(|i| self.spans.get(i))
            .copied()
            .unwrap_or(Span::new(0, 0))
    }

    /// `unit`'s parameters as `source` holds them now (fetched), addressed by full-layout
    /// spans.
    pub fn view<'s, S: ParamSource + ?Sized>(
        &self,
        source: &'s S,
        unit: ParamUnit,
    ) -> UnitParams<'s> {
        UnitParams::new(self.span(unit).offset, source.params(unit))
    }
}

/// What every model family's parameter layout tells the engines: the named tensors and the
/// units that tile the flat buffer.
pub trait ParamTable {
    /// Every parameter tensor with its Hugging Face name and shape, in buffer order.
    fn tensors(&self) -> &TensorTable;

    /// Every unit, in buffer order: embedding, blocks `0..L`, final norm (and head).
    fn units(&self) -> Vec<ParamUnit>;

    /// Where `unit` lives in the flat buffer (an empty span for a block that does not exist).
    fn unit_span(&self, unit: ParamUnit) -> Span;

    /// Number of parameters (elements of the flat buffer).
    fn param_count(&self) -> usize {
        self.tensors().total_len()
    }
}

impl ParamTable for ParamLayout {
    fn tensors(&self) -> &TensorTable {
        self.table()
    }

    fn units(&self) -> Vec<ParamUnit> {
        ParamLayout::units(self)
    }

    fn unit_span(&self, unit: ParamUnit) -> Span {
        ParamLayout::unit_span(self, unit)
    }
}

/// The parameters of one unit, read by spans of the full layout.
#[derive(Debug, Clone, Copy)]
pub struct UnitParams<'a> {
    base: usize,
    data: &'a [f32],
}

impl<'a> UnitParams<'a> {
    /// The unit that starts at `base` in the full layout, with its values `data`.
    pub fn new(base: usize, data: &'a [f32]) -> Self {
        Self { base, data }
    }

    /// The tensor at `span` (a span of the full layout, inside this unit).
    ///
    /// # Panics
    /// When `span` lies outside the unit (a layout bug).
    pub fn of(&self, span: Span) -> &'a [f32] {
        &self.data[span.offset - self.base..span.end() - self.base]
    }
}

/// The gradient buffer of one unit, cut by spans of the full layout.
#[derive(Debug)]
pub struct UnitGrads<'a> {
    base: usize,
    data: &'a mut [f32],
}

impl<'a> UnitGrads<'a> {
    /// The unit that starts at `base` in the full layout, with its gradient buffer `data`.
    pub fn new(base: usize, data: &'a mut [f32]) -> Self {
        Self { base, data }
    }

    /// `N` disjoint tensors at once, by spans of the full layout (see [`split_spans_mut`]).
    ///
    /// # Panics
    /// When a span lies outside the unit or two overlap (layout bugs).
    pub fn split<const N: usize>(&mut self, spans: [Span; N]) -> [&mut [f32]; N] {
        let base = self.base;
        split_spans_mut(
            self.data,
            spans.map(|span| Span::new(span.offset - base, span.len)),
        )
    }
}

/// Where forward and backward get each unit's parameters and put its gradients. See the
/// [module documentation](self) for the order of calls.
///
/// `params`, `params_and_grads` and `grads` may panic when called out of that order (a unit
/// read before it was fetched): that is a bug in the caller, not bad input.
pub trait ParamSource {
    /// What can go wrong while fetching or reducing (a collective failing, for ZeRO).
    type Error: From<ModelError>;

    /// Makes `unit`'s parameters readable until [`ParamSource::release`].
    fn fetch(&mut self, unit: ParamUnit) -> Result<(), Self::Error>;

    /// The pass no longer needs `unit`'s parameters.
    fn release(&mut self, unit: ParamUnit) -> Result<(), Self::Error>;

    /// The parameters of a fetched unit, as `f32`, laid out as the unit's span of the buffer.
    fn params(&self, unit: ParamUnit) -> &[f32];

    /// A fetched unit's parameters and the gradient buffer backward adds to.
    fn params_and_grads(&mut self, unit: ParamUnit) -> (&[f32], &mut [f32]);

    /// The gradient buffer of `unit` (parameters not needed).
    fn grads(&mut self, unit: ParamUnit) -> &mut [f32];

    /// `unit`'s gradients for this backward pass are complete.
    fn grads_ready(&mut self, unit: ParamUnit) -> Result<(), Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Gpt2Config;

    #[test]
    fn units_tile_the_buffer_in_order() {
        let config = Gpt2Config {
            vocab_size: 50,
            n_positions: 8,
            n_embd: 12,
            n_layer: 3,
            n_head: 3,
            layer_norm_epsilon: 1e-5,
        };
        let layout = ParamLayout::new(&config);
        let mut next = 0;
        for unit in layout.units() {
            let span = layout.unit_span(unit);
            assert_eq!(span.offset, next, "{unit:?}");
            next = span.end();
        }
        assert_eq!(next, layout.num_params());
        assert_eq!(layout.units().len(), 5);
    }

    #[test]
    fn views_shift_by_the_unit_start() {
        let data = [0.0f32, 1.0, 2.0, 3.0];
        let view = UnitParams::new(10, &data);
        assert_eq!(view.of(Span::new(11, 2)), &[1.0, 2.0]);
        let mut grads = [0.0f32; 4];
        let mut unit = UnitGrads::new(10, &mut grads);
        let [a, b] = unit.split([Span::new(12, 2), Span::new(10, 1)]);
        a[0] = 5.0;
        b[0] = 7.0;
        assert_eq!(grads, [7.0, 0.0, 5.0, 0.0]);
    }
}
