//! The offload step's entry points: one Adam/AdamW update of a partition's fp32 master
//! weights and moments in host memory, or of one bucket's sub-range of it, reading the
//! gradients in the dtype they arrived in, multiplying them by one factor, and writing the
//! 16-bit parameters in the same pass.

use std::fmt;
use std::ops::Range;

use super::dispatch;
use super::io::{GradsIn, ParamsOut};
use super::kernel::{GradPtr, Lanes, OutPtr, StatePtrs};
use super::pool::OffloadPool;
use crate::optim::adam::{AdamConfig, StepScalars};

/// A partition's fp32 state in host memory (all three the same length).
#[derive(Debug)]
pub struct AdamSlices<'a> {
    /// fp32 master weights.
    pub master: &'a mut [f32],
    /// First moments.
    pub exp_avg: &'a mut [f32],
    /// Second moments.
    pub exp_avg_sq: &'a mut [f32],
}

/// What one step is: its number, learning rate and gradient factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OffloadStep {
    /// The step's number, from 1 (bias correction).
    pub step: u64,
    /// The (scheduled) learning rate.
    pub lr: f64,
    /// Every gradient is multiplied by this first, in f32: the loss-scale unscale times the
    /// clip coefficient (DeepSpeed's `1 / combined_scale`); 1 for neither. There is no
    /// separate unscale pass.
    pub grad_factor: f32,
}

/// Why an offload step could not run.
#[derive(Debug, Clone, PartialEq)]
pub enum OffloadError {
    /// Master weights and moments differ in length.
    StateLengths {
        /// Master weights.
        master: usize,
        /// First moments.
        exp_avg: usize,
        /// Second moments.
        exp_avg_sq: usize,
    },
    /// The range is not within the partition.
    RangeOutOfBounds {
        /// The range asked for.
        range: Range<usize>,
        /// The partition's length.
        len: usize,
    },
    /// The gradients do not cover the range exactly.
    GradsLength {
        /// The range's length.
        expected: usize,
        /// The gradients'.
        grads: usize,
    },
    /// The 16-bit output does not cover the range exactly.
    ParamsOutLength {
        /// The range's length.
        expected: usize,
        /// The output's.
        params_out: usize,
    },
    /// Steps count from 1.
    StepZero,
    /// The gradient factor is NaN or infinite (an overflowed step must be skipped instead).
    FactorNotFinite(f32),
}

impl fmt::Display for OffloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffloadError::StateLengths {
                master,
                exp_avg,
                exp_avg_sq,
            } => write!(
                f,
                "offload Adam state differs in length: master {master}, exp_avg {exp_avg}, exp_avg_sq {exp_avg_sq}"
            ),
            OffloadError::RangeOutOfBounds { range, len } => write!(
                f,
                "offload Adam range {range:?} is outside the partition of {len} elements"
            ),
            OffloadError::GradsLength { expected, grads } => write!(
                f,
                "offload Adam got {grads} gradients for a range of {expected} elements"
            ),
            OffloadError::ParamsOutLength {
                expected,
                params_out,
            } => write!(
                f,
                "offload Adam got a 16-bit output of {params_out} elements for a range of {expected}"
            ),
            OffloadError::StepZero => write!(f, "Adam steps count from 1"),
            OffloadError::FactorNotFinite(x) => write!(
                f,
                "offload Adam gradient factor is {x}: skip an overflowed step instead of running it"
            ),
        }
    }
}

impl std::error::Error for OffloadError {}

/// Checks a range call's arguments against a partition of `len`.
pub(crate) fn check(
    len: usize,
    range: &Range<usize>,
    grads: &GradsIn<'_>,
    out: &ParamsOut<'_>,
    step: &OffloadStep,
) -> Result<(), OffloadError> {
    if range.start > range.end || range.end > len {
        return Err(OffloadError::RangeOutOfBounds {
            range: range.clone(),
            len,
        });
    }
    if grads.len() != range.len() {
        return Err(OffloadError::GradsLength {
            expected: range.len(),
            grads: grads.len(),
        });
    }
    if let Some(n) = out.elements().filter(|&n| n != range.len()) {
        return Err(OffloadError::ParamsOutLength {
            expected: range.len(),
            params_out: n,
        });
    }
    if step.step == 0 {
        return Err(OffloadError::StepZero);
    }
    if !step.grad_factor.is_finite() {
        return Err(OffloadError::FactorNotFinite(step.grad_factor));
    }
    Ok(())
}

