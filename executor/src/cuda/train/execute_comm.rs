//! Runs the step's communication ops ([`CommOp`]) on the GPU: each on its stream (the compute
//! stream, or the [`DeviceComm`]'s), after the events it waits for, recording its own; the
//! collectives through the [`DeviceComm`], the pack and unpack copies as device-to-device
//! copies. [`run_phase`] runs a phase of a [`super::StepProgram`], compute ops through the
//! [`Executor`] and communication ops here. **Needs a GPU**.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cuda::gemm::GemmElement;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::Collective;

use super::execute::{DeviceBuffers, Executor, RunScalars};
use super::program::{CommAction, CommOp, CommStream, EventId, Op};
use super::region::{Region, TensorRef};
use crate::cuda::device_comm::{DeviceComm, Wire};
use crate::cuda::error::CudaError;
use crate::cuda::launch::{Launcher, Storage, read, table, write};

fn range(t: &TensorRef) -> std::ops::Range<usize> {
    t.span.offset..t.span.end()
}

fn unexpected(what: &str, op: &CommOp) -> CudaError {
    CudaError::Shape(format!("{what}: {op:?}"))
}

/// The events of a step, by id (an id not yet recorded is not waited for: its work has not
/// been issued, as at the first step).
#[derive(Debug)]
pub struct CommRunner {
    compute: Arc<CudaStream>,
    events: HashMap<EventId, CudaEvent>,
}

impl CommRunner {
    /// Runs communication ops against `compute`, the stream of the compute kernels.
    pub fn new(compute: Arc<CudaStream>) -> Self {
        Self {
            compute,
            events: HashMap::new(),
        }
    }

    /// Runs `op` on `bufs` through `comm` (accumulations with `launcher`'s kernels, on the
    /// op's stream).
    pub fn run<T: Storage + Wire, D: DeviceComm>(
        &mut self,
        op: &CommOp,
        bufs: &mut DeviceBuffers<T>,
        comm: &mut D,
        launcher: &Launcher<'_>,
    ) -> Result<(), CudaError> {
        let stream = match op.stream {
            CommStream::Compute => self.compute.clone(),
            CommStream::Comm => comm.stream().clone(),
        };
        for id in &op.waits {
            if let Some(event) = self.events.get(id) {
                stream.wait(event)?;
            }
        }
        match &op.action {
            CommAction::Sync | CommAction::Mark(_) | CommAction::Release { .. } => {}
            CommAction::Zero { tensor } => {
                let slice = staging(bufs, tensor.region).ok_or_else(|| unexpected("zero", op))?;
                stream.memset_zeros(&mut slice.slice_mut(range(tensor)))?;
            }
            CommAction::Copy { pieces } => {
                for piece in pieces {
                    let (dst, src) = pair(bufs, piece.dst.region, piece.src.region)
                        .ok_or_else(|| unexpected("copy", op))?;
                    stream.memcpy_dtod(
                        &src.slice(range(&piece.src)),
                        &mut dst.slice_mut(range(&piece.dst)),
                    )?;
                }
            }
            CommAction::Accumulate { pieces } => {
                let on_stream = launcher.on(stream.clone());
                for piece in pieces {
                    if (piece.dst.region, piece.src.region)
                        != (Region::Grads, Region::ReduceStaging)
                    {
                        return Err(unexpected("accumulate", op));
                    }
                    let call = table::accumulate(T::DTYPE, piece.src.len())?;
                    on_stream.launch(
                        &call,
                        T::DTYPE,
                        &mut [
                            write(&mut bufs.grads.slice_mut(range(&piece.dst))),
                            read(&bufs.reduce_staging.slice(range(&piece.src))),
                        ],
                    )?;
                }
            }
            CommAction::Collective { .. } => {
                let comm_stream = comm.stream().clone();
                if op.stream == CommStream::Compute {
                    comm_stream.join(&self.compute)?;
                }
                collective(op, bufs, comm)?;
                if op.stream == CommStream::Compute {
                    self.compute.join(&comm_stream)?;
                }
            }
        }
        if let Some(id) = op.record {
            self.events.insert(id, stream.record_event(None)?);
        }
        Ok(())
    }
}

/// The staging allocation of `region`.
fn staging<T: Storage>(bufs: &mut DeviceBuffers<T>, region: Region) -> Option<&mut CudaSlice<T>> {
    match region {
        Region::ReduceStaging => Some(&mut bufs.reduce_staging),
        Region::GatherIn => Some(&mut bufs.gather_in),
        Region::GatherOut => Some(&mut bufs.gather_out),
        _ => None,
    }
}

