//! [`ZeroRank`]: one data-parallel rank's parameters, gradients, master weights and optimizer
//! state, allocated as the plan ([`EnginePlan`]) sizes them, and the [`ParamSource`] the model
//! reads them through.
//!
//! What each stage allocates on a rank (`Ψ` parameters, `Ψ'` the plan's padded flat buffer,
//! `P` its partition per rank, `H` the rank's stage 3 shard, `Σ⌈n_t / W⌉`):
//!
//! | stage | params (model dtype) | grads (accumulation dtype) | fp32 master | Adam m, v |
//! |---|---|---|---|---|
//! | 0 | `Ψ` | `Ψ` | `Ψ` (none in fp32: the params are the master) | `2Ψ` |
//! | 1 | `Ψ'` | `Ψ'`, reduced at the boundary | `P` | `2P` |
//! | 2 | `Ψ'` | `P`, reduced bucket by bucket every micro-step | `P` | `2P` |
//! | 3 | `H` + the persistent tensors | `H` | `H` | `2H` |
//!
//! plus transient buffers: each unit's `f32` gradients during backward (as autograd's `.grad`),
//! `f32` copies of 16-bit units while the model computes with them, stage 3's gathered units,
//! the gradient bucket, staging for collectives, and the `f32` copy of the owned gradients the
//! optimizer steps with whenever there is a separate master (DeepSpeed's fp32 gradient
//! partition). The stage-specific operations live in `stage0.rs` .. `stage3.rs`; this file
//! holds the state, and the optimizer step they share.
//!
//! With stage 3 offload to NVMe (see [`super::swap`]) the fp32 master and Adam's moments live in
//! files instead ([`OptimizerSwap`]: only its swap buffers are memory, counted as optimizer
//! state), and so do the parameter slices the plan puts on NVMe ([`ParamSwap`]; `params` then
//! holds the other slices back to back, at [`ZeroRank::param_offset`]). Whatever the storage,
//! [`ZeroRank::owned_master`], [`ZeroRank::owned_moments`], [`ZeroRank::write_owned_master`] and
//! [`ZeroRank::write_owned_moments`] read and write the owned state as whole `f32` slices.
//!
//! [`ParamSource`]: crate::model::ParamSource

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use dsplan_planner::config::ZeroStage;

use super::ZeroError;
use super::partition::EnginePlan;
use super::precision::{Dtype, DtypeVec};
use super::swap::{NvmeUsage, OptimizerSwap, ParamSwap, SwapTraffic};
use crate::comm::{Comm, ReduceOp};
use crate::metrics::{Category, MemoryLedger, Reservation, Tracked};

use crate::optim::{AdamConfig, AdamState, adam_step};

/// How a rank stores and reduces: the plan's stage and dtypes, and the config's gradient
/// scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankOptions {
    /// The ZeRO stage.
    pub stage: ZeroStage,
    /// Parameters and gradients as the model produces them.
    pub model_dtype: Dtype,
    /// Gradient accumulation across micro-steps (`data_types.grad_accum_dtype`).
    pub accum_dtype: Dtype,
    /// Reductions (`communication_data_type`).
    pub comm_dtype: Dtype,
    /// Where the division by the world size happens.
    pub scaling: GradScaling,
}

impl RankOptions {
    /// The options of a rank running `plan`, averaging gradients as `scaling` says.
    pub fn from_plan(plan: &EnginePlan, scaling: GradScaling) -> Self {
        let dtypes = plan.dtypes();
        Self {
            stage: plan.stage(),
            model_dtype: dtypes.model,
            accum_dtype: dtypes.accum,
            comm_dtype: dtypes.comm,
            scaling,
        }
    }
}

/// How the gradient average is formed (DeepSpeed §4.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradScaling {
    /// Divide by the world size, then sum (ZeRO's buckets; `prescale_gradients`).
    PreDivide,
    /// Multiply by `1/factor`, sum, multiply by `factor/W` (the engine's default all-reduce;
    /// `factor` is `gradient_predivide_factor`, usually 1).
    PostMultiply {
        /// `gradient_predivide_factor`.
        factor: f32,
    },
}

