//! [`HostStep`]: the backend of the one training loop that runs a rank's
//! [`StepProgram`] on the host, as `super::super::rank::CudaStep` runs it on a GPU: the same
//! phases at the same calls of the loop (`begin_step`: `start`; `micro_step`: the batch
//! uploaded, `micro_step` or, for the last micro-step of the optimizer step,
//! `boundary_micro_step`, the losses read back from the end of the statistics; at the
//! boundary `norm`, then the clip coefficient and AdamW's scalars computed as on the GPU;
//! `update` and `after_update`), the same owned ranges exported and imported in the CPU
//! rank's checkpoint layout. Compute ops run through [`run_compute`], communication ops through
//! [`run_comm`] and the rank's host [`Comm`] (also the loop's).

use dsplan_planner::config::ZeroStage;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::schedule::clip::fp32_clip_coefficient;

use super::HostError;
use super::buffers::HostBuffers;
use super::collectives::run_comm;
use super::compute::run_compute;
use crate::comm::Comm;
use crate::cuda::adamw::AdamScalars;
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::train::execute::RunScalars;
use crate::cuda::train::owned::{DeviceOwned, held_from_whole};
use crate::cuda::train::program::Op;
use crate::cuda::train::region::{Region, TensorRef};
use crate::cuda::train::step::StepProgram;
use crate::data::TokenBatch;
use crate::metrics::PhaseTimes;
use crate::optim::AdamConfig;
use crate::train::StepBackend;
use crate::zero::{ClipRule, Dtype as ModelDtype, EnginePlan, OwnedState, Scales, ZeroError};

/// A host failure as the loop's error.
fn failed(e: HostError) -> ZeroError {
    ZeroError::Device(format!("host interpreter: {e}"))
}

/// What a [`HostStep`] is built from.
pub struct HostParts<'a, C> {
    /// The rank's step.
    pub program: &'a StepProgram,
    /// Its buffers, filled as the device's are at the start.
    pub bufs: HostBuffers,
    /// What the rank owns.
    pub owned: &'a DeviceOwned,
    /// The engine's plan (the checkpoint layout).
    pub plan: &'a EnginePlan,
    /// This rank.
    pub rank: usize,
    /// Whether 16-bit parameters train through an fp32 master (never here: f32 only).
    pub trains_master: bool,
    /// The LayerNorm epsilon.
    pub eps: f32,
    /// The rank's host collectives.
    pub comm: C,
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
}

/// The host backend of the training loop: rank `rank`'s program on host buffers.
pub struct HostStep<'a, C: Comm> {
    program: &'a StepProgram,
    owned: &'a DeviceOwned,
    plan: &'a EnginePlan,
    rank: usize,
    trains_master: bool,
    eps: f32,
    bufs: HostBuffers,
    comm: C,
    scalars: RunScalars,
    grad_accum: usize,
    micro: usize,
    sum_of_squares: f64,
    found_inf: bool,
    multiplier: f32,
    adam_steps: u64,
}

impl<'a, C: Comm> HostStep<'a, C> {
    /// The backend of `parts`.
    pub fn new(parts: HostParts<'a, C>) -> Self {
        Self {
            program: parts.program,
            owned: parts.owned,
            plan: parts.plan,
            rank: parts.rank,
            trains_master: parts.trains_master,
            eps: parts.eps,
            bufs: parts.bufs,
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
        }
    }

    /// The rank's host collectives (its traffic, at the end of a run).
    pub fn comm_mut(&mut self) -> &mut C {
        &mut self.comm
    }

    /// The rank's buffers (tests read them).
    pub fn buffers(&self) -> &HostBuffers {
        &self.bufs
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), ZeroError> {
        for op in ops {
            match op {
                Op::Collective(comm_op) => run_comm(comm_op, &mut self.bufs, &mut self.comm),
                compute => run_compute(compute, &mut self.bufs, &self.scalars, self.eps),
            }
            .map_err(|e| failed(HostError(format!("{e} (in {op:?})"))))?;
        }
        Ok(())
    }

    fn owned_span(&self, region: Region, at: usize) -> TensorRef {
        TensorRef {
            region,
            span: crate::tensor::Span::new(at, self.owned.len),
        }
    }

    /// The rank's owned fp32 master in the device's layout of its owned range.
    pub fn owned_master(&self) -> Result<Vec<f32>, HostError> {
        if self.trains_master {
            self.bufs.read(&self.owned_span(Region::Master, 0))
        } else {
            self.bufs
                .read(&self.owned_span(Region::Params, self.owned.params_at))
        }
    }

    /// The rank's owned fp32 master in the CPU rank's checkpoint layout.
    pub fn export_master(&self) -> Result<Vec<f32>, HostError> {
        let owned = self.owned_master()?;
        Ok(self.owned.to_cpu(self.plan, self.rank, &owned))
    }

