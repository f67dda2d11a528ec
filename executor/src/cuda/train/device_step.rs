//! [`DeviceStep`]: the backend of the one training loop (`crate::train::step`) for one rank's
//! [`StepProgram`], written once for both targets that run it: a GPU's buffers
//! (`super::rank::Gpu`) and the host interpreter's (`super::host::HostTarget`). A target runs a
//! phase's ops and moves values in and out of its buffers ([`StepTarget`]); everything the
//! loop asks between the phases is here:
//!
//! 1. `begin_step`: the `start` phase (gradients zeroed);
//! 2. `micro_step`: the batch uploaded, `micro_step` (or, for the last micro-step of the
//!    optimizer step, `boundary_micro_step`, which reduces the gradients), the losses read
//!    back from the end of the statistics;
//! 3. `reduce_gradients`: the `norm` phase (gradients multiplied by `1/S`, their squares summed
//!    in f64 and inf/NaN flagged; at `W > 1` summed and maxed over the ranks by the program);
//! 4. `unscale_and_clip`: the clip coefficient from the norm, folded into AdamW's multiplier
//!    `clip * S / S'` (the CPU reproduces each stage's per-tensor rounding; the difference is
//!    rounding);
//! 5. `optimizer_step`: `update` (the fused AdamW) and `after_update` (the parameters gathered
//!    again at `W > 1`);
//!    Under optimizer offload `update` starts with the host optimizer ([`super::offload`]);
//!    under its speculative stepping the host steps right after the norm phase
//!    (`speculate_step`, before the norm and the overflow flag are read), and a step that is
//!    then clipped or skipped is undone from the saved side (and, when clipped, redone);
//! 6. checkpoints: the owned master and moments in the CPU rank's layout ([`DeviceOwned`]).

use dsplan_planner::config::ZeroStage;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::settings::OffloadStepping;
use dsplan_planner::schedule::clip::fp32_clip_coefficient;

use super::execute::RunScalars;
use super::owned::{DeviceOwned, held_from_whole};
use super::program::Op;
use super::region::{HostRegion, Region, RegionLengths, RegionSizes};
use super::step::OffloadPhases;
use super::step::StepProgram;
use crate::comm::watchdog::Watch;
use crate::comm::{Comm, StepPhase};
use crate::cuda::adamw::AdamScalars;
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::data::LabelledBatch;
use crate::metrics::PhaseTimes;
use crate::model::LossDivisor;
use crate::optim::AdamConfig;
use crate::train::StepBackend;
use crate::train::prepare::Prepared;
use crate::zero::{ClipRule, Dtype as ModelDtype, EnginePlan, OwnedState, Scales, ZeroError};

/// One micro-batch as the step's buffers take it: token ids, targets (`-1` ignored) and the
/// token buckets of the embedding's backward.
pub struct DeviceBatch {
    /// Token ids, one per position.
    pub inputs: Vec<u32>,
    /// Targets, one per position.
    pub targets: Vec<i32>,
    /// The positions of each distinct token.
    pub buckets: TokenBuckets,
}

/// Where a rank's step runs: a phase's ops, and values in and out of its buffers.
pub trait StepTarget {
    /// Runs `ops` with the step's `scalars`.
    fn run(&mut self, ops: &[Op], scalars: &RunScalars) -> Result<(), ZeroError>;

    /// Copies a micro-batch's token ids, targets and token buckets into the step's buffers.
    fn upload_batch(&mut self, batch: &DeviceBatch) -> Result<(), ZeroError>;

    /// The last `count` elements of the statistics: the micro-step's per-position losses.
    fn losses(&mut self, count: usize) -> Result<Vec<f32>, ZeroError>;

    /// The norm phase's sum of squares and whether it flagged inf/NaN.
    fn norm(&mut self) -> Result<(f64, bool), ZeroError>;

    /// `len` values of `region` (parameters, master or moments) from element `at`, as f32,
    /// once every queued op has finished.
    fn read(&mut self, region: Region, at: usize, len: usize) -> Result<Vec<f32>, ZeroError>;

    /// Writes `values` into `region` (parameters, master or moments) from element `at`,
    /// rounded to the region's element type.
    fn write(&mut self, region: Region, at: usize, values: &[f32]) -> Result<(), ZeroError>;

