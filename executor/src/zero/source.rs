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
use super::rank::{RankState, ZeroRank};
use super::state::{Buffer, Group};
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
        unit_params(&self.live[i], &self.state, &self.group, i, unit)
    }

    fn params_and_grads(&mut self, unit: ParamUnit) -> (&[f32], &mut [f32]) {
        let i = self.group.plan.unit_index(unit);
        let grads = unit_grads(&mut self.unit_grads[i], &self.group, i);
        let params = unit_params(&self.live[i], &self.state, &self.group, i, unit);
        (params, grads)
    }

    fn grads(&mut self, unit: ParamUnit) -> &mut [f32] {
        let i = self.group.plan.unit_index(unit);
        unit_grads(&mut self.unit_grads[i], &self.group, i)
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

/// Unit `i`'s `f32` parameters: its fetched copy `live`, else the stage's parameters in place.
fn unit_params<'a>(
    live: &'a Option<Buffer>,
    state: &'a RankState,
    group: &'a Group,
    i: usize,
    unit: ParamUnit,
) -> &'a [f32] {
    match live {
        Some(live) => &live[..group.plan.units()[i].span.len],
        None => state
            .get()
            .in_place(group, i)
            .unwrap_or_else(|| panic!("{unit:?} read before it was fetched")),
    }
}

/// Unit `i`'s gradients of this backward, zeroed when first asked for.
fn unit_grads<'a>(slot: &'a mut Option<Buffer>, group: &Group, i: usize) -> &'a mut Buffer {
    let len = group.plan.units()[i].span.len;
    slot.get_or_insert_with(|| Tracked::zeros(&group.ledger, Category::Grads, len))
}
