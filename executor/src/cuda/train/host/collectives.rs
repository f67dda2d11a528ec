//! The communication ops of a program ([`CommOp`]) on [`HostBuffers`], through the rank's
//! host [`Comm`], with the semantics `execute_comm.rs` gives them on the GPU when the device
//! collectives are staged through the host (`cuda::device_comm::HostStaged`, what thread
//! ranks sharing one GPU run): the same staging functions ([`staged_all_reduce`],
//! [`staged_reduce_scatter`], [`staged_all_gather`]), the same buffers allowed per collective
//! and per copy, an in-place all-gather taking this rank's piece at `rank × piece` of its
//! output.
//!
//! One host thread runs a rank's ops in program order, so the streams and events of the
//! program (waits, records, [`CommAction::Sync`]) have no work here, and neither have markers
//! and releases (a release frees a place for a later gather; it never writes). What the
//! interpreter computes is therefore the program's result under one serial order of its two
//! streams: a missing wait between them is not seen here (`super::ordering` checks the events
//! on their own).

use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::Collective;

use super::HostError;
use super::buffers::HostBuffers;
use crate::comm::Comm;
use crate::cuda::device_comm::{staged_all_gather, staged_all_reduce, staged_reduce_scatter};
use crate::cuda::train::program::{CommAction, CommOp};
use crate::cuda::train::region::Region;
use crate::model::residual::accumulate;

fn refused(what: &str, op: &CommOp) -> HostError {
    HostError(format!("{what}: {op:?}"))
}

fn comm_error(e: crate::comm::CommError) -> HostError {
    HostError(format!("host collective: {e}"))
}

/// Runs `op` on `bufs` through `comm`.
pub fn run_comm(op: &CommOp, bufs: &mut HostBuffers, comm: &mut dyn Comm) -> Result<(), HostError> {
    match &op.action {
        CommAction::Sync | CommAction::Mark(_) | CommAction::Release { .. } => Ok(()),
        CommAction::Zero { tensor } => match tensor.region {
            Region::ReduceStaging | Region::GatherIn | Region::GatherOut => {
                bufs.f32s_mut(tensor)?.fill(0.0);
                Ok(())
            }
            _ => Err(refused("zero outside the staging buffers", op)),
        },
        CommAction::Copy { pieces } => {
            for piece in pieces {
                match (piece.dst.region, piece.src.region) {
                    (Region::GatherIn, Region::Params)
                    | (Region::Params, Region::GatherOut)
                    | (Region::ReduceStaging, Region::Grads)
                    | (Region::Grads, Region::ReduceStaging) => {}
                    _ => return Err(refused("a copy the device does not make", op)),
                }
                let values = bufs.read(&piece.src)?;
                bufs.write(&piece.dst, &values)?;
            }
            Ok(())
        }
        CommAction::Accumulate { pieces } => {
            for piece in pieces {
                if (piece.dst.region, piece.src.region) != (Region::Grads, Region::ReduceStaging) {
                    return Err(refused("an accumulation the device does not make", op));
                }
                let add = bufs.read(&piece.src)?;
                let mut sum = bufs.read(&piece.dst)?;
                accumulate(&mut sum, &add);
                bufs.write(&piece.dst, &sum)?;
            }
            Ok(())
        }
        CommAction::Collective {
            kind,
            input,
            output,
            reduction,
            world,
            ..
        } => {
            if *world != comm.world_size() {
                return Err(refused(
                    &format!(
                        "a collective over {world} ranks in a group of {}",
                        comm.world_size()
                    ),
                    op,
                ));
            }
            let reduce =
                || reduction.ok_or_else(|| refused("a reduction without its operator", op));
            match kind {
                Collective::AllReduce => match output.region {
                    Region::Grads | Region::ReduceStaging => {
                        staged_all_reduce(comm, bufs.f32s_mut(output)?, reduce()?)
                            .map_err(comm_error)
                    }
                    Region::Step(CudaRegion::NormTotal) => {
                        staged_all_reduce(comm, bufs.f64s_mut(output)?, reduce()?)
                            .map_err(comm_error)
                    }
                    Region::Step(CudaRegion::FoundInf) => {
                        staged_all_reduce(comm, bufs.i32s_mut(output)?, reduce()?)
                            .map_err(comm_error)
                    }
                    _ => Err(refused("all-reduce", op)),
                },
                Collective::ReduceScatter => match (input.region, output.region) {
                    (Region::ReduceStaging, Region::Grads | Region::ReduceStaging) => {
                        let sent = bufs.read(input)?;
                        staged_reduce_scatter(comm, &sent, bufs.f32s_mut(output)?, reduce()?)
                            .map_err(comm_error)
                    }
                    _ => Err(refused("reduce-scatter", op)),
                },
                Collective::AllGather => match (input.region, output.region) {
                    (Region::Params, Region::Params) => {
                        let whole = bufs.read(output)?;
                        let world = comm.world_size();
                        if world == 0 || !whole.len().is_multiple_of(world) {
                            return Err(refused("an all-gather that does not split evenly", op));
                        }
                        let piece = whole.len() / world;
                        let start = comm.rank() * piece;
                        let mine = whole[start..start + piece].to_vec();
                        staged_all_gather(comm, &mine, bufs.f32s_mut(output)?).map_err(comm_error)
                    }
                    (Region::GatherIn, Region::GatherOut) => {
                        let sent = bufs.read(input)?;
                        staged_all_gather(comm, &sent, bufs.f32s_mut(output)?).map_err(comm_error)
                    }
                    _ => Err(refused("all-gather", op)),
                },
                Collective::Reduce => Err(refused("a reduce per rank is not run", op)),
            }
        }
    }
}