    /// Waits for every queued op.
    fn synchronize(&mut self) -> Result<(), ZeroError>;

    /// The training loop's host collectives.
    fn host_comm(&mut self) -> &mut dyn Comm;

    /// Watches a phase of the step (NCCL's watchdog; the host collectives fail on their own).
    fn watch(&mut self, phase: StepPhase) -> Watch {
        let _ = phase;
        Watch::none()
    }
}

/// What a [`DeviceStep`] is built from.
pub struct StepParts<'a, S> {
    /// The rank's step.
    pub program: &'a StepProgram,
    /// What the rank owns.
    pub owned: &'a DeviceOwned,
    /// The engine's plan (the checkpoint layout).
    pub plan: &'a EnginePlan,
    /// This rank.
    pub rank: usize,
    /// Micro-steps per optimizer step.
    pub grad_accum: usize,
    /// The layout's region lengths (the allocations hold at least one element each).
    pub lengths: RegionLengths,
    /// Where the step runs.
    pub target: S,
}

impl<'a, S> StepParts<'a, S> {
    /// Rank `rank`'s parts as `prepared` runs it: its `program` over `layout`, what it
    /// `owned`, on `target`.
    pub(crate) fn of_rank(
        (program, owned): (&'a StepProgram, &'a DeviceOwned),
        prepared: &'a Prepared<'_>,
        rank: usize,
        layout: &dyn RegionSizes,
        target: S,
    ) -> Self {
        Self {
            program,
            owned,
            plan: &prepared.engine_plan,
            rank,
            grad_accum: prepared.control.grad_accum,
            lengths: RegionLengths::of(layout),
            target,
        }
    }
}

/// Where a speculative host step (ZeRO-Offload's `super_offload`) stands.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Speculation {
    /// None is pending.
    Idle,
    /// The host stepped with these scalars before the norm and overflow flag were known.
    Stepped(AdamScalars),
    /// The step was skipped after the host stepped: the saved state is to be restored.
    Dropped,
}

/// The backend of the training loop: rank `rank`'s step on `target`.
pub struct DeviceStep<'a, S: StepTarget> {
    program: &'a StepProgram,
    owned: &'a DeviceOwned,
    plan: &'a EnginePlan,
    rank: usize,
    lengths: RegionLengths,
    target: S,
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
    /// The speculative host step pending (offload only).
    speculation: Speculation,
    /// Speculative host steps undone (clipped or skipped after they ran).
    rollbacks: u64,
}

impl<'a, S: StepTarget> DeviceStep<'a, S> {
    /// The backend of `parts`.
    pub fn new(parts: StepParts<'a, S>) -> Self {
        Self {
            program: parts.program,
            owned: parts.owned,
            plan: parts.plan,
            rank: parts.rank,
            lengths: parts.lengths,
            target: parts.target,
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
            speculation: Speculation::Idle,
            rollbacks: 0,
        }
    }

    /// Speculative host steps undone so far (a clipped or skipped step after the host had
    /// stepped it).
    pub fn rollbacks(&self) -> u64 {
        self.rollbacks
    }

    /// Where the step runs (its communication and traffic, its buffers in tests).
    pub fn target_mut(&mut self) -> &mut S {
        &mut self.target
    }

    /// Whether 16-bit parameters train through an fp32 master.
    fn trains_master(&self) -> bool {
        self.lengths.len(Region::Master) > 0
    }

    /// Where the parameters this rank steps live: the host's master under offload, the fp32
    /// master, or (f32 training) its owned range of the parameters.
    fn owned_params(&self) -> (Region, usize) {
        if self.lengths.offloads() {
            (Region::Host(HostRegion::Master), 0)
        } else if self.trains_master() {
            (Region::Master, 0)
        } else {
            (Region::Params, self.owned.params_at)
        }
    }

    /// Adam's moments: on the device, or on the host under offload.
    fn moments(&self) -> [Region; 2] {
        if self.lengths.offloads() {
            [
                Region::Host(HostRegion::ExpAvg),
                Region::Host(HostRegion::ExpAvgSq),
            ]
        } else {
            [Region::ExpAvg, Region::ExpAvgSq]
        }
    }

