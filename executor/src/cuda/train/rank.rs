//! [`Gpu`]: one rank's GPU as a target of the one device step ([`CudaStep`], the CUDA backend
//! of the training loop), one rank of `W` on one GPU's buffers. It runs the phases of its
//! program (one GPU's at `W = 1`, [`super::world_program`]'s at `W > 1`: the plan's bucket
//! reductions, stage-3 gathers and releases and the parameter all-gather as collectives),
//! compute ops through the [`Executor`] and communication ops through [`run_phase`] and the
//! rank's [`RankComm`].
//!
//! The gradient norm and the overflow flag are reduced over the ranks by the program's norm
//! phase (sum and max of the ranks' partitions, as the CPU stages do); the loop's loss average
//! and its checkpoint agreement go through the host [`Comm`]. Checkpoints hold this rank's
//! share in the CPU rank's layout (`super::owned::DeviceOwned`). **Needs a GPU.**

use std::sync::Arc;

use crate::cuda::gemm::GemmElement;
use cudarc::driver::CudaStream;

use super::device_step::{DeviceBatch, DeviceStep, StepTarget};
use super::execute::{DeviceBuffers, Executor, RunScalars};
use super::execute_comm::{CommRunner, run_phase};
use super::region::Region;
use super::{ConstantUpload, Op};
use crate::comm::watchdog::Watch;
use crate::comm::{Comm, CommTraffic, StepPhase};
use crate::cuda::device_comm::{DeviceComm, HostStaged, Wire};
use crate::cuda::error::CudaError;
use crate::cuda::launch::Storage;
use crate::cuda::nccl::NcclComm;
use crate::zero::ZeroError;

/// A GPU rank's communication: the device collectives of its step and the host [`Comm`] of
/// the training loop (loss average, checkpoint agreement).
pub trait RankComm {
    /// The device collectives.
    type Device: DeviceComm;
    /// The device collectives.
    fn device(&mut self) -> &mut Self::Device;
    /// The host collectives.
    fn host(&mut self) -> &mut dyn Comm;
    /// What this rank has sent so far.
    fn traffic(&mut self) -> CommTraffic;
    /// Watches a phase of the step (NCCL's watchdog; the host `Comm`s fail on their own).
    fn watch(&mut self, phase: StepPhase) -> Watch {
        let _ = phase;
        Watch::none()
    }
}

/// Ranks sharing a GPU (or one rank alone): the device collectives staged through the host
/// `Comm`, which is also the loop's.
impl<C: Comm> RankComm for HostStaged<C> {
    type Device = Self;

    fn device(&mut self) -> &mut Self {
        self
    }

    fn host(&mut self) -> &mut dyn Comm {
        HostStaged::<C>::host(self)
    }

    fn traffic(&mut self) -> CommTraffic {
        HostStaged::<C>::host(self).traffic().clone()
    }
}

/// A process per GPU under torchrun or the DeepSpeed launcher: NCCL for both (the loop's few
/// host collectives staged through a device buffer).
impl RankComm for NcclComm {
    type Device = Self;

    fn device(&mut self) -> &mut Self {
        self
    }

    fn host(&mut self) -> &mut dyn Comm {
        self
    }

    fn traffic(&mut self) -> CommTraffic {
        NcclComm::traffic(self).clone()
    }

    fn watch(&mut self, phase: StepPhase) -> Watch {
        NcclComm::watch(self, phase)
    }
}

/// NCCL on the device next to a host `Comm` of the same ranks (thread ranks with a GPU each,
/// or MPI processes under `mpirun`): the loop's host collectives keep the host `Comm`'s
/// contract (rank-ordered reductions, a peer's departure an error).
#[derive(Debug)]
pub struct NcclWithHost<H: Comm> {
    /// The device collectives.
    pub nccl: NcclComm,
    /// The host collectives.
    pub host: H,
}

impl<H: Comm> RankComm for NcclWithHost<H> {
    type Device = NcclComm;

    fn device(&mut self) -> &mut NcclComm {
        &mut self.nccl
    }

    fn host(&mut self) -> &mut dyn Comm {
        &mut self.host
    }

    fn traffic(&mut self) -> CommTraffic {
        self.nccl.traffic().clone()
    }

    fn watch(&mut self, phase: StepPhase) -> Watch {
        self.nccl.watch(phase)
    }
}

/// The CUDA backend of the training loop: a rank's step on one GPU's buffers.
pub type CudaStep<'a, T, C> = DeviceStep<'a, Gpu<'a, T, C>>;

/// A CUDA failure as the loop's error.
pub(crate) fn device(e: impl Into<CudaError>) -> ZeroError {
    ZeroError::Device(e.into().to_string())
}

/// One rank's GPU as a target of the device step: its compute stream and executor, its
/// buffers, its communication and the runner of its communication ops.
pub struct Gpu<'a, T: Storage, C: RankComm> {
    executor: &'a Executor<'a>,
    stream: Arc<CudaStream>,
    bufs: DeviceBuffers<T>,
    comm: C,
    runner: CommRunner,
}

