//! [`CudaStep`]: the CUDA backend of the one training loop (`crate::train::step`), one rank of
//! `W` on one GPU's buffers. It runs the phases of its [`StepProgram`] (one GPU's program at
//! `W = 1`, [`super::world_program`]'s at `W > 1`: the plan's bucket reductions, stage-3
//! gathers and releases and the parameter all-gather as collectives), compute ops through the
//! [`Executor`] and communication ops through [`run_phase`] and the rank's [`RankComm`].
//!
//! The gradient norm and the overflow flag are reduced over the ranks by the program's norm
//! phase (sum and max of the ranks' partitions, as the CPU stages do); the loop's loss average
//! and its checkpoint agreement go through the host [`Comm`]. Checkpoints hold this rank's
//! share in the CPU rank's layout ([`DeviceOwned`]). **Needs a GPU.**

use std::sync::Arc;

use crate::cuda::gemm::GemmElement;
use cudarc::driver::CudaStream;
use dsplan_planner::config::ZeroStage;
use dsplan_planner::schedule::clip::fp32_clip_coefficient;

use super::execute::{DeviceBuffers, Executor, RunScalars};
use super::execute_comm::{CommRunner, run_phase};
use super::owned::{DeviceOwned, held_from_whole};
use super::region::{Region, RegionSizes};
use super::step::StepProgram;
use super::{ConstantUpload, Op};
use crate::comm::watchdog::Watch;
use crate::comm::{Comm, CommTraffic, StepPhase};
use crate::cuda::adamw::AdamScalars;
use crate::cuda::device_comm::{DeviceComm, HostStaged, Wire};
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::error::CudaError;
use crate::cuda::launch::Storage;
use crate::cuda::nccl::NcclComm;
use crate::data::TokenBatch;
use crate::metrics::PhaseTimes;
use crate::optim::AdamConfig;
use crate::train::StepBackend;
use crate::zero::{ClipRule, Dtype as ModelDtype, EnginePlan, OwnedState, Scales, ZeroError};

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

/// The CUDA backend of the training loop: rank `rank`'s step on one GPU's buffers.
pub struct CudaStep<'a, T: Storage, C: RankComm> {
    executor: &'a Executor<'a>,
    stream: Arc<CudaStream>,
    program: &'a StepProgram,
    owned: &'a DeviceOwned,
    plan: &'a EnginePlan,
    rank: usize,
    trains_master: bool,
    bufs: DeviceBuffers<T>,
    comm: C,
    runner: CommRunner,
    scalars: RunScalars,
    /// Micro-steps in an optimizer step, and how many of this one have run.
    grad_accum: usize,
    micro: usize,
    /// The norm pass's sum of squares (of the gradients divided by the loss scale), over
    /// every rank.
    sum_of_squares: f64,
    /// The norm pass's inf/NaN flag, over every rank.
    found_inf: bool,
    /// What the fused AdamW multiplies each gradient by (`clip * S / S'`).
    multiplier: f32,
    /// Adam's step count.
    adam_steps: u64,
}

/// A CUDA failure as the loop's error.
pub(crate) fn device(e: impl Into<CudaError>) -> ZeroError {
    ZeroError::Device(e.into().to_string())
}

/// What a [`CudaStep`] is built from.
pub struct RankParts<'a, T: Storage, C> {
    /// The compute ops' runner.
    pub executor: &'a Executor<'a>,
    /// The compute stream.
    pub stream: Arc<CudaStream>,
    /// The rank's step.
    pub program: &'a StepProgram,
    /// Its region sizes.
    pub layout: &'a dyn RegionSizes,
    /// What it owns.
    pub owned: &'a DeviceOwned,
    /// The engine's plan (the checkpoint layout).
    pub plan: &'a EnginePlan,
    /// This rank.
    pub rank: usize,
    /// Its allocated buffers.
    pub bufs: DeviceBuffers<T>,
    /// Its communication.
    pub comm: C,
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
}

impl<'a, T: GemmElement + Wire, C: RankComm> CudaStep<'a, T, C> {
    /// The backend of `parts`, its constant tables (`constants`) uploaded.
    pub fn new(
        parts: RankParts<'a, T, C>,
        constants: &[ConstantUpload],
    ) -> Result<Self, CudaError> {
        let mut bufs = parts.bufs;
        for constant in constants {
            let span = constant.at.span;
            parts.stream.memcpy_htod(
                &constant.values,
                &mut bufs.stats.slice_mut(span.offset..span.end()),
            )?;
        }
        Ok(Self {
            executor: parts.executor,
            runner: CommRunner::new(parts.stream.clone()),
            stream: parts.stream,
            program: parts.program,
            owned: parts.owned,
            plan: parts.plan,
            rank: parts.rank,
            trains_master: parts.layout.trains_master(),
            bufs,
            comm: parts.comm,
            scalars: RunScalars {
                dloss: 0.0,
                inv_scale: 1.0,
                adam: None,
                bucket_groups: 0,
            },
            grad_accum: parts.grad_accum.max(1),
            micro: 0,
            sum_of_squares: 0.0,
            found_inf: false,
            multiplier: 1.0,
            adam_steps: 0,
        })
    }