    /// The model-dtype parameters this rank holds, as the whole flat model (stages 0-2: the
    /// gathered parameters; stage 3: its shard, other ranks' elements zero).
    fn held_whole(&self) -> Result<Vec<f32>, HostError> {
        let n = self.owned.num_params;
        let sharded = self.plan.world() > 1 && self.plan.stage() == ZeroStage::Weights;
        if !sharded {
            return self.bufs.read(&TensorRef {
                region: Region::Params,
                span: crate::tensor::Span::new(0, n),
            });
        }
        let values = self
            .bufs
            .read(&self.owned_span(Region::Params, self.owned.params_at))?;
        let mut whole = vec![0.0f32; n];
        self.owned.into_whole(&values, &mut whole);
        Ok(whole)
    }

    fn upload_owned(&mut self, region: Region, values: &[f32]) -> Result<(), HostError> {
        let target = match region {
            Region::ExpAvg | Region::ExpAvgSq => self.owned_span(region, 0),
            _ if self.trains_master => self.owned_span(Region::Master, 0),
            _ => self.owned_span(Region::Params, self.owned.params_at),
        };
        self.bufs.write(&target.prefix(values.len()), values)
    }
}

impl<C: Comm> StepBackend for HostStep<'_, C> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn comm(&mut self) -> &mut dyn Comm {
        &mut self.comm
    }

    fn begin_step(&mut self) -> Result<(), ZeroError> {
        self.micro = 0;
        let program = self.program;
        self.run(&program.start)
    }

    fn micro_step(
        &mut self,
        batch: &TokenBatch,
        grad_scale: f32,
        _times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError> {
        let inputs = batch.inputs();
        let targets: Vec<i32> = batch.targets().iter().map(|&t| t as i32).collect();
        let tokens_len = self.bufs.len(Region::Step(CudaRegion::Tokens));
        if inputs.len() != tokens_len {
            return Err(failed(HostError(format!(
                "a micro-batch of {} tokens for buffers of {tokens_len}",
                inputs.len()
            ))));
        }
        let buckets = TokenBuckets::new(&inputs)
            .ok_or_else(|| failed(HostError("batch too large for i32 rows".into())))?;
        let upload = |bufs: &mut HostBuffers| -> Result<(), HostError> {
            bufs.upload_u32(Region::Step(CudaRegion::Tokens), &inputs)?;
            bufs.upload_i32(Region::Step(CudaRegion::Targets), &targets)?;
            bufs.upload_u32(Region::Step(CudaRegion::BucketTokens), &buckets.tokens)?;
            bufs.upload_i32(Region::Step(CudaRegion::BucketStarts), &buckets.starts)?;
            bufs.upload_i32(Region::Step(CudaRegion::BucketRows), &buckets.rows)
        };
        upload(&mut self.bufs).map_err(failed)?;
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
        // As on the GPU: the per-position losses are the statistics' last `count` elements.
        let stats = self.bufs.whole(Region::Step(CudaRegion::Stats));
        let all = self.bufs.f32s(&stats).map_err(failed)?;
        let losses = all
            .get(all.len().saturating_sub(count)..)
            .ok_or_else(|| failed(HostError("no losses".into())))?;
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        Ok(total / count as f64)
    }

    fn reduce_gradients(&mut self, loss_scale: f64) -> Result<(), ZeroError> {
        self.scalars.inv_scale = (1.0 / loss_scale) as f32;
        let program = self.program;
        self.run(&program.norm)?;
        let total = self.bufs.whole(Region::Step(CudaRegion::NormTotal));
        let flag = self.bufs.whole(Region::Step(CudaRegion::FoundInf));
        self.sum_of_squares = self.bufs.f64s(&total).map_err(failed)?[0];
        self.found_inf = self.bufs.i32s(&flag).map_err(failed)?[0] != 0;
        Ok(())
    }

    fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        Ok(self.found_inf || !self.sum_of_squares.is_finite())
    }

    fn discard(&mut self) {}

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

    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        self.adam_steps += 1;
        self.scalars.adam = Some(AdamScalars::new(adam, self.adam_steps, lr, self.multiplier));
        let program = self.program;
        let ran = self.run(&program.update);
        self.scalars.adam = None;
        ran?;
        self.run(&program.after_update)
    }

    fn export_owned(&mut self) -> Result<OwnedState, ZeroError> {
        let master = self.export_master().map_err(failed)?;
        let (plan, rank) = (self.plan, self.rank);
        let moment = |region| self.bufs.read(&self.owned_span(region, 0)).map_err(failed);
        let (exp_avg, exp_avg_sq) = (moment(Region::ExpAvg)?, moment(Region::ExpAvgSq)?);
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
        self.upload_owned(Region::Master, &master).map_err(failed)?;
        self.upload_owned(Region::ExpAvg, &exp_avg)
            .map_err(failed)?;
        self.upload_owned(Region::ExpAvgSq, &exp_avg_sq)
            .map_err(failed)?;
        self.adam_steps = state.adam_step;
        Ok(())
    }

    fn held_params(&mut self) -> Result<(ModelDtype, Vec<f32>), ZeroError> {
        let whole = self.held_whole().map_err(failed)?;
        Ok((
            self.plan.dtypes().model,
            held_from_whole(self.plan, self.rank, &whole),
        ))
    }
}