    /// A skipped speculative host step undone: the state restored from the saved side.
    fn settle(&mut self) -> Result<(), ZeroError> {
        if self.speculation != Speculation::Dropped {
            return Ok(());
        }
        self.speculation = Speculation::Idle;
        self.rollbacks += 1;
        let program = self.program;
        match &program.offload {
            Some(offload) => self.run(&offload.restore),
            None => Ok(()),
        }
    }

    /// The host optimizer's step under offload with the step's scalars (set): nothing when
    /// the speculative step ran with the same scalars; otherwise the state restored (a
    /// speculative step that was clipped) and the step run.
    fn host_step(&mut self, offload: &OffloadPhases) -> Result<(), ZeroError> {
        let scalars = self.scalars.adam;
        match std::mem::replace(&mut self.speculation, Speculation::Idle) {
            Speculation::Stepped(ran) if Some(ran) == scalars => return Ok(()),
            Speculation::Stepped(_) | Speculation::Dropped => {
                self.rollbacks += 1;
                self.run(&offload.restore)?;
            }
            Speculation::Idle => {}
        }
        self.run(&offload.host_step)
    }

    /// The rank's owned fp32 master in the device's layout of its owned range.
    pub fn owned_master(&mut self) -> Result<Vec<f32>, ZeroError> {
        self.settle()?;
        let (region, at) = self.owned_params();
        self.target.read(region, at, self.owned.len)
    }

    /// The rank's owned fp32 master in the CPU rank's checkpoint layout.
    pub fn export_master(&mut self) -> Result<Vec<f32>, ZeroError> {
        let owned = self.owned_master()?;
        Ok(self.owned.to_cpu(self.plan, self.rank, &owned))
    }

    /// The model-dtype parameters this rank holds, as the whole flat model (stages 0-2: the
    /// gathered parameters; stage 3: its shard, other ranks' elements zero).
    fn held_whole(&mut self) -> Result<Vec<f32>, ZeroError> {
        let n = self.owned.num_params;
        let sharded = self.plan.world() > 1 && self.plan.stage() == ZeroStage::Weights;
        if !sharded {
            return self.target.read(Region::Params, 0, n);
        }
        let values = self
            .target
            .read(Region::Params, self.owned.params_at, self.owned.len)?;
        let mut whole = vec![0.0f32; n];
        self.owned.into_whole(&values, &mut whole);
        Ok(whole)
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), ZeroError> {
        self.target.run(ops, &self.scalars)
    }
}