/// The destination and source allocations of a copy the step makes: the slices of the shard
/// into the all-gather input, the all-gather output into the parameters, the gradients into
/// the bucket staging and back.
fn pair<T: Storage>(
    bufs: &mut DeviceBuffers<T>,
    dst: Region,
    src: Region,
) -> Option<(&mut CudaSlice<T>, &CudaSlice<T>)> {
    let DeviceBuffers {
        params,
        grads,
        reduce_staging,
        gather_in,
        gather_out,
        ..
    } = bufs;
    match (dst, src) {
        (Region::GatherIn, Region::Params) => Some((gather_in, params)),
        (Region::Params, Region::GatherOut) => Some((params, gather_out)),
        (Region::ReduceStaging, Region::Grads) => Some((reduce_staging, grads)),
        (Region::Grads, Region::ReduceStaging) => Some((grads, reduce_staging)),
        _ => None,
    }
}

fn collective<T: Storage + Wire, D: DeviceComm>(
    op: &CommOp,
    bufs: &mut DeviceBuffers<T>,
    comm: &mut D,
) -> Result<(), CudaError> {
    let CommAction::Collective {
        kind,
        input,
        output,
        reduction,
        ..
    } = &op.action
    else {
        return Err(unexpected("not a collective", op));
    };
    let reduce = || reduction.ok_or_else(|| unexpected("a reduction without its operator", op));
    match kind {
        Collective::AllReduce => match output.region {
            Region::Grads => comm.all_reduce(&mut bufs.grads.slice_mut(range(output)), reduce()?),
            Region::ReduceStaging => {
                comm.all_reduce(&mut bufs.reduce_staging.slice_mut(range(output)), reduce()?)
            }
            Region::Step(CudaRegion::NormTotal) => {
                comm.all_reduce(&mut bufs.norm_total.slice_mut(range(output)), reduce()?)
            }
            Region::Step(CudaRegion::FoundInf) => {
                comm.all_reduce(&mut bufs.found_inf.slice_mut(range(output)), reduce()?)
            }
            _ => Err(unexpected("all-reduce", op)),
        },
        Collective::ReduceScatter => match (input.region, output.region) {
            (Region::ReduceStaging, Region::Grads) => comm.reduce_scatter(
                &bufs.reduce_staging.slice(range(input)),
                &mut bufs.grads.slice_mut(range(output)),
                reduce()?,
            ),
            // Into the staging's own last chunk, after the input (disjoint views of one
            // allocation).
            (Region::ReduceStaging, Region::ReduceStaging)
                if input.span.end() <= output.span.offset =>
            {
                let mut whole = bufs.reduce_staging.as_view_mut();
                let (sent, mut rest) = whole.split_at_mut(output.span.offset);
                let sent = sent.as_view();
                let mut received = rest.slice_mut(0..output.len());
                comm.reduce_scatter(&sent.slice(range(input)), &mut received, reduce()?)
            }
            _ => Err(unexpected("reduce-scatter", op)),
        },
        Collective::AllGather => match (input.region, output.region) {
            (Region::Params, Region::Params) => {
                comm.all_gather_in_place(&mut bufs.params.slice_mut(range(output)))
            }
            (Region::GatherIn, Region::GatherOut) => comm.all_gather(
                &bufs.gather_in.slice(range(input)),
                &mut bufs.gather_out.slice_mut(range(output)),
            ),
            _ => Err(unexpected("all-gather", op)),
        },
        Collective::Reduce => Err(unexpected("a reduce per rank is not run", op)),
    }
}

/// Runs `ops` (a phase of the step) in order: compute ops on the [`Executor`], communication
/// ops through `runner` and `comm`.
pub fn run_phase<T: GemmElement + Wire, D: DeviceComm>(
    ops: &[Op],
    executor: &Executor<'_>,
    runner: &mut CommRunner,
    bufs: &mut DeviceBuffers<T>,
    comm: &mut D,
    scalars: &RunScalars,
) -> Result<(), CudaError> {
    for op in ops {
        match op {
            Op::Collective(comm_op) => runner.run(comm_op, bufs, comm, &executor.launcher)?,
            compute => executor.run(compute, bufs, scalars)?,
        }
    }
    Ok(())
}
