//! [`CpuStep`]: the CPU backend of the training loop ([`crate::train::StepBackend`]): one
//! rank's model passes ([`ModelCore`]) over its ZeRO state ([`ZeroRank`]). The order of a step
//! and every decision between its operations are the loop's (`train::step`); this type only
//! computes on the rank's host memory.

use std::rc::Rc;
use std::time::Instant;

use super::clip::{ClipRule, Scales, unscale_and_clip};
use super::rank::ZeroRank;
use super::snapshot::OwnedState;
use super::{Dtype, ZeroError};
use crate::comm::Comm;
use crate::data::LabelledBatch;
use crate::metrics::{Category, MemoryLedger, PhaseTimes, Reservation};
use crate::model::{LossDivisor, ModelCore};
use crate::optim::AdamConfig;
use crate::train::StepBackend;

/// One rank's model passes and state on the CPU.
#[derive(Debug)]
pub struct CpuStep {
    core: ModelCore,
    rank: ZeroRank,
    _activations: Reservation,
}

impl CpuStep {
    /// The step of `rank`, computing with `core` (whose arena is counted in `ledger`).
    pub fn new(core: ModelCore, rank: ZeroRank, ledger: &Rc<MemoryLedger>) -> Self {
        let activations = Reservation::new(
            ledger,
            Category::Activations,
            core.activation_bytes() as u64,
        );
        Self {
            core,
            rank,
            _activations: activations,
        }
    }

    /// The rank's state.
    pub fn zero_rank(&self) -> &ZeroRank {
        &self.rank
    }

    /// The rank's state, mutably.
    pub fn zero_rank_mut(&mut self) -> &mut ZeroRank {
        &mut self.rank
    }
}

impl StepBackend for CpuStep {
    fn rank(&self) -> usize {
        self.rank.rank()
    }

    fn comm(&mut self) -> &mut dyn Comm {
        self.rank.comm()
    }

    fn begin_step(&mut self) -> Result<(), ZeroError> {
        self.rank.begin_step();
        Ok(())
    }

    fn micro_step(
        &mut self,
        batch: &LabelledBatch,
        divisor: LossDivisor,
        grad_scale: f32,
        times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError> {
        let started = Instant::now();
        let loss = self.core.forward_batch_with(
            &mut self.rank,
            &batch.training_batch(divisor),
            grad_scale,
        )?;
        times.forward += started.elapsed().as_secs_f64();
        let started = Instant::now();
        self.core.backward_with(&mut self.rank)?;
        times.backward += started.elapsed().as_secs_f64();
        Ok(f64::from(loss))
    }

    fn reduce_gradients(&mut self, _loss_scale: f64) -> Result<(), ZeroError> {
        self.rank.reduce_at_boundary()?;
        self.rank.stage_owned_grads();
        Ok(())
    }

    fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        self.rank.any_overflow()
    }

    fn discard(&mut self) {
        self.rank.discard_step();
    }

    fn unscale_and_clip(
        &mut self,
        rule: ClipRule,
        scales: Scales,
        clip: f64,
    ) -> Result<f64, ZeroError> {
        unscale_and_clip(&mut self.rank, rule, scales, clip)
    }

    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        self.rank.optimizer_step(adam, lr)?;
        self.core.invalidate();
        Ok(())
    }

    fn export_owned(&mut self) -> Result<OwnedState, ZeroError> {
        self.rank.export_owned()
    }

    fn owned_len(&self) -> usize {
        self.rank.owned_len()
    }

    fn import_owned(&mut self, state: &OwnedState) -> Result<(), ZeroError> {
        self.rank.import_owned(state)
    }

    fn held_params(&mut self) -> Result<(Dtype, Vec<f32>), ZeroError> {
        self.rank.held_params()
    }
}
