//! The [`ParamSource`] of a [`ZeroRank`]: how the model reaches each unit's parameters and
//! hands over its gradients.
//!
//! * **fetch**: stage 3 all-gathers the unit; 16-bit storage widens it into an `f32` copy;
//!   fp32 stages 0-2 read the parameters in place. **release** drops what fetch made.
//! * **gradients**: each unit gets a fresh zeroed `f32` buffer during backward (autograd's
//!   `.grad`); when it is complete it is rounded to the model dtype and either added to the
//!   accumulated gradients (stages 0, 1) or copied into its planned bucket, which is reduced as
//!   soon as all its tensors have arrived (stages 2, 3).

use dsplan_planner::config::ZeroStage;

use super::ZeroError;
use super::precision::Dtype;
use super::rank::ZeroRank;
use crate::metrics::{Category, Tracked};
use crate::model::{ParamSource, ParamUnit};

impl ParamSource for ZeroRank {
    type Error = ZeroError;

    fn fetch(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.plan.unit_index(unit);
        if self.live[i].is_some() {
            return Ok(());
        }
        if self.options.stage == ZeroStage::Weights {
            let gathered = self.gather_unit(i)?;
            self.live[i] = Some(gathered);
        } else if self.params.dtype() != Dtype::F32 {
            let span = self.plan.units()[i].span;
            let mut widened = Tracked::zeros(&self.ledger, Category::Gathered, span.len);
            self.params.read(span.offset, &mut widened);
            self.live[i] = Some(widened);
        }
        Ok(())
    }

    fn release(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.plan.unit_index(unit);
        self.live[i] = None;
        Ok(())
    }

    fn params(&self, unit: ParamUnit) -> &[f32] {
        let i = self.plan.unit_index(unit);
        let len = self.plan.units()[i].span.len;
        match &self.live[i] {
            Some(live) => &live[..len],
            None => match self.params.as_f32() {
                Some(params) => self.plan.units()[i].span.of(params),
                None => panic!("{unit:?} read before it was fetched"),
            },
        }
    }

    fn params_and_grads(&mut self, unit: ParamUnit) -> (&[f32], &mut [f32]) {
        let i = self.plan.unit_index(unit);
        let span = self.plan.units()[i].span;
        let grads = self.unit_grads[i]
            .get_or_insert_with(|| Tracked::zeros(&self.ledger, Category::Grads, span.len));
        let params: &[f32] = match &self.live[i] {
            Some(live) => &live[..span.len],
            None => match self.params.as_f32() {
                Some(params) => span.of(params),
                None => panic!("{unit:?} read before it was fetched"),
            },
        };
        (params, grads)
    }

    fn grads(&mut self, unit: ParamUnit) -> &mut [f32] {
        let i = self.plan.unit_index(unit);
        let len = self.plan.units()[i].span.len;
        self.unit_grads[i].get_or_insert_with(|| Tracked::zeros(&self.ledger, Category::Grads, len))
    }

    fn grads_ready(&mut self, unit: ParamUnit) -> Result<(), ZeroError> {
        let i = self.plan.unit_index(unit);
        let Some(mut grads) = self.unit_grads[i].take() else {
            return Ok(());
        };
        // As a backward in the model dtype would have produced them.
        self.options.model_dtype.round_slice(&mut grads);
        let entry = self.plan.units()[i].clone();
        match self.options.stage {
            ZeroStage::Disabled | ZeroStage::OptimizerStates => {
                self.grads.accumulate(entry.span.offset, &grads);
            }
            ZeroStage::Gradients | ZeroStage::Weights => {
                for t in entry.tensors.rev() {
                    let span = self.plan.tensors()[t];
                    let start = span.offset - entry.span.offset;
                    self.bucket_tensor(t, &grads[start..start + span.len])?;
                }
            }
        }
        Ok(())
    }
}

impl ZeroRank {
    /// Adds tensor `t`'s gradient to its planned bucket, and reduces the bucket once all its
    /// tensors have arrived.
    fn bucket_tensor(&mut self, t: usize, values: &[f32]) -> Result<(), ZeroError> {
        let b = self.plan.bucket_of(t);
        let Some(bucket) = self.bucket.as_mut() else {
            return Ok(());
        };
        let entry = &self.plan.buckets()[b];
        let Some(j) = entry.tensors.iter().position(|&x| x == t) else {
            return Ok(());
        };
        if self.options.stage == ZeroStage::Weights {
            let shards = self.plan.shards();
            let chunk = shards.chunk(t);
            for q in 0..self.world {
                let piece = shards.piece(t, q);
                let dst = q * entry.shard_numel + entry.shard_offsets[j];
                bucket[dst..dst + piece.len()].copy_from_slice(&values[piece.clone()]);
                bucket[dst + piece.len()..dst + chunk].fill(0.0);
            }
        } else {
            let dst = entry.offsets[j];
            bucket[dst..dst + values.len()].copy_from_slice(values);
        }
        self.arrived[b] += 1;
        if self.arrived[b] == entry.tensors.len() {
            self.arrived[b] = 0;
            match self.options.stage {
                ZeroStage::Weights => self.flush_shard_bucket(b)?,
                _ => self.flush_flat_bucket(b)?,
            }
        }
        Ok(())
    }
}
