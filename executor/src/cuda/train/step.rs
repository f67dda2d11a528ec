//! One optimizer step on the device: the op lists of its phases ([`StepProgram`]). The host
//! decisions between them are the one training loop's (`crate::train::step`, with
//! `crate::train::StepControl`), the same as on the CPU; `super::rank::CudaStep` runs each
//! phase when the loop asks for it.
//!
//! DeepSpeed's order:
//!
//! 1. `start`: gradients zeroed;
//! 2. `micro_step`, `G` times: forward with `dloss = (S / G) / targets` (S the loss scale),
//!    backward accumulating into the gradients;
//! 3. `norm`: one pass over the flat gradients multiplies them by `1/S`, sums their squares
//!    (f64) and flags inf/NaN;
//! 4. on the host (the loop): the loss scaler's update decides whether the step is applied;
//!    the clip coefficient follows from the norm;
//! 5. `update`: the fused AdamW multiplies each gradient by `clip * S / S'` (`S'` the scale
//!    after the update, which DeepSpeed divides by), steps the fp32 master and moments with
//!    the schedule's learning rate, and writes the 16-bit parameters in the same pass.
//!
//! Under optimizer offload the fused AdamW of step 5 runs on the host ([`super::offload`]):
//! the gradients go to the host after the norm pass, the parameters come back in `update`.
//!
//! The norm and the clip coefficient are computed once over the whole flat buffer (the CPU
//! path reproduces each stage's per-tensor rounding; the difference is rounding, covered by
//! the GPU tests' tolerances).

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::settings::OffloadStepping;

use super::layout::DeviceLayout;
use super::program::{Op, ShapeError};
use super::region::{Region, RegionSizes};
use crate::train::AttentionKernel;

/// The op lists of one optimizer step.
#[derive(Debug, Clone)]
pub struct StepProgram {
    /// Before the first micro-step.
    pub start: Vec<Op>,
    /// One micro-step before the last: forward, classifier, backward (and, where the plan
    /// reduces every micro-step, its gradient buckets).
    pub micro_step: Vec<Op>,
    /// The last micro-step, which reduces the gradients (one GPU: the same as
    /// [`Self::micro_step`]).
    pub boundary_micro_step: Vec<Op>,
    /// The unscale, norm and inf/NaN pass.
    pub norm: Vec<Op>,
    /// The optimizer step (when the step is applied).
    pub update: Vec<Op>,
    /// After the optimizer step: the parameters gathered again (stages 1-3 at W > 1).
    pub after_update: Vec<Op>,
    /// Under optimizer offload, the host's side of the step ([`super::offload`]).
    pub offload: Option<OffloadPhases>,
}

impl StepProgram {
    /// The step over `layout`'s buffers (one GPU, or one rank whose gradients are reduced
    /// whole elsewhere).
    pub fn new(layout: &DeviceLayout) -> Self {
        let [mut micro_step, backward] = layout.passes();
        micro_step.extend(backward);
        Self::around(micro_step, layout)
    }

    /// The step of any family around its micro-step's ops: gradients zeroed first, the norm
    /// pass and the fused AdamW over whole regions of `layout`.
    pub fn around(micro_step: Vec<Op>, layout: &impl RegionSizes) -> Self {
        let whole = |region| layout.whole_region(region);
        let grads = whole(Region::Grads);
        let (master, params_out) = if layout.trains_master() {
            (whole(Region::Master), Some(whole(Region::Params)))
        } else {
            (whole(Region::Params), None)
        };
        Self {
            start: vec![Op::Zero { tensor: grads }],
            boundary_micro_step: micro_step.clone(),
            micro_step,
            norm: vec![
                Op::Zero {
                    tensor: whole(Region::Step(CudaRegion::FoundInf)),
                },
                Op::UnscaleNorm {
                    grads,
                    partials: whole(Region::Step(CudaRegion::NormPartials)),
                    total: whole(Region::Step(CudaRegion::NormTotal)),
                    found_inf: whole(Region::Step(CudaRegion::FoundInf)),
                },
            ],
            update: vec![Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg: whole(Region::ExpAvg),
                exp_avg_sq: whole(Region::ExpAvgSq),
                segments: whole(Region::Step(CudaRegion::Segments)),
            }],
            after_update: Vec::new(),
            offload: None,
        }
    }

    /// The step with its attention computed by `kernel`'s kernels (the recipes build it with
    /// [`AttentionKernel::Scalar`]).
    pub fn with_attention(mut self, kernel: AttentionKernel) -> Self {
        for op in [
            &mut self.start,
            &mut self.micro_step,
            &mut self.boundary_micro_step,
            &mut self.norm,
            &mut self.update,
            &mut self.after_update,
        ]
        .into_iter()
        .flatten()
        {
            if let Op::AttentionForward { attention, .. }
            | Op::AttentionBackward { attention, .. } = op
            {
                attention.kernel = kernel;
            }
        }
        self
    }

    /// Every op of an applied step with `grad_accum` micro-steps, in order.
    pub fn ops(&self, grad_accum: usize) -> impl Iterator<Item = &Op> {
        let before_boundary = grad_accum.saturating_sub(1);
        self.start
            .iter()
            .chain((0..before_boundary).flat_map(|_| self.micro_step.iter()))
            .chain(self.boundary_micro_step.iter().take(if grad_accum > 0 {
                usize::MAX
            } else {
                0
            }))
            .chain(self.norm.iter())
            .chain(self.offload.iter().flat_map(|o| {
                o.save
                    .iter()
                    .chain(o.host_step.iter())
                    .chain(o.restore.iter())
            }))
            .chain(self.update.iter())
            .chain(self.after_update.iter())
    }

    /// Checks the step before anything is allocated: the family's own rules (attention
    /// kernels for its head size, no sliding window the kernels cannot honour), every op fits
    /// `layout` (bounds, aliasing, the launcher's shape rules), and every launch names a
    /// compiled entry point with a valid grid.
    pub fn check(&self, layout: &DeviceLayout) -> Result<(), ShapeError> {
        layout.recipe().check(&layout.step)?;
        self.check_ops(layout, layout.dtype())
    }

    /// Every op fits `layout` (bounds, aliasing, the launcher's shape rules) and every launch
    /// names a compiled entry point with a valid grid in `dtype`.
    pub fn check_ops(&self, layout: &impl RegionSizes, dtype: Dtype) -> Result<(), ShapeError> {
        self.ops(2).try_for_each(|op| {
            op.check(layout)
                .map_err(|e| ShapeError(format!("{op:?}: {e}")))?;
            op.launches(dtype)
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

/// The host-side op lists of an offloaded step that `super::device_step` runs on its own
/// schedule (the copies to and from the device are in the program's phases).
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadPhases {
    /// When the host step runs against the norm and the overflow check.
    pub stepping: OffloadStepping,
    /// The host optimizer's AdamW.
    pub host_step: Vec<Op>,
    /// The master and moments saved into the speculative side (speculative stepping only).
    pub save: Vec<Op>,
    /// The master and moments restored from it.
    pub restore: Vec<Op>,
}
