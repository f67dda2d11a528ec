//! The flat parameter buffer of stages 0-2 (`Ψ'` elements in the model dtype, the plan's
//! layout with its padding): built from the initial parameters, and read by the model one unit
//! at a time, in place when it is `f32`, else widened into an `f32` copy while the unit is in
//! use.

use dsplan_planner::plan::BufferKind;

use super::ZeroError;
use super::listed::ListedBuffers;
use super::precision::{Dtype, DtypeVec};
use super::state::{Buffer, Group};
use crate::metrics::{Category, Tracked};

/// The flat buffer in the model dtype, as `listed` sizes it (`Ψ'`), `initial` written at its
/// start (the rest is padding).
pub(super) fn flat_buffer(
    group: &Group,
    initial: &[f32],
    listed: &ListedBuffers,
) -> Result<DtypeVec, ZeroError> {
    let len = listed.take(
        BufferKind::Parameters,
        group.plan.flat().padded,
        "the padded flat parameters",
    )?;
    let mut params = DtypeVec::zeros(group.options.model_dtype, len);
    params.write(0, initial);
    Ok(params)
}

/// Unit `i` of `params` widened into a new `f32` buffer when they are 16-bit (`None`: the
/// model reads them in place).
pub(super) fn widen_unit(group: &Group, params: &DtypeVec, i: usize) -> Option<Buffer> {
    if params.dtype() == Dtype::F32 {
        return None;
    }
    let span = group.plan.units()[i].span;
    let mut widened = Tracked::zeros(&group.ledger, Category::Gathered, span.len);
    params.read(span.offset, &mut widened);
    Some(widened)
}

/// Unit `i`'s parameters in place in `params`, when they are `f32`.
pub(super) fn unit_in_place<'a>(
    group: &Group,
    params: &'a DtypeVec,
    i: usize,
) -> Option<&'a [f32]> {
    params.as_f32().map(|p| group.plan.units()[i].span.of(p))
}
