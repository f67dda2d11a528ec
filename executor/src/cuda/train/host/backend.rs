//! [`HostTarget`]: the host interpreter as a target of the one device step
//! ([`DeviceStep`]): a phase's compute ops run through [`run_compute`], its communication ops
//! through [`run_comm`] and the rank's host [`Comm`] (also the loop's), on [`HostBuffers`]
//! laid out as the device's. [`HostStep`] is the training loop's backend over it, the same
//! code that drives a GPU rank.

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::HostError;
use super::buffers::HostBuffers;
use super::collectives::run_comm;
use super::compute::run_compute;
use crate::comm::Comm;
use crate::cuda::element::Access;
use crate::cuda::train::device_step::{DeviceBatch, DeviceStep, StepTarget};
use crate::cuda::train::execute::RunScalars;
use crate::cuda::train::program::Op;
use crate::cuda::train::region::{Region, TensorRef};
use crate::tensor::Span;
use crate::zero::ZeroError;

/// The host backend of the training loop: a rank's program on host buffers.
pub type HostStep<'a, C> = DeviceStep<'a, HostTarget<C>>;

/// A host failure as the loop's error.
fn failed(e: HostError) -> ZeroError {
    ZeroError::Device(format!("host interpreter: {e}"))
}

/// A rank's host buffers, its collectives and the normalisation epsilon.
pub struct HostTarget<C> {
    /// The buffers, filled as the device's are at the start.
    pub bufs: HostBuffers,
    /// The rank's host collectives.
    pub comm: C,
    /// The normalisation epsilon.
    pub eps: f32,
}

impl<C> HostTarget<C> {
    /// Every model-dtype tensor `op` wrote, rounded as the device stores it (what an op wrote
    /// in place, a collective's sums, escapes [`HostBuffers::write`]'s rounding).
    fn round_written(&mut self, op: &Op) -> Result<(), HostError> {
        op.tensors()
            .iter()
            .filter(|(_, access)| *access == Access::Write)
            .try_for_each(|(t, _)| self.bufs.round_stored(t))
    }
}

impl<C: Comm> StepTarget for HostTarget<C> {
    fn run(&mut self, ops: &[Op], scalars: &RunScalars) -> Result<(), ZeroError> {
        for op in ops {
            match op {
                Op::Collective(comm_op) => run_comm(comm_op, &mut self.bufs, &mut self.comm),
                compute => run_compute(compute, &mut self.bufs, scalars, self.eps),
            }
            .and_then(|()| self.round_written(op))
            .map_err(|e| failed(HostError(format!("{e} (in {op:?})"))))?;
        }
        Ok(())
    }

    fn upload_batch(&mut self, batch: &DeviceBatch) -> Result<(), ZeroError> {
        let (bufs, buckets) = (&mut self.bufs, &batch.buckets);
        let step = Region::Step;
        bufs.upload_u32(step(CudaRegion::Tokens), &batch.inputs)
            .and_then(|()| bufs.upload_i32(step(CudaRegion::Targets), &batch.targets))
            .and_then(|()| bufs.upload_u32(step(CudaRegion::BucketTokens), &buckets.tokens))
            .and_then(|()| bufs.upload_i32(step(CudaRegion::BucketStarts), &buckets.starts))
            .and_then(|()| bufs.upload_i32(step(CudaRegion::BucketRows), &buckets.rows))
            .map_err(failed)
    }

    fn losses(&mut self, count: usize) -> Result<Vec<f32>, ZeroError> {
        let stats = self.bufs.whole(Region::Step(CudaRegion::Stats));
        let all = self.bufs.f32s(&stats).map_err(failed)?;
        all.get(all.len().saturating_sub(count)..)
            .map(<[f32]>::to_vec)
            .ok_or_else(|| failed(HostError("no losses".into())))
    }

    fn norm(&mut self) -> Result<(f64, bool), ZeroError> {
        let total = self.bufs.whole(Region::Step(CudaRegion::NormTotal));
        let flag = self.bufs.whole(Region::Step(CudaRegion::FoundInf));
        let sum = self.bufs.f64s(&total).map_err(failed)?[0];
        let found_inf = self.bufs.i32s(&flag).map_err(failed)?[0] != 0;
        Ok((sum, found_inf))
    }

    fn read(&mut self, region: Region, at: usize, len: usize) -> Result<Vec<f32>, ZeroError> {
        self.bufs
            .read(&TensorRef::of(region, Span::new(at, len)))
            .map_err(failed)
    }

    fn write(&mut self, region: Region, at: usize, values: &[f32]) -> Result<(), ZeroError> {
        self.bufs
            .write(&TensorRef::of(region, Span::new(at, values.len())), values)
            .map_err(failed)
    }

    fn synchronize(&mut self) -> Result<(), ZeroError> {
        Ok(())
    }

    fn host_comm(&mut self) -> &mut dyn Comm {
        &mut self.comm
    }
}