impl<'a, T: GemmElement + Wire, C: RankComm> Gpu<'a, T, C> {
    /// The rank's GPU: `bufs` allocated on `stream`, its constant tables (`constants`)
    /// uploaded.
    pub fn new(
        executor: &'a Executor<'a>,
        stream: Arc<CudaStream>,
        mut bufs: DeviceBuffers<T>,
        comm: C,
        constants: &[ConstantUpload],
    ) -> Result<Self, CudaError> {
        for constant in constants {
            let span = constant.at.span;
            stream.memcpy_htod(
                &constant.values,
                &mut bufs.stats.slice_mut(span.offset..span.end()),
            )?;
        }
        Ok(Self {
            executor,
            runner: CommRunner::new(stream.clone()),
            stream,
            bufs,
            comm,
        })
    }

    /// The rank's communication (its traffic, at the end of a run).
    pub fn comm_mut(&mut self) -> &mut C {
        &mut self.comm
    }

    /// Waits for the compute and the communication streams.
    fn wait(&mut self) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        self.comm.device().stream().synchronize()?;
        Ok(())
    }

    /// `len` elements of a model-state region from `at`, as f32.
    fn read_region(
        &mut self,
        region: Region,
        at: usize,
        len: usize,
    ) -> Result<Vec<f32>, CudaError> {
        self.wait()?;
        let range = at..at + len;
        let values = match region {
            Region::Params => self
                .stream
                .clone_dtoh(&self.bufs.params.slice(range))?
                .iter()
                .map(|x| x.to_f32())
                .collect(),
            Region::Master => self.stream.clone_dtoh(&self.bufs.master.slice(range))?,
            Region::ExpAvg => self.stream.clone_dtoh(&self.bufs.exp_avg.slice(range))?,
            Region::ExpAvgSq => self.stream.clone_dtoh(&self.bufs.exp_avg_sq.slice(range))?,
            other => return Err(CudaError::Shape(format!("{other:?} is not read back"))),
        };
        self.stream.synchronize()?;
        Ok(values)
    }

    /// Writes a model-state region's elements from `at`.
    fn write_region(&mut self, region: Region, at: usize, values: &[f32]) -> Result<(), CudaError> {
        let range = at..at + values.len();
        match region {
            Region::Params => {
                let rounded: Vec<T> = values.iter().map(|&x| T::from_f32(x)).collect();
                self.stream
                    .memcpy_htod(&rounded, &mut self.bufs.params.slice_mut(range))?
            }
            Region::Master => self
                .stream
                .memcpy_htod(values, &mut self.bufs.master.slice_mut(range))?,
            Region::ExpAvg => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg.slice_mut(range))?,
            Region::ExpAvgSq => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg_sq.slice_mut(range))?,
            other => return Err(CudaError::Shape(format!("{other:?} is not written back"))),
        }
        self.stream.synchronize()?;
        Ok(())
    }
}

impl<T: GemmElement + Wire, C: RankComm> StepTarget for Gpu<'_, T, C> {
    fn run(&mut self, ops: &[Op], scalars: &RunScalars) -> Result<(), ZeroError> {
        run_phase(
            ops,
            self.executor,
            &mut self.runner,
            &mut self.bufs,
            self.comm.device(),
            scalars,
        )
        .map_err(device)
    }

    fn upload_batch(&mut self, batch: &DeviceBatch) -> Result<(), ZeroError> {
        upload_batch(&self.stream, &mut self.bufs, batch).map_err(device)
    }

    fn losses(&mut self, count: usize) -> Result<Vec<f32>, ZeroError> {
        let end = self.bufs.stats.len();
        let losses = self
            .stream
            .clone_dtoh(&self.bufs.stats.slice(end - count.min(end)..end))
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        Ok(losses)
    }

    fn norm(&mut self) -> Result<(f64, bool), ZeroError> {
        self.wait().map_err(device)?;
        let total = self
            .stream
            .clone_dtoh(&self.bufs.norm_total)
            .map_err(device)?;
        let flag = self
            .stream
            .clone_dtoh(&self.bufs.found_inf)
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        Ok((total[0], flag[0] != 0))
    }

    fn read(&mut self, region: Region, at: usize, len: usize) -> Result<Vec<f32>, ZeroError> {
        self.read_region(region, at, len).map_err(device)
    }

    fn write(&mut self, region: Region, at: usize, values: &[f32]) -> Result<(), ZeroError> {
        self.write_region(region, at, values).map_err(device)
    }

    fn synchronize(&mut self) -> Result<(), ZeroError> {
        self.wait().map_err(device)
    }

    fn host_comm(&mut self) -> &mut dyn Comm {
        self.comm.host()
    }

    fn watch(&mut self, phase: StepPhase) -> Watch {
        self.comm.watch(phase)
    }
}

/// Copies a micro-batch's tokens, targets and token buckets to the device.
fn upload_batch<T: Storage>(
    stream: &Arc<CudaStream>,
    bufs: &mut DeviceBuffers<T>,
    DeviceBatch {
        inputs,
        targets,
        buckets,
    }: &DeviceBatch,
) -> Result<(), CudaError> {
    stream.memcpy_htod(inputs, &mut bufs.tokens)?;
    stream.memcpy_htod(targets, &mut bufs.targets)?;
    stream.memcpy_htod(
        &buckets.tokens,
        &mut bufs.bucket_tokens.slice_mut(..buckets.len()),
    )?;
    stream.memcpy_htod(
        &buckets.starts,
        &mut bufs.bucket_starts.slice_mut(..buckets.len() + 1),
    )?;
    stream.memcpy_htod(&buckets.rows, &mut bufs.bucket_rows)?;
    Ok(())
}