/// Raw pointers to the gradients and the output (both covering one range).
pub(crate) fn io_ptrs(grads: &GradsIn<'_>, out: &mut ParamsOut<'_>) -> (GradPtr, OutPtr) {
    let g = match grads {
        GradsIn::F32(g) => GradPtr::F32(g.as_ptr()),
        GradsIn::Bf16(g) => GradPtr::Bf16(g.as_ptr().cast()),
        GradsIn::F16(g) => GradPtr::F16(g.as_ptr().cast()),
    };
    let o = match out {
        ParamsOut::None => OutPtr::None,
        ParamsOut::Bf16(p) => OutPtr::Bf16(p.as_mut_ptr().cast()),
        ParamsOut::F16(p) => OutPtr::F16(p.as_mut_ptr().cast()),
    };
    (g, o)
}

impl OffloadPool {
    /// One step over a whole partition (or any slice the caller cut): `grads` and
    /// `params_out` as long as the state.
    pub fn adam_step(
        &self,
        state: AdamSlices<'_>,
        grads: GradsIn<'_>,
        params_out: ParamsOut<'_>,
        step: &OffloadStep,
        config: &AdamConfig,
    ) -> Result<(), OffloadError> {
        let len = state.master.len();
        self.adam_step_range(state, 0..len, grads, params_out, step, config)
    }

    /// One step over `range` of a partition, as soon as that bucket's gradients are in:
    /// `state` is the whole partition, `grads` and `params_out` cover the range only. The
    /// arithmetic is the whole step's, element for element; the partition's length places
    /// the work on the threads of the node that holds it ([`super::Placement::NodeLocal`]).
    pub fn adam_step_range(
        &self,
        state: AdamSlices<'_>,
        range: Range<usize>,
        grads: GradsIn<'_>,
        mut params_out: ParamsOut<'_>,
        step: &OffloadStep,
        config: &AdamConfig,
    ) -> Result<(), OffloadError> {
        let len = state.master.len();
        if state.exp_avg.len() != len || state.exp_avg_sq.len() != len {
            return Err(OffloadError::StateLengths {
                master: len,
                exp_avg: state.exp_avg.len(),
                exp_avg_sq: state.exp_avg_sq.len(),
            });
        }
        check(len, &range, &grads, &params_out, step)?;
        let (g, o) = io_ptrs(&grads, &mut params_out);
        // SAFETY: the state slices are `len` long and `range` is within them.
        let ptrs = unsafe {
            StatePtrs {
                master: state.master.as_mut_ptr().add(range.start),
                exp_avg: state.exp_avg.as_mut_ptr().add(range.start),
                exp_avg_sq: state.exp_avg_sq.as_mut_ptr().add(range.start),
            }
        };
        let lanes = Lanes {
            src: ptrs,
            dst: ptrs,
            grads: g,
            out: o,
            len: range.len(),
        };
        // SAFETY: `lanes` covers exactly the borrowed slices' `range` (checked above), and
        // the borrows last until `run_lanes` returns.
        unsafe { self.run_lanes(&lanes, range, len, step, config) };
        Ok(())
    }

    /// Runs the kernel over `lanes` (which are `range` of a partition of `total`) on the
    /// threads that own each part.
    ///
    /// # Safety
    /// `lanes` is valid for `range.len()` elements and nothing else touches that memory
    /// until this returns.
    pub(crate) unsafe fn run_lanes(
        &self,
        lanes: &Lanes,
        range: Range<usize>,
        total: usize,
        step: &OffloadStep,
        config: &AdamConfig,
    ) {
        let scalars = StepScalars::new(config, step.step, step.lr);
        let (isa, factor, start) = (self.isa(), step.grad_factor, range.start);
        self.for_each_part(range, total, |part| {
            // SAFETY: `part` is within `range` and the parts are disjoint (the caller's
            // contract and `thread_ranges`'s).
            unsafe {
                let sub = lanes.sub(part.start - start, part.len());
                dispatch::run(isa, &sub, &scalars, factor);
            }
        });
    }
}
