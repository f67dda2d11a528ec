//! [`StepControl`]: the host side of every step, the same whichever backend computes it: the
//! loss scaler, the learning-rate schedule (with OneCycle's momentum), gradient clipping, and
//! the count of applied steps (the schedule's position).

use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::loss_scale::LossScaler;

use dsplan_planner::plan::Training;

use super::settings::{LossNormalisation, TrainerSchedule, convert};
use crate::optim::AdamConfig;
use crate::zero::{ClipRule, MixedPrecision};

/// What decides a step besides the gradients.
#[derive(Debug, Clone)]
pub struct StepControl {
    /// Micro-steps per optimizer step (`gradient_accumulation_steps`).
    pub grad_accum: usize,
    /// `gradient_clipping` (0: off).
    pub clip: f64,
    /// How the norm and clip factor are computed (the plan's `run.clip`).
    pub clip_rule: ClipRule,
    /// Adam's hyperparameters (betas overridden per step by OneCycle's momentum cycling).
    pub adam: AdamConfig,
    /// The optimizer's `lr`, used when there is no scheduler.
    pub base_lr: f64,
    /// The learning-rate schedule, if any.
    pub schedule: Option<LrSchedule>,
    /// The precision, for overflow checks.
    pub precision: MixedPrecision,
    /// The loss scaler as it stands.
    pub scaler: LossScaler,
    /// Optimizer steps applied so far (skipped steps excluded).
    pub applied_steps: u64,
    /// How the micro-batch losses are normalised.
    pub loss: LossNormalisation,
    /// The Trainer's schedule, when the config has no `scheduler` (`schedule` is then `None`).
    pub trainer_schedule: Option<TrainerSchedule>,
}

impl StepControl {
    /// The control of a run whose plan trains as `training` with `grad_accum` micro-steps per
    /// step and computes the norm and clip factor as `clip_rule`, starting with `scaler`.
    pub fn of_run(
        training: &Training,
        grad_accum: usize,
        clip_rule: ClipRule,
        scaler: LossScaler,
    ) -> Self {
        Self {
            grad_accum: grad_accum.max(1),
            clip: training.clip_threshold,
            clip_rule,
            adam: convert::adam_config(&training.optimizer),
            base_lr: training.optimizer.lr,
            schedule: training.schedule.clone(),
            precision: convert::mixed_precision(&training.loss_scaling),
            scaler,
            applied_steps: 0,
            loss: LossNormalisation::MicroBatchMean,
            trainer_schedule: None,
        }
    }

    /// Continues a run from a checkpoint: `applied_steps` optimizer steps already applied and
    /// the loss scaler as it was saved.
    pub fn resume(&mut self, applied_steps: u64, scaler: LossScaler) {
        self.applied_steps = applied_steps;
        self.scaler = scaler;
    }

    /// The learning rate of the next applied step.
    pub fn lr(&self) -> f64 {
        match (&self.schedule, self.trainer_schedule) {
            (Some(schedule), _) => schedule.lr_at(self.applied_steps),
            (None, Some(trainer)) => self.base_lr * trainer.factor(self.applied_steps),
            (None, None) => self.base_lr,
        }
    }

    /// Adam's hyperparameters for the next applied step (OneCycle cycles the betas).
    pub fn adam(&self) -> AdamConfig {
        let mut adam = self.adam;
        if let Some((beta1, beta2)) = self
            .schedule
            .as_ref()
            .and_then(|s| s.momentum_at(self.applied_steps))
        {
            adam.beta1 = beta1;
            adam.beta2 = beta2;
        }
        adam
    }

    /// The loss multiplier of each micro-step's backward: `S / G` for micro-batch means, `S`
    /// when each micro-batch is already divided by the step's label tokens.
    pub fn grad_scale(&self) -> f32 {
        match self.loss {
            LossNormalisation::MicroBatchMean => {
                (self.scaler.scale() / self.grad_accum as f64) as f32
            }
            LossNormalisation::TokensInStep => self.scaler.scale() as f32,
        }
    }
}
