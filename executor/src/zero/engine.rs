//! [`RankEngine`]: one rank's training step, DeepSpeed's order of operations.
//!
//! For each micro-step `k < G`: forward with the loss multiplied by `S / G` (`S` the loss
//! scale, 1 unless fp16), backward (stages 2 and 3 reduce gradient buckets as they fill). At
//! the boundary:
//!
//! 1. stages 0 and 1 all-reduce the accumulated gradients;
//! 2. the owned gradients are widened to `f32` (16-bit runs);
//! 3. fp16, and bf16 with `check_grad_overflow`: any inf/NaN on any rank is an overflow;
//! 4. the loss scaler is updated; on an overflow the step is skipped: no optimizer step, no
//!    learning-rate scheduler step, gradients discarded;
//! 5. otherwise the global norm is computed, the gradients are unscaled and clipped in one
//!    multiplication ([`super::clip`]), Adam steps the fp32 master with the scheduler's
//!    learning rate, the model-dtype parameters are refreshed (and gathered), and the
//!    scheduler advances.
//!
//! The step's loss is the mean over micro-steps, then over ranks (in f64).

use std::rc::Rc;
use std::time::{Duration, Instant};

use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::loss_scale::{LossScaler, StepOutcome};

use super::ZeroError;
use super::clip::{ClipRule, Scales, unscale_and_clip};
use super::precision::MixedPrecision;
use super::rank::ZeroRank;
use crate::comm::ReduceOp;
use crate::data::{DataError, MicroBatchIndex, TokenBatch};
use crate::metrics::{Category, MemoryLedger, Reservation};
use crate::model::ModelCore;
use crate::optim::AdamConfig;

/// What the engine does besides storing (the optimizer and its schedule, clipping, precision).
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Micro-steps per optimizer step (`gradient_accumulation_steps`).
    pub grad_accum: usize,
    /// `gradient_clipping` (0: off).
    pub clip: f64,
    /// How the norm and clip factor are computed.
    pub clip_rule: ClipRule,
    /// Adam's hyperparameters (betas overridden per step by OneCycle's momentum cycling).
    pub adam: AdamConfig,
    /// The optimizer's `lr`, used when there is no scheduler.
    pub base_lr: f64,
    /// The learning-rate schedule, if any.
    pub schedule: Option<LrSchedule>,
    /// The precision, for overflow checks.
    pub precision: MixedPrecision,
    /// The loss scaler at the start.
    pub scaler: LossScaler,
}

/// Seconds spent in each phase of a step, on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseTimes {
    /// Forward passes (including stage 3's gathers).
    pub forward: f64,
    /// Backward passes (including stage 2/3's bucket reductions).
    pub backward: f64,
    /// Boundary reduction, overflow check, norm and clipping.
    pub reduce: f64,
    /// Optimizer step and parameter refresh/gather.
    pub step: f64,
}

/// What one optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    /// The loss: mean over micro-steps and ranks.
    pub loss: f64,
    /// This rank's mean loss over its micro-steps.
    pub rank_loss: f64,
    /// The learning rate of this step.
    pub lr: f64,
    /// The pre-clip global gradient norm (`None` when the step was skipped).
    pub grad_norm: Option<f64>,
    /// The loss scale this step's backward used.
    pub loss_scale: f64,
    /// Whether the step was skipped (gradient overflow).
    pub skipped: bool,
    /// Where this rank's time went.
    pub times: PhaseTimes,
}

/// One rank's model passes, state and optimizer logic.
#[derive(Debug)]
pub struct RankEngine {
    core: ModelCore,
    rank: ZeroRank,
    options: EngineOptions,
    scaler: LossScaler,
    applied_steps: u64,
    _activations: Reservation,
}

impl RankEngine {
    /// The engine of `rank`, computing with `core` (whose arena is counted in `ledger`).
    pub fn new(
        core: ModelCore,
        rank: ZeroRank,
        options: EngineOptions,
        ledger: &Rc<MemoryLedger>,
    ) -> Self {
        let activations = Reservation::new(
            ledger,
            Category::Activations,
            core.activation_bytes() as u64,
        );
        Self {
            scaler: options.scaler.clone(),
            core,
            rank,
            options,
            applied_steps: 0,
            _activations: activations,
        }
    }