/// One rank's training state: what its ZeRO stage lets it hold (see [`crate::zero`]).
pub struct ZeroRank {
    pub(super) options: RankOptions,
    pub(super) plan: Arc<EnginePlan>,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) comm: Box<dyn Comm>,
    pub(super) ledger: Rc<MemoryLedger>,
    /// Stage 0: `Ψ`; stage 1/2: `Ψ_padded`; stage 3: the shard (without the slices on NVMe).
    pub(super) params: Tracked<DtypeVec>,
    /// Stage 3: where each tensor's slice sits in `params` (its shard offset unless parameters
    /// are offloaded to NVMe; unused for the slices that live there).
    pub(super) param_offset: Vec<usize>,
    /// Stage 3 parameter offload to NVMe.
    pub(super) param_swap: Option<ParamSwap>,
    /// Stage 3 optimizer offload to NVMe: the master and Adam's moments (then `master` is
    /// `None` and `adam` empty).
    pub(super) optimizer_swap: Option<OptimizerSwap>,
    /// Stage 3: the persistent tensors' full values, back to back.
    pub(super) persistent: Option<Tracked<DtypeVec>>,
    /// Stage 3: where each persistent tensor starts in `persistent`.
    pub(super) persistent_offset: Vec<Option<usize>>,
    /// Per unit: its `f32` parameters while fetched (16-bit storage, or stage 3).
    pub(super) live: Vec<Option<Tracked<Box<[f32]>>>>,
    /// Per unit: its gradients during backward.
    pub(super) unit_grads: Vec<Option<Tracked<Box<[f32]>>>>,
    /// Stage 0: `Ψ`; stage 1: `Ψ_padded`; stage 2: the partition; stage 3: the shard.
    pub(super) grads: Tracked<DtypeVec>,
    /// Stage 2/3: the gradient bucket (stage 3 in its per-rank interleaved layout).
    pub(super) bucket: Option<Tracked<Box<[f32]>>>,
    /// Per bucket: how many of its tensors' gradients arrived in this backward.
    pub(super) arrived: Vec<usize>,
    /// Stage 3: the reduce-scatter output.
    pub(super) bucket_out: Option<Tracked<Box<[f32]>>>,
    /// The `f32` copy of the owned gradients the optimizer steps with (when there is a master).
    pub(super) staged: Option<Tracked<Box<[f32]>>>,
    /// The fp32 master of the owned parameters (`None`: the params are `f32` and owned whole).
    pub(super) master: Option<Tracked<Box<[f32]>>>,
    pub(super) adam: AdamState,
    _adam_bytes: Reservation,
    /// The owned region's pieces of real tensors, in owned-buffer coordinates (for norms).
    pub(super) norm_pieces: Vec<Range<usize>>,
}

impl std::fmt::Debug for ZeroRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroRank")
            .field("stage", &self.options.stage)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .finish_non_exhaustive()
    }
}

