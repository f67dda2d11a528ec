//! [`OwnedParams`]: the [`ParamSource`] of a model that owns its whole parameter and gradient
//! buffers (a [`super::Gpt2`] or a Llama-family model), cut into units.

use crate::model::ModelError;
use crate::model::units::{ParamSource, ParamUnit, UnitSpans};

/// Whole parameter and gradient buffers, always available: fetching and releasing do nothing.
pub(crate) struct OwnedParams<'a> {
    spans: &'a UnitSpans,
    params: &'a [f32],
    grads: &'a mut [f32],
}

impl<'a> OwnedParams<'a> {
    /// The source over `params` and `grads`, both laid out as the full parameter layout.
    pub(crate) fn new(spans: &'a UnitSpans, params: &'a [f32], grads: &'a mut [f32]) -> Self {
        Self {
            spans,
            params,
            grads,
        }
    }
}

impl ParamSource for OwnedParams<'_> {
    type Error = ModelError;

    fn fetch(&mut self, _unit: ParamUnit) -> Result<(), ModelError> {
        Ok(())
    }

    fn release(&mut self, _unit: ParamUnit) -> Result<(), ModelError> {
        Ok(())
    }

    fn params(&self, unit: ParamUnit) -> &[f32] {
        self.spans.span(unit).of(self.params)
    }

    fn params_and_grads(&mut self, unit: ParamUnit) -> (&[f32], &mut [f32]) {
        let span = self.spans.span(unit);
        (span.of(self.params), span.of_mut(self.grads))
    }

    fn grads(&mut self, unit: ParamUnit) -> &mut [f32] {
        self.spans.span(unit).of_mut(self.grads)
    }

    fn grads_ready(&mut self, _unit: ParamUnit) -> Result<(), ModelError> {
        Ok(())
    }
}
