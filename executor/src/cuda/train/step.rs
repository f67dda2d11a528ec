//! One optimizer step on the device: the op lists of its phases ([`StepProgram`]) and the
//! host decisions between them ([`StepControl`]).
//!
//! DeepSpeed's order, as `zero::engine` runs it on the CPU:
//!
//! 1. `start`: gradients zeroed;
//! 2. `micro_step`, `G` times: forward with `dloss = (S / G) / targets` (S the loss scale),
//!    backward accumulating into the gradients;
//! 3. `norm`: one pass over the flat gradients multiplies them by `1/S`, sums their squares
//!    (f64) and flags inf/NaN;
//! 4. on the host ([`StepControl::boundary`]): the loss scaler's update decides whether the
//!    step is applied; the clip coefficient follows from the norm;
//! 5. `update`: the fused AdamW multiplies each gradient by `clip * S / S'` (`S'` the scale
//!    after the update, which DeepSpeed divides by), steps the fp32 master and moments with
//!    the schedule's learning rate, and writes the 16-bit parameters in the same pass.
//!
//! The norm and the clip coefficient are computed once over the whole flat buffer (the CPU
//! path reproduces each stage's per-tensor rounding; the difference is rounding, covered by
//! the GPU tests' tolerances).

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::schedule::LrSchedule;
use dsplan_planner::schedule::clip::fp32_clip_coefficient;
use dsplan_planner::schedule::loss_scale::{LossScaleError, LossScaler, StepOutcome};

use super::backward::backward_ops;
use super::buffers::{DeviceLayout, Region};
use super::forward::forward_ops;
use super::program::{Op, ShapeError, check_head_size};
use crate::cuda::adamw::AdamScalars;
use crate::optim::AdamConfig;

/// The op lists of one optimizer step.
#[derive(Debug, Clone)]
pub struct StepProgram {
    /// Before the first micro-step.
    pub start: Vec<Op>,
    /// One micro-step: forward, classifier, backward.
    pub micro_step: Vec<Op>,
    /// The unscale, norm and inf/NaN pass.
    pub norm: Vec<Op>,
    /// The optimizer step (when the step is applied).
    pub update: Vec<Op>,
}

impl StepProgram {
    /// The step over `layout`'s buffers.
    pub fn new(layout: &DeviceLayout) -> Self {
        let grads = layout.whole(Region::Grads);
        let mut micro_step = forward_ops(layout);
        micro_step.extend(backward_ops(layout));
        let (master, params_out) = if layout.has_master() {
            (
                layout.whole(Region::Master),
                Some(layout.whole(Region::Params)),
            )
        } else {
            (layout.whole(Region::Params), None)
        };
        Self {
            start: vec![Op::Zero { tensor: grads }],
            micro_step,
            norm: vec![
                Op::Zero {
                    tensor: layout.whole(Region::Step(CudaRegion::FoundInf)),
                },
                Op::UnscaleNorm {
                    grads,
                    partials: layout.whole(Region::Step(CudaRegion::NormPartials)),
                    total: layout.whole(Region::Step(CudaRegion::NormTotal)),
                    found_inf: layout.whole(Region::Step(CudaRegion::FoundInf)),
                },
            ],
            update: vec![Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg: layout.whole(Region::ExpAvg),
                exp_avg_sq: layout.whole(Region::ExpAvgSq),
                segments: layout.whole(Region::Step(CudaRegion::Segments)),
            }],
        }
    }

    /// Every op of an applied step with `grad_accum` micro-steps, in order.
    pub fn ops(&self, grad_accum: usize) -> impl Iterator<Item = &Op> {
        self.start
            .iter()
            .chain((0..grad_accum).flat_map(|_| self.micro_step.iter()))
            .chain(self.norm.iter())
            .chain(self.update.iter())
    }

    /// Checks the step before anything is allocated: the model's head size has attention
    /// kernels, every op fits `layout` (bounds, aliasing, the launcher's shape rules), and
    /// every launch names a compiled entry point with a valid grid.
    pub fn check(&self, layout: &DeviceLayout) -> Result<(), ShapeError> {
        check_head_size(layout.config.head_dim(), layout.dtype)?;
        self.ops(1).try_for_each(|op| {
            op.check(layout)
                .map_err(|e| ShapeError(format!("{op:?}: {e}")))?;
            op.launches(layout.dtype)
                .map(|_| ())
                .map_err(|e| ShapeError(format!("{op:?}: {e}")))
        })
    }

    /// Kernel launches (and library calls) of an applied step.
    pub fn launch_count(&self, grad_accum: usize, dtype: Dtype) -> Result<usize, ShapeError> {
        self.ops(grad_accum)
            .map(|op| op.launches(dtype).map(|l| l.len()))
            .sum()
    }
}