    /// The rank's communication (its traffic, at the end of a run).
    pub fn comm_mut(&mut self) -> &mut C {
        &mut self.comm
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), ZeroError> {
        run_phase(
            ops,
            self.executor,
            &mut self.runner,
            &mut self.bufs,
            self.comm.device(),
            &self.scalars,
        )
        .map_err(device)
    }

    /// Waits for the compute and the communication streams.
    fn synchronize(&mut self) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        self.comm.device().stream().synchronize()?;
        Ok(())
    }

    /// The rank's owned fp32 master (the parameters it steps, in fp32 runs), in the device's
    /// layout of its owned range.
    pub fn owned_master(&mut self) -> Result<Vec<f32>, CudaError> {
        self.synchronize()?;
        let len = self.owned.len;
        let values = if self.trains_master {
            self.stream.clone_dtoh(&self.bufs.master.slice(..len))?
        } else {
            let at = self.owned.params_at;
            self.stream
                .clone_dtoh(&self.bufs.params.slice(at..at + len))?
                .iter()
                .map(|x| x.to_f32())
                .collect()
        };
        self.stream.synchronize()?;
        Ok(values)
    }

    /// The rank's owned fp32 master in the CPU rank's checkpoint layout.
    pub fn export_master(&mut self) -> Result<Vec<f32>, CudaError> {
        let owned = self.owned_master()?;
        Ok(self.owned.to_cpu(self.plan, self.rank, &owned))
    }

    fn moment(&mut self, region: Region) -> Result<Vec<f32>, CudaError> {
        let len = self.owned.len;
        let slice = match region {
            Region::ExpAvg => self.bufs.exp_avg.slice(..len),
            _ => self.bufs.exp_avg_sq.slice(..len),
        };
        let values = self.stream.clone_dtoh(&slice)?;
        self.stream.synchronize()?;
        Ok(values)
    }

    /// Uploads the owned range `values` (device layout) of `region`.
    fn upload_owned(&mut self, region: Region, values: &[f32]) -> Result<(), CudaError> {
        let n = values.len();
        match region {
            Region::ExpAvg => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg.slice_mut(..n))?,
            Region::ExpAvgSq => self
                .stream
                .memcpy_htod(values, &mut self.bufs.exp_avg_sq.slice_mut(..n))?,
            _ if self.trains_master => self
                .stream
                .memcpy_htod(values, &mut self.bufs.master.slice_mut(..n))?,
            _ => {
                let at = self.owned.params_at;
                let rounded: Vec<T> = values.iter().map(|&x| T::from_f32(x)).collect();
                self.stream
                    .memcpy_htod(&rounded, &mut self.bufs.params.slice_mut(at..at + n))?
            }
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// The model-dtype parameters this rank holds, as the whole flat model (stages 0-2: the
    /// gathered parameters; stage 3: its shard, other ranks' elements zero).
    fn held_whole(&mut self) -> Result<Vec<f32>, CudaError> {
        self.synchronize()?;
        let n = self.owned.num_params;
        let sharded = self.plan.world() > 1 && self.plan.stage() == ZeroStage::Weights;
        let (at, len) = if sharded {
            (self.owned.params_at, self.owned.len)
        } else {
            (0, n)
        };
        let values: Vec<f32> = self
            .stream
            .clone_dtoh(&self.bufs.params.slice(at..at + len))?
            .iter()
            .map(|x| x.to_f32())
            .collect();
        self.stream.synchronize()?;
        if !sharded {
            return Ok(values);
        }
        let mut whole = vec![0.0f32; n];
        self.owned.into_whole(&values, &mut whole);
        Ok(whole)
    }
}

