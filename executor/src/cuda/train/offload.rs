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

use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_offload::host::PARAM_CHUNK;
use dsplan_planner::plan::cuda_offload::resident_numel;
use dsplan_planner::plan::settings::{OffloadStepping, OffloadTarget};

use super::program::{HostOp, Op, ShapeError};
use super::region::{HostRegion, Region, TensorRef, to_usize};
use super::step::StepProgram;
use crate::tensor::Span;

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

/// Whether the CUDA step runs `plan`'s offload: `None` when it does not offload, the stepping
/// when it offloads the whole optimizer to host memory, an error naming the key otherwise.
pub fn check_offload_plan(plan: &Plan) -> Result<Option<OffloadStepping>, String> {
    let settings = &plan.settings;
    if settings.offload_param.is_offloaded() {
        return Err(
            "zero_optimization.offload_param: the CUDA step does not fetch parameters from \
             host memory yet (dsplan plan --backend dsplan-cuda plans it); remove offload_param"
                .into(),
        );
    }
    match settings.offload_optimizer {
        OffloadTarget::None => return Ok(None),
        OffloadTarget::Nvme { .. } => {
            return Err(
                "zero_optimization.offload_optimizer.device nvme: the CUDA step offloads the \
                 optimizer to host memory only; use \"device\": \"cpu\""
                    .into(),
            );
        }
        OffloadTarget::Cpu { .. } => {}
    }
    if resident_numel(&plan.shards) > 0 {
        return Err(
            "zero_optimization.offload_optimizer.ratio: the CUDA step offloads the whole \
             optimizer; a ratio below 1 (part of it kept on the GPU) is not run yet; remove \
             ratio"
                .into(),
        );
    }
    Ok(Some(settings.offload_stepping))
}

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