impl ZeroRank {
    /// The state of rank `comm.rank()`, following `plan` (shared by the ranks), for a model
    /// whose initial parameters are `initial` (the full flat buffer every rank can read, like
    /// a checkpoint on disk; each rank copies only what the plan gives it). With NVMe offload
    /// it creates the rank's swap files and writes the initial state into them: `Err` when that
    /// fails (a missing or read-only `nvme_path`, a full drive, buffers too small).
    pub fn new(
        comm: Box<dyn Comm>,
        plan: Arc<EnginePlan>,
        options: RankOptions,
        initial: &[f32],
        ledger: &Rc<MemoryLedger>,
    ) -> Result<Self, ZeroError> {
        let (rank, world) = (comm.rank(), comm.world_size());
        let flat = *plan.flat();
        let owned = plan.owned(rank);
        let tracked = |category, values: DtypeVec| Tracked::new(ledger, category, values);
        let (params, grads_len) = match options.stage {
            ZeroStage::Disabled | ZeroStage::OptimizerStates | ZeroStage::Gradients => {
                let mut params = DtypeVec::zeros(options.model_dtype, flat.padded);
                params.write(0, initial);
                let grads_len = if options.stage == ZeroStage::Gradients {
                    flat.partition
                } else {
                    flat.padded
                };
                (params, grads_len)
            }
            ZeroStage::Weights => {
                let shard = super::stage3::cut_shard(&plan, rank, options.model_dtype, initial);
                let len = shard.len();
                (shard, len)
            }
        };
        let (persistent, persistent_offset) = if options.stage == ZeroStage::Weights {
            let (store, offsets) =
                super::stage3::persistent_store(&plan, options.model_dtype, initial);
            (Some(tracked(Category::Params, store)), offsets)
        } else {
            (None, vec![None; plan.tensors().len()])
        };
        let master_needed =
            !(options.stage == ZeroStage::Disabled && options.model_dtype == Dtype::F32);
        let owned_len = owned.len();
        let nvme = plan.nvme();
        let (master, optimizer_swap) = match (&nvme.optimizer, master_needed) {
            (Some(layout), _) => {
                let mut values = vec![0.0f32; owned_len];
                params.read(owned.start, &mut values);
                let swap = OptimizerSwap::create(layout, rank, &values, ledger)?;
                (None, Some(swap))
            }
            (None, true) => {
                let mut master = vec![0.0f32; owned_len].into_boxed_slice();
                params.read(owned.start, &mut master);
                (Some(Tracked::new(ledger, Category::Master, master)), None)
            }
            (None, false) => (None, None),
        };
        let shards = plan.shards();
        let mut param_offset: Vec<usize> = (0..plan.tensors().len())
            .map(|t| {
                if shards.is_empty() {
                    0
                } else {
                    shards.offset(t)
                }
            })
            .collect();
        let (params, param_swap) = match &nvme.params {
            Some(layout) if options.stage == ZeroStage::Weights => {
                let swap = ParamSwap::create(layout, rank, shards, &params, ledger)?;
                let kept: usize = (0..param_offset.len())
                    .filter(|&t| !swap.is_resident(t))
                    .map(|t| shards.chunk(t))
                    .sum();
                let mut compact = DtypeVec::zeros(options.model_dtype, kept);
                let mut at = 0;
                let mut values = Vec::new();
                for (t, offset) in param_offset.iter_mut().enumerate() {
                    if swap.is_resident(t) {
                        continue;
                    }
                    values.resize(shards.chunk(t), 0.0);
                    params.read(shards.offset(t), &mut values);
                    compact.write(at, &values);
                    *offset = at;
                    at += values.len();
                }
                (compact, Some(swap))
            }
            _ => (params, None),
        };
        let params = tracked(Category::Params, params);
        let adam_len = if optimizer_swap.is_some() {
            0
        } else {
            owned_len
        };
        let norm_pieces = norm_pieces(&plan, options.stage, rank);
        let (bucket, bucket_out) = match options.stage {
            ZeroStage::Gradients => (
                Some(Tracked::zeros(
                    ledger,
                    Category::Buckets,
                    plan.max_bucket_numel(),
                )),
                None,
            ),
            ZeroStage::Weights => (
                Some(Tracked::zeros(
                    ledger,
                    Category::Buckets,
                    world * plan.max_bucket_shard_numel(),
                )),
                Some(Tracked::zeros(
                    ledger,
                    Category::Buckets,
                    plan.max_bucket_shard_numel(),
                )),
            ),
            _ => (None, None),
        };
        let units = plan.units().len();
        Ok(Self {
            grads: tracked(
                Category::Grads,
                DtypeVec::zeros(options.accum_dtype, grads_len),
            ),
            options,
            rank,
            world,
            comm,
            ledger: Rc::clone(ledger),
            params,
            param_offset,
            param_swap,
            optimizer_swap,
            persistent,
            persistent_offset,
            live: (0..units).map(|_| None).collect(),
            unit_grads: (0..units).map(|_| None).collect(),
            bucket,
            arrived: vec![0; plan.buckets().len()],
            bucket_out,
            staged: None,
            master,
            adam: AdamState::new(adam_len),
            _adam_bytes: Reservation::new(
                ledger,
                Category::Optimizer,
                (2 * adam_len * std::mem::size_of::<f32>()) as u64,
            ),
            norm_pieces,
            plan,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The group, for the engine's own collectives (loss, overflow flag, norms).
    pub fn comm(&mut self) -> &mut dyn Comm {
        self.comm.as_mut()
    }

    /// What this rank has sent so far.
    pub fn traffic(&self) -> crate::comm::CommTraffic {
        self.comm.traffic().clone()
    }

    /// The plan this rank follows.
    pub fn plan(&self) -> &EnginePlan {
        &self.plan
    }

    /// The options it was built with.
    pub fn options(&self) -> &RankOptions {
        &self.options
    }

    /// The optimizer's step counter.
    pub fn optimizer_steps(&self) -> u64 {
        self.adam.step
    }

    /// The owned fp32 master weights held in memory (stage 0 fp32: all parameters); empty when
    /// they live on NVMe ([`ZeroRank::owned_master`] reads them wherever they are).
    pub fn master(&self) -> &[f32] {
        match (&self.master, &self.optimizer_swap) {
            (Some(master), _) => master,
            (None, Some(_)) => &[],
            (None, None) => self.params.as_f32().unwrap_or(&[]),
        }
    }

    /// Elements of the owned region (the master's and each Adam moment's length).
    pub fn owned_len(&self) -> usize {
        self.plan.owned(self.rank).len()
    }

    /// The owned fp32 master weights, wherever they live (memory or NVMe), as one slice.
    pub fn owned_master(&self) -> Result<Vec<f32>, ZeroError> {
        match &self.optimizer_swap {
            Some(swap) => Ok(swap.read_master(self.owned_len())?),
            None => Ok(self.master().to_vec()),
        }
    }

    /// Adam's moments of the owned region (`exp_avg`, `exp_avg_sq`), wherever they live.
    pub fn owned_moments(&self) -> Result<(Vec<f32>, Vec<f32>), ZeroError> {
        match &self.optimizer_swap {
            Some(swap) => Ok(swap.read_moments(self.owned_len())?),
            None => Ok((self.adam.exp_avg.clone(), self.adam.exp_avg_sq.clone())),
        }
    }

    /// Replaces the owned fp32 master weights (the model-dtype parameters are not refreshed).
    /// `values` must hold [`ZeroRank::owned_len`] elements.
    pub fn write_owned_master(&mut self, values: &[f32]) -> Result<(), ZeroError> {
        check_len("master", values.len(), self.owned_len())?;
        if let Some(swap) = &self.optimizer_swap {
            return Ok(swap.write_master(values)?);
        }
        match &mut self.master {
            Some(master) => master.copy_from_slice(values),
            None => {
                if let Some(params) = self.params.as_f32_mut() {
                    params[..values.len()].copy_from_slice(values);
                }
            }
        }
        Ok(())
    }

    /// Replaces Adam's moments of the owned region and its step counter.
    pub fn write_owned_moments(
        &mut self,
        exp_avg: &[f32],
        exp_avg_sq: &[f32],
        step: u64,
    ) -> Result<(), ZeroError> {
        check_len("exp_avg", exp_avg.len(), self.owned_len())?;
        check_len("exp_avg_sq", exp_avg_sq.len(), self.owned_len())?;
        match &self.optimizer_swap {
            Some(swap) => swap.write_moments(exp_avg, exp_avg_sq)?,
            None => {
                self.adam.exp_avg.copy_from_slice(exp_avg);
                self.adam.exp_avg_sq.copy_from_slice(exp_avg_sq);
            }
        }
        self.adam.step = step;
        Ok(())
    }

    /// Bytes moved to and from the NVMe swap files so far (zero without NVMe offload).
    pub fn swap_traffic(&self) -> SwapTraffic {
        let optimizer = self
            .optimizer_swap
            .as_ref()
            .map_or(SwapTraffic::default(), OptimizerSwap::traffic);
        let params = self
            .param_swap
            .as_ref()
            .map_or(SwapTraffic::default(), ParamSwap::traffic);
        optimizer.plus(params)
    }

    /// This rank's use of NVMe, measured now (`None` without NVMe offload): the swap files'
    /// sizes on disk and the bytes moved.
    pub fn nvme_usage(&self) -> Result<Option<NvmeUsage>, ZeroError> {
        if self.optimizer_swap.is_none() && self.param_swap.is_none() {
            return Ok(None);
        }
        let mut usage = NvmeUsage::default();
        let mut init = SwapTraffic::default();
        if let Some(swap) = &self.optimizer_swap {
            usage.directories.push(swap.dir().to_path_buf());
            usage.optimizer_bytes = swap.resident_bytes()?;
            init = init.plus(swap.init_traffic());
        }
        if let Some(swap) = &self.param_swap {
            usage.directories.push(swap.dir().to_path_buf());
            usage.param_bytes = swap.resident_bytes()?;
            init = init.plus(swap.init_traffic());
        }
        usage.resident_bytes = usage.optimizer_bytes + usage.param_bytes;
        usage.init = init;
        usage.steps = self.swap_traffic().since(init);
        Ok(Some(usage))
    }

    /// Whether the optimizer steps a separate fp32 master (in memory or on NVMe).
    fn has_master(&self) -> bool {
        self.master.is_some() || self.optimizer_swap.is_some()
    }

    /// Stage 3: writes new values of the shard's elements `start..start + values.len()` (whole
    /// tensor slices) to where each slice lives: `params`, or the NVMe file.
    pub(super) fn refresh_shard(&mut self, start: usize, values: &[f32]) -> Result<(), ZeroError> {
        let end = start + values.len();
        let shards = self.plan.shards();
        for t in 0..self.plan.tensors().len() {
            let (offset, chunk) = (shards.offset(t), shards.chunk(t));
            if offset < start || offset + chunk > end || chunk == 0 {
                continue;
            }
            let slice = &values[offset - start..offset - start + chunk];
            match &mut self.param_swap {
                Some(swap) if swap.is_resident(t) => swap.write(t, slice)?,
                _ => self.params.write(self.param_offset[t], slice),
            }
        }
        Ok(())
    }

    /// Starts an optimizer step: the accumulated gradients go back to zero.
    pub fn begin_step(&mut self) {
        self.grads.fill_zero();
    }

    /// After the last micro-step: stages 0 and 1 reduce the accumulated gradients now (stages
    /// 2 and 3 reduced them bucket by bucket during backward).
    pub fn reduce_at_boundary(&mut self) -> Result<(), ZeroError> {
        match self.options.stage {
            ZeroStage::Disabled | ZeroStage::OptimizerStates => self.reduce_accumulated(),
            ZeroStage::Gradients | ZeroStage::Weights => Ok(()),
        }
    }

    /// Where the owned gradients sit in `grads`.
    fn owned_grad_range(&self) -> Range<usize> {
        match self.options.stage {
            ZeroStage::OptimizerStates => self.plan.owned(self.rank),
            _ => 0..self.grads.len(),
        }
    }

    /// Makes the owned gradients available as `f32` ([`ZeroRank::owned_grads`]): copied (and
    /// widened) into the fp32 gradient partition the optimizer steps with whenever there is a
    /// separate master, as DeepSpeed builds it (and the plan lists it) before its step; in
    /// place for fp32 stage 0, whose parameters are the master.
    pub fn stage_owned_grads(&mut self) {
        if self.has_master() {
            let range = self.owned_grad_range();
            let mut staged = Tracked::zeros(&self.ledger, Category::StepScratch, range.len());
            self.grads.read(range.start, &mut staged);
            self.staged = Some(staged);
        }
    }

    /// The owned gradients as `f32` (after [`ZeroRank::stage_owned_grads`]).
    pub fn owned_grads(&self) -> &[f32] {
        match &self.staged {
            Some(staged) => staged,
            None => {
                let range = self.owned_grad_range();
                self.grads.as_f32().map_or(&[][..], |g| &g[range])
            }
        }
    }

    /// The owned gradients as `f32`, mutably (after [`ZeroRank::stage_owned_grads`]).
    pub fn owned_grads_mut(&mut self) -> &mut [f32] {
        let range = self.owned_grad_range();
        match &mut self.staged {
            Some(staged) => staged,
            None => self
                .grads
                .as_f32_mut()
                .map_or(&mut [][..], |g| &mut g[range]),
        }
    }

    /// The pieces of real tensors in the owned gradients (owned coordinates).
    pub fn norm_pieces(&self) -> &[Range<usize>] {
        &self.norm_pieces
    }

    /// Whether any owned gradient is inf or NaN, on any rank (all-reduced MAX).
    pub fn any_overflow(&mut self) -> Result<bool, ZeroError> {
        let local = self.owned_grads().iter().any(|g| !g.is_finite());
        let flag = self
            .comm
            .all_reduce_scalar(if local { 1.0 } else { 0.0 }, ReduceOp::Max)?;
        Ok(flag != 0.0)
    }

    /// Drops the staged gradients of a skipped step.
    pub fn discard_step(&mut self) {
        self.staged = None;
    }

    /// The optimizer step on the owned region with the (already unscaled and clipped) owned
    /// gradients, then the parameters each stage keeps are brought up to date: stage 0 copies
    /// the master into its parameters, stages 1 and 2 write their partition and all-gather the
    /// others', stage 3 writes its shard and re-gathers the persistent tensors.
    pub fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        if self.optimizer_swap.is_some() {
            return self.swapped_optimizer_step(adam, lr);
        }
        let grad_range = self.owned_grad_range();
        let Self {
            params,
            grads,
            staged,
            master,
            adam: state,
            ..
        } = self;
        let grads: &[f32] = match staged {
            Some(staged) => staged,
            None => grads.as_f32().map_or(&[][..], |g| &g[grad_range]),
        };
        let master: &mut [f32] = match master {
            Some(master) => master,
            None => params.as_f32_mut().unwrap_or(&mut []),
        };
        let step = state.step + 1;
        adam_step(
            master,
            grads,
            &mut state.exp_avg,
            &mut state.exp_avg_sq,
            step,
            lr,
            adam,
        )?;
        state.step = step;
        self.staged = None;
        match self.options.stage {
            ZeroStage::Disabled => {
                if let Some(master) = &self.master {
                    self.params.write(0, master);
                }
                Ok(())
            }
            ZeroStage::OptimizerStates | ZeroStage::Gradients => {
                let start = self.plan.owned(self.rank).start;
                if let Some(master) = &self.master {
                    self.params.write(start, master);
                }
                self.gather_flat_partitions()
            }
            ZeroStage::Weights => {
                if let Some(master) = self.master.take() {
                    let refreshed = self.refresh_shard(0, &master);
                    self.master = Some(master);
                    refreshed?;
                }
                self.regather_persistent()
            }
        }
    }

    /// Stage 3 with the optimizer on NVMe: sub-group by sub-group, swap in, step, swap out,
    /// refresh the group's parameters; then re-gather the persistent tensors.
    fn swapped_optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        let staged = match self.staged.take() {
            Some(staged) => staged,
            None => {
                let range = self.owned_grad_range();
                let mut staged = Tracked::zeros(&self.ledger, Category::StepScratch, range.len());
                self.grads.read(range.start, &mut staged);
                staged
            }
        };
        let grads: &[f32] = &staged;
        let step = self.adam.step + 1;
        let Some(mut swap) = self.optimizer_swap.take() else {
            return Ok(());
        };
        let stepped = swap.step(grads, step, lr, adam, |start, values| {
            self.refresh_shard(start, values)
        });
        self.optimizer_swap = Some(swap);
        drop(staged);
        stepped?;
        self.adam.step = step;
        self.regather_persistent()
    }
}

fn check_len(what: &'static str, found: usize, expected: usize) -> Result<(), ZeroError> {
    if found == expected {
        Ok(())
    } else {
        Err(ZeroError::StateLength {
            what,
            found,
            expected,
        })
    }
}

/// The owned region's pieces of real tensors, in owned-buffer coordinates.
fn norm_pieces(plan: &EnginePlan, stage: ZeroStage, rank: usize) -> Vec<Range<usize>> {
    match stage {
        ZeroStage::Disabled => plan.tensors().iter().map(|t| t.offset..t.end()).collect(),
        ZeroStage::OptimizerStates | ZeroStage::Gradients => {
            let start = plan.owned(rank).start;
            plan.flat_pieces(rank)
                .into_iter()
                .map(|(_, r)| r.start - start..r.end - start)
                .collect()
        }
        ZeroStage::Weights => (0..plan.tensors().len())
            .map(|t| {
                let offset = plan.shards().offset(t);
                offset..offset + plan.shards().piece(t, rank).len()
            })
            .filter(|r| !r.is_empty())
            .collect(),
    }
}