impl<S: StepTarget> StepBackend for DeviceStep<'_, S> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn comm(&mut self) -> &mut dyn Comm {
        self.target.host_comm()
    }

    fn begin_step(&mut self) -> Result<(), ZeroError> {
        self.settle()?;
        self.micro = 0;
        let program = self.program;
        self.run(&program.start)
    }

    /// On a GPU the micro-step's kernels are queued, not timed per phase: `times` is left as
    /// it is. The last micro-step of the optimizer step is the boundary one, which reduces
    /// the gradients.
    fn micro_step(
        &mut self,
        batch: &LabelledBatch,
        divisor: LossDivisor,
        grad_scale: f32,
        _times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError> {
        let (inputs, targets) = plain_rows(batch, divisor)?;
        let tokens = self.lengths.len(Region::Step(CudaRegion::Tokens));
        if inputs.len() != tokens {
            return Err(ZeroError::Device(format!(
                "a micro-batch of {} tokens for buffers of {tokens}",
                inputs.len()
            )));
        }
        let buckets = TokenBuckets::new(&inputs)
            .ok_or_else(|| ZeroError::Device("batch too large for i32 rows".into()))?;
        let count = targets.len().max(1);
        self.scalars.bucket_groups = buckets.len();
        self.target.upload_batch(&DeviceBatch {
            inputs,
            targets,
            buckets,
        })?;
        self.scalars.dloss = grad_scale / count as f32;
        let program = self.program;
        self.micro += 1;
        if self.micro >= self.grad_accum {
            self.run(&program.boundary_micro_step)?;
        } else {
            self.run(&program.micro_step)?;
        }
        let losses = self.target.losses(count)?;
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        Ok(total / count as f64)
    }

    fn reduce_gradients(&mut self, loss_scale: f64) -> Result<(), ZeroError> {
        self.scalars.inv_scale = (1.0 / loss_scale) as f32;
        let program = self.program;
        self.run(&program.norm)?;
        (self.sum_of_squares, self.found_inf) = self.target.norm()?;
        Ok(())
    }

    fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        Ok(self.found_inf || !self.sum_of_squares.is_finite())
    }

    /// The next step zeroes the gradients; a speculative host step is undone before the
    /// state is next read or stepped.
    fn discard(&mut self) {
        if let Speculation::Stepped(_) = self.speculation {
            self.speculation = Speculation::Dropped;
        }
    }

    /// Under speculative offload: the host steps now, as if the step is neither clipped nor
    /// skipped and the loss scale stays (multiplier 1), after saving the state it steps.
    fn speculate_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        let program = self.program;
        let Some(offload) = program
            .offload
            .as_ref()
            .filter(|o| o.stepping == OffloadStepping::Speculative)
        else {
            return Ok(());
        };
        self.settle()?;
        let scalars = AdamScalars::new(adam, self.adam_steps + 1, lr, 1.0);
        self.run(&offload.save)?;
        self.scalars.adam = Some(scalars);
        let ran = self.run(&offload.host_step);
        self.scalars.adam = None;
        ran?;
        self.speculation = Speculation::Stepped(scalars);
        Ok(())
    }

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

    /// The fused AdamW over the owned range, then (`W > 1`) the parameters gathered again.
    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        self.adam_steps += 1;
        self.scalars.adam = Some(AdamScalars::new(adam, self.adam_steps, lr, self.multiplier));
        let program = self.program;
        let ran = match &program.offload {
            Some(offload) => self
                .host_step(offload)
                .and_then(|()| self.run(&program.update)),
            None => self.run(&program.update),
        };
        self.scalars.adam = None;
        ran?;
        self.run(&program.after_update)?;
        self.target.synchronize()
    }

    fn export_owned(&mut self) -> Result<OwnedState, ZeroError> {
        let master = self.export_master()?;
        let (plan, rank, len) = (self.plan, self.rank, self.owned.len);
        let [avg, avg_sq] = self.moments();
        let exp_avg = self.target.read(avg, 0, len)?;
        let exp_avg_sq = self.target.read(avg_sq, 0, len)?;
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
        let (params, at) = self.owned_params();
        let [avg, avg_sq] = self.moments();
        self.speculation = Speculation::Idle;
        for (region, at, cpu) in [
            (params, at, &state.master),
            (avg, 0, &state.exp_avg),
            (avg_sq, 0, &state.exp_avg_sq),
        ] {
            let values = self.owned.from_cpu(plan, rank, cpu);
            self.target.write(region, at, &values)?;
        }
        self.adam_steps = state.adam_step;
        Ok(())
    }

    fn held_params(&mut self) -> Result<(ModelDtype, Vec<f32>), ZeroError> {
        let whole = self.held_whole()?;
        Ok((
            self.plan.dtypes().model,
            held_from_whole(self.plan, self.rank, &whole),
        ))
    }

    fn watch(&mut self, phase: StepPhase) -> Watch {
        self.target.watch(phase)
    }
}

/// The inputs and targets of a plain causal micro-batch: the device step has no attention
/// mask, no position ids, no ignored labels and divides by the batch's own token count, so a
/// batch that needs any of them (an SFT batch) is refused rather than trained wrongly.
fn plain_rows(
    batch: &LabelledBatch,
    divisor: LossDivisor,
) -> Result<(Vec<u32>, Vec<i32>), ZeroError> {
    let refuse = |what: &str| {
        Err(ZeroError::Device(format!(
            "dsplan-cuda trains plain token rows only: this micro-batch has {what}, which the \
             device step cannot honour yet; run SFT (padded, packed or label-masked) batches on \
             the CPU backend (--backend dsplan-cpu)"
        )))
    };
    if batch.attention_mask.is_some() {
        return refuse("an attention_mask (padding)");
    }
    if batch.position_ids.is_some() {
        return refuse("position_ids (packed documents)");
    }
    if divisor != LossDivisor::TargetsInBatch {
        return refuse("a loss divided by the step's label tokens (num_items_in_batch)");
    }
    let Some(targets) = batch
        .targets
        .iter()
        .map(|t| t.and_then(|t| i32::try_from(t).ok()))
        .collect::<Option<Vec<i32>>>()
    else {
        return refuse("positions without a label (-100)");
    };
    Ok((batch.input_ids.clone(), targets))
}