    /// The rank's state.
    pub fn rank(&self) -> &ZeroRank {
        &self.rank
    }

    /// Optimizer steps applied so far (skipped steps excluded): the scheduler's position.
    pub fn applied_steps(&self) -> u64 {
        self.applied_steps
    }

    /// The rank's state, mutably (to restore it from a checkpoint).
    pub fn rank_mut(&mut self) -> &mut ZeroRank {
        &mut self.rank
    }

    /// The loss scaler as it stands (after the steps run so far).
    pub fn scaler(&self) -> &LossScaler {
        &self.scaler
    }

    /// Continues a run from a checkpoint: `applied_steps` optimizer steps already applied (the
    /// scheduler's position) and the loss scaler as it was saved.
    pub fn resume(&mut self, applied_steps: u64, scaler: LossScaler) {
        self.applied_steps = applied_steps;
        self.scaler = scaler;
    }

    /// Runs optimizer step `step`, reading micro-batch `(step, rank, k)` from `batches`.
    pub fn step(
        &mut self,
        step: u64,
        batches: &dyn Fn(MicroBatchIndex) -> Result<TokenBatch, DataError>,
    ) -> Result<StepRecord, ZeroError> {
        let mut times = PhaseTimes::default();
        let grad_accum = self.options.grad_accum.max(1);
        let loss_scale = self.scaler.scale();
        let lr = match &self.options.schedule {
            Some(schedule) => schedule.lr_at(self.applied_steps),
            None => self.options.base_lr,
        };
        let mut adam = self.options.adam;
        if let Some((beta1, beta2)) = self
            .options
            .schedule
            .as_ref()
            .and_then(|s| s.momentum_at(self.applied_steps))
        {
            adam.beta1 = beta1;
            adam.beta2 = beta2;
        }

        self.rank.begin_step();
        let grad_scale = (loss_scale / grad_accum as f64) as f32;
        let mut loss_sum = 0.0f64;
        for micro_step in 0..grad_accum {
            let batch = batches(MicroBatchIndex {
                step,
                rank: self.rank.rank(),
                micro_step,
            })?;
            let inputs = batch.inputs();
            let targets: Vec<Option<u32>> = batch.targets().into_iter().map(Some).collect();
            let started = Instant::now();
            let loss = self
                .core
                .forward_with(&mut self.rank, &inputs, &targets, grad_scale)?;
            times.forward += seconds(started.elapsed());
            let started = Instant::now();
            self.core.backward_with(&mut self.rank)?;
            times.backward += seconds(started.elapsed());
            loss_sum += f64::from(loss);
        }
        let rank_loss = loss_sum / grad_accum as f64;

        let started = Instant::now();
        self.rank.reduce_at_boundary()?;
        self.rank.stage_owned_grads();
        let overflow = self.options.precision.checks_overflow() && self.rank.any_overflow()?;
        let outcome = self.scaler.update(overflow)?;
        let (grad_norm, skipped) = match outcome {
            StepOutcome::Skipped { .. } => {
                self.rank.discard_step();
                times.reduce += seconds(started.elapsed());
                (None, true)
            }
            StepOutcome::Applied {
                grad_scale,
                unscale_by,
            } => {
                let scales = Scales {
                    grad_scale,
                    unscale_by,
                };
                let norm = unscale_and_clip(
                    &mut self.rank,
                    self.options.clip_rule,
                    scales,
                    self.options.clip,
                )?;
                times.reduce += seconds(started.elapsed());
                let started = Instant::now();
                self.rank.optimizer_step(&adam, lr)?;
                self.core.invalidate();
                self.applied_steps += 1;
                times.step += seconds(started.elapsed());
                (Some(norm), false)
            }
        };
        let world = self.rank.world() as f64;
        let loss = self
            .rank
            .comm()
            .all_reduce_scalar(rank_loss, ReduceOp::Sum)?
            / world;
        Ok(StepRecord {
            loss,
            rank_loss,
            lr,
            grad_norm,
            loss_scale,
            skipped,
            times,
        })
    }
}

fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}
