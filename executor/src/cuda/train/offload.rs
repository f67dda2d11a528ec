//! ZeRO-Offload of the optimizer on the CUDA step (issue 30): a rank's program without offload
//! ([`super::StepProgram`], one GPU's or [`super::world_program`]'s) turned into the offloaded
//! one ([`offload_program`]), and which plans it runs ([`check_offload_plan`]).
//!
//! The fused AdamW of the `update` phase leaves the device. In its place:
//!
//! 1. `norm` ends with the rank's reduced, unscaled gradients (model dtype) copied device →
//!    host into the host's gradient staging ([`HostRegion::Grads`], the plan's "gradient
//!    staging (host)");
//! 2. the host optimizer ([`HostOp::AdamW`]) steps the host's fp32 master and moments with the
//!    fused kernel's arithmetic and scalars (unscale times clip coefficient);
//! 3. `update` copies the updated parameters host → device into the rank's owned range of the
//!    parameters (rounded to the model dtype on the host: the 16-bit copy-out), in pieces of
//!    the plan's [`PARAM_CHUNK`] (its two pinned chunks), before the parameters are gathered
//!    again.
//!
//! The device's master and moments are no longer allocated. Under
//! [`OffloadStepping::Speculative`] the host step runs before the norm and the overflow flag
//! are known ([`OffloadPhases::host_step`] from `super::device_step`), after the state is
//! saved into the speculative side ([`OffloadPhases::save`]); a step that is then clipped or
//! skipped restores it ([`OffloadPhases::restore`]) and, when clipped, steps again.
//!
//! What stays as in the program without offload: the device's gradient buffers (the plan's
//! leaner gradient arena at one GPU, and the host accumulating the gradient partition at
//! W > 1, are not built), and the exact order of the norm before the step.

use dsplan_planner::plan::cuda_offload::host::PARAM_CHUNK;
use dsplan_planner::plan::settings::OffloadStepping;

pub use super::offload_plan::check_offload_plan;
use super::program::{HostOp, Op, ShapeError};
use super::region::{HostRegion, Region, TensorRef, to_usize};
use super::step::{OffloadPhases, StepProgram};
use crate::tensor::Span;

/// `tensor`'s first `len` elements' place in host buffer `host`.
fn host(host: HostRegion, len: usize) -> TensorRef {
    TensorRef::of(Region::Host(host), Span::new(0, len))
}

/// The copies of host buffers `from` into `to`, `len` elements each.
fn copies(from: [HostRegion; 3], to: [HostRegion; 3], len: usize) -> Vec<Op> {
    from.into_iter()
        .zip(to)
        .map(|(src, dst)| {
            Op::Host(HostOp::Copy {
                dst: host(dst, len),
                src: host(src, len),
            })
        })
        .collect()
}

/// `program` with its optimizer on the host (the module documentation's steps), stepped as
/// `stepping` says; an error when its `update` phase holds no AdamW, or more than one.
pub fn offload_program(
    mut program: StepProgram,
    stepping: OffloadStepping,
) -> Result<StepProgram, ShapeError> {
    let position = program
        .update
        .iter()
        .position(|op| matches!(op, Op::AdamW { .. }));
    let Some(Op::AdamW {
        master,
        params_out,
        grads,
        segments,
        ..
    }) = position.map(|at| program.update.remove(at))
    else {
        return Err(ShapeError(
            "the step's update has no AdamW to offload".into(),
        ));
    };
    if program
        .update
        .iter()
        .any(|op| matches!(op, Op::AdamW { .. }))
    {
        return Err(ShapeError(
            "the step's update has more than one AdamW".into(),
        ));
    }
    let n = master.len();
    program.norm.push(Op::Host(HostOp::Copy {
        dst: host(HostRegion::Grads, n),
        src: grads,
    }));
    let on_device = params_out.unwrap_or(master);
    let chunk = to_usize(PARAM_CHUNK).max(1);
    let params_in = (0..n).step_by(chunk).map(|start| {
        let len = chunk.min(n - start);
        let piece = |t: TensorRef| TensorRef::of(t.region, Span::new(t.span.offset + start, len));
        Op::Host(HostOp::Copy {
            dst: piece(on_device),
            src: piece(host(HostRegion::Master, n)),
        })
    });
    let at = position.unwrap_or(0);
    program.update.splice(at..at, params_in);
    let state = [HostRegion::Master, HostRegion::ExpAvg, HostRegion::ExpAvgSq];
    let saved = [
        HostRegion::SavedMaster,
        HostRegion::SavedExpAvg,
        HostRegion::SavedExpAvgSq,
    ];
    let speculative = stepping == OffloadStepping::Speculative;
    program.offload = Some(OffloadPhases {
        stepping,
        host_step: vec![Op::Host(HostOp::AdamW {
            master: host(HostRegion::Master, n),
            grads: host(HostRegion::Grads, n),
            exp_avg: host(HostRegion::ExpAvg, n),
            exp_avg_sq: host(HostRegion::ExpAvgSq, n),
            segments: host(HostRegion::Segments, segments.len()),
        })],
        save: if speculative {
            copies(state, saved, n)
        } else {
            Vec::new()
        },
        restore: if speculative {
            copies(saved, state, n)
        } else {
            Vec::new()
        },
    });
    Ok(program)
}