/// What the host decided at the step's boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Boundary {
    /// The optimizer steps with these scalars.
    Applied {
        /// The fused AdamW's scalars (gradient multiplier included).
        scalars: AdamScalars,
        /// The learning rate.
        lr: f64,
        /// The true (unscaled, pre-clip) global norm.
        grad_norm: f64,
    },
    /// Overflow: gradients discarded, no optimizer or scheduler step.
    Skipped,
}

/// The host side of the step: loss scale, schedule, clipping, Adam's step count.
#[derive(Debug, Clone)]
pub struct StepControl {
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
    /// `gradient_clipping` (0: off).
    pub clip: f64,
    /// Adam's hyperparameters.
    pub adam: AdamConfig,
    /// The optimizer's `lr` (without a schedule).
    pub base_lr: f64,
    /// The schedule.
    pub schedule: Option<LrSchedule>,
    /// Whether inf/NaN gradients skip the step.
    pub checks_overflow: bool,
    /// The loss scaler.
    pub scaler: LossScaler,
    /// Optimizer steps applied so far.
    pub applied_steps: u64,
}

impl StepControl {
    /// The loss multiplier of each micro-step's backward (`S / G`); the classifier's `dloss`
    /// is this divided by the number of targets.
    pub fn grad_scale(&self) -> f32 {
        (self.scaler.scale() / self.grad_accum.max(1) as f64) as f32
    }

    /// What the norm pass multiplies the gradients by (`1 / S`).
    pub fn inv_scale(&self) -> f32 {
        (1.0 / self.scaler.scale()) as f32
    }

    /// The learning rate of the next applied step.
    pub fn lr(&self) -> f64 {
        match &self.schedule {
            Some(schedule) => schedule.lr_at(self.applied_steps),
            None => self.base_lr,
        }
    }

    /// Decides the step from the norm pass's sum of squares (of the gradients already
    /// divided by `S`) and inf/NaN flag.
    pub fn boundary(
        &mut self,
        sum_of_squares: f64,
        found_inf: bool,
    ) -> Result<Boundary, LossScaleError> {
        let lr = self.lr();
        let mut adam = self.adam;
        if let Some((beta1, beta2)) = self
            .schedule
            .as_ref()
            .and_then(|s| s.momentum_at(self.applied_steps))
        {
            adam.beta1 = beta1;
            adam.beta2 = beta2;
        }
        let overflow = (found_inf || !sum_of_squares.is_finite()) && self.checks_overflow;
        match self.scaler.update(overflow)? {
            StepOutcome::Skipped { .. } => Ok(Boundary::Skipped),
            StepOutcome::Applied {
                grad_scale,
                unscale_by,
            } => {
                let grad_norm = sum_of_squares.sqrt();
                let clip = if self.clip > 0.0 {
                    fp32_clip_coefficient(grad_norm, self.clip)
                } else {
                    1.0
                };
                self.applied_steps += 1;
                let multiplier = (clip * grad_scale / unscale_by) as f32;
                Ok(Boundary::Applied {
                    scalars: AdamScalars::new(&adam, self.applied_steps, lr, multiplier),
                    lr,
                    grad_norm,
                })
            }
        }
    }
}
