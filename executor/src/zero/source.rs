//! The [`ParamSource`] of a [`ZeroRank`]: how the model reaches each unit's parameters and
//! hands over its gradients.
//!
//! * **fetch**: the stage makes the unit readable (stage 3 all-gathers it; 16-bit storage
//!   widens it into an `f32` copy; fp32 stages 0-2 read the parameters in place). **release**
//!   drops what fetch made.
//! * **gradients**: each unit gets a fresh zeroed `f32` buffer during backward (autograd's
//!   `.grad`); when it is complete it is rounded to the model dtype and handed to the stage,
//!   which adds it to the accumulated gradients (stages 0, 1) or copies it into its planned
//!   bucket, reduced as soon as all its tensors have arrived (stages 2, 3).

use super::ZeroError;
use super::rank::ZeroRank;
use crate::metrics::{Category, Tracked};
use crate::model::{ParamSource, ParamUnit};

impl ParamSource for ZeroRank {
    type Error = ZeroError;

    fn fetch(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.group.plan.unit_index(unit);
        if self.live[i].is_none() {
            self.live[i] = self.state.get_mut().fetch(&mut self.group, i)?;
        }
        Ok(())
    }

    fn release(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.group.plan.unit_index(unit);
        self.live[i] = None;
        Ok(())
    }

    fn params(&self, unit: ParamUnit) -> &[f32] {
        let i = self.group.plan.unit_index(unit);
        let len = self.group.plan.units()[i].span.len;
        match &self.live[i] {
            Some(live) => &live[..len],
            None => match self.state.get().in_place(&self.group, i) {
                Some(params) => params,
                None => panic!("{unit:?} read before it was fetched"),
            },
        }
    }

    fn params_and_grads(&mut self, unit: ParamUnit) -> (&[f32], &mut [f32]) {
        let i = self.group.plan.unit_index(unit);
        let len = self.group.plan.units()[i].span.len;
        let ledger = &self.group.ledger;
        let grads =
            self.unit_grads[i].get_or_insert_with(|| Tracked::zeros(ledger, Category::Grads, len));
        let params: &[f32] = match &self.live[i] {
            Some(live) => &live[..len],
            None => match self.state.get().in_place(&self.group, i) {
                Some(params) => params,
                None => panic!("{unit:?} read before it was fetched"),
            },
        };
        (params, grads)
    }

    fn grads(&mut self, unit: ParamUnit) -> &mut [f32] {
        let i = self.group.plan.unit_index(unit);
        let len = self.group.plan.units()[i].span.len;
        let ledger = &self.group.ledger;
        self.unit_grads[i].get_or_insert_with(|| Tracked::zeros(ledger, Category::Grads, len))
    }

    fn grads_ready(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.group.plan.unit_index(unit);
        let Some(mut grads) = self.unit_grads[i].take() else {
            return Ok(());
        };
        // As a backward in the model dtype would have produced them.
        self.group.options.model_dtype.round_slice(&mut grads);
        self.state
            .get_mut()
            .grads_ready(&mut self.group, &mut self.grads, i, &grads)
    }
}