impl<T: GemmElement + Wire, C: RankComm> StepBackend for CudaStep<'_, T, C> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn comm(&mut self) -> &mut dyn Comm {
        self.comm.host()
    }

    fn begin_step(&mut self) -> Result<(), ZeroError> {
        self.micro = 0;
        let program = self.program;
        self.run(&program.start)
    }

    /// On the GPU the micro-step's kernels are queued, not timed per phase: `times` is left
    /// as it is. The last micro-step of the optimizer step is the boundary one, which
    /// reduces the gradients.
    fn micro_step(
        &mut self,
        batch: &TokenBatch,
        grad_scale: f32,
        _times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError> {
        let inputs = batch.inputs();
        let targets: Vec<i32> = batch.targets().iter().map(|&t| t as i32).collect();
        if inputs.len() != self.bufs.tokens.len() {
            return Err(device(CudaError::Shape(format!(
                "a micro-batch of {} tokens for buffers of {}",
                inputs.len(),
                self.bufs.tokens.len()
            ))));
        }
        let buckets = TokenBuckets::new(&inputs)
            .ok_or_else(|| device(CudaError::Shape("batch too large for i32 rows".to_string())))?;
        upload_batch(&self.stream, &mut self.bufs, &inputs, &targets, &buckets).map_err(device)?;
        self.scalars.bucket_groups = buckets.len();
        let count = targets.len().max(1);
        self.scalars.dloss = grad_scale / count as f32;
        let program = self.program;
        self.micro += 1;
        if self.micro >= self.grad_accum {
            self.run(&program.boundary_micro_step)?;
        } else {
            self.run(&program.micro_step)?;
        }
        let end = self.bufs.stats.len();
        let losses = self
            .stream
            .clone_dtoh(&self.bufs.stats.slice(end - count..end))
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        Ok(total / count as f64)
    }

    /// One pass multiplies the gradients this rank owns by `1/S`, sums their squares (f64)
    /// and flags inf/NaN; at `W > 1` the program sums (maxes) both over the ranks.
    fn reduce_gradients(&mut self, loss_scale: f64) -> Result<(), ZeroError> {
        self.scalars.inv_scale = (1.0 / loss_scale) as f32;
        let program = self.program;
        self.run(&program.norm)?;
        self.synchronize().map_err(device)?;
        let total = self
            .stream
            .clone_dtoh(&self.bufs.norm_total)
            .map_err(device)?;
        let flag = self
            .stream
            .clone_dtoh(&self.bufs.found_inf)
            .map_err(device)?;
        self.stream.synchronize().map_err(device)?;
        self.sum_of_squares = total[0];
        self.found_inf = flag[0] != 0;
        Ok(())
    }

    fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        Ok(self.found_inf || !self.sum_of_squares.is_finite())
    }

    /// Nothing to do: the next step zeroes the gradients.
    fn discard(&mut self) {}

    /// The norm and clip coefficient over the flat gradients at once (the CPU reproduces
    /// each stage's per-tensor rounding, `rule`; the difference is rounding); the
    /// multiplication itself is fused into the optimizer step.
    fn unscale_and_clip(
        &mut self,
        _rule: ClipRule,
        scales: Scales,
        clip: f64,
    ) -> Result<f64, ZeroError> {
        let grad_norm = self.sum_of_squares.sqrt();
        let coefficient = if clip > 0.0 {
            fp32_clip_coefficient(grad_norm, clip)
        } else {
            1.0
        };
        self.multiplier = (coefficient * scales.grad_scale / scales.unscale_by) as f32;
        Ok(grad_norm)
    }

    /// The fused AdamW over the owned range, then (W > 1) the parameters gathered again.
    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        self.adam_steps += 1;
        self.scalars.adam = Some(AdamScalars::new(adam, self.adam_steps, lr, self.multiplier));
        let program = self.program;
        let ran = self.run(&program.update);
        self.scalars.adam = None;
        ran?;
        self.run(&program.after_update)?;
        self.synchronize().map_err(device)
    }

    fn export_owned(&mut self) -> Result<OwnedState, ZeroError> {
        let master = self.export_master().map_err(device)?;
        let (plan, rank) = (self.plan, self.rank);
        let exp_avg = self.moment(Region::ExpAvg).map_err(device)?;
        let exp_avg_sq = self.moment(Region::ExpAvgSq).map_err(device)?;
        Ok(OwnedState {
            master,
            exp_avg: self.owned.to_cpu(plan, rank, &exp_avg),
            exp_avg_sq: self.owned.to_cpu(plan, rank, &exp_avg_sq),
            adam_step: self.adam_steps,
        })
    }

    fn owned_len(&self) -> usize {
        self.plan.owned(self.rank).len()
    }

    fn import_owned(&mut self, state: &OwnedState) -> Result<(), ZeroError> {
        let (plan, rank) = (self.plan, self.rank);
        let device_of = |cpu: &[f32]| self.owned.from_cpu(plan, rank, cpu);
        let (master, exp_avg, exp_avg_sq) = (
            device_of(&state.master),
            device_of(&state.exp_avg),
            device_of(&state.exp_avg_sq),
        );
        self.upload_owned(Region::Master, &master).map_err(device)?;
        self.upload_owned(Region::ExpAvg, &exp_avg)
            .map_err(device)?;
        self.upload_owned(Region::ExpAvgSq, &exp_avg_sq)
            .map_err(device)?;
        self.adam_steps = state.adam_step;
        Ok(())
    }

    fn held_params(&mut self) -> Result<(ModelDtype, Vec<f32>), ZeroError> {
        let whole = self.held_whole().map_err(device)?;
        Ok((
            self.plan.dtypes().model,
            held_from_whole(self.plan, self.rank, &whole),
        ))
    }

    fn watch(&mut self, phase: StepPhase) -> Watch {
        self.comm.watch(phase)
    }
}

/// Copies a micro-batch's tokens, targets and token buckets to the device.
fn upload_batch<T: Storage>(
    stream: &Arc<CudaStream>,
    bufs: &mut DeviceBuffers<T>,
    inputs: &[u32],
    targets: &[i32],
    buckets: &TokenBuckets,
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
