//! [`ZeroRank`]: one data-parallel rank's training state, allocated as the plan
//! ([`EnginePlan`]) sizes it: its stage family's state ([`RankState`]), the accumulated
//! gradients, the per-unit buffers the model reads and writes through [`ParamSource`]
//! (`source.rs`), and the optimizer (`optimizer.rs`). The run-long buffers below are sized by
//! the plan's buffer list ([`ListedBuffers`]), each checked against the stage's geometry.
//!
//! What each stage allocates on a rank (`Ψ` parameters, `Ψ'` the plan's padded flat buffer,
//! `P` its partition per rank, `H` the rank's stage 3 shard, `Σ⌈n_t / W⌉`):
//!
//! | stage | state | params (model dtype) | grads (accumulation dtype) | fp32 master | Adam m, v |
//! |---|---|---|---|---|---|
//! | 0 | `Stage0` | `Ψ` | `Ψ` | `Ψ` (none in fp32: the params are the master) | `2Ψ` |
//! | 1 | `Stage12` | `Ψ'` | `Ψ'`, reduced at the boundary | `P` | `2P` |
//! | 2 | `Stage12` | `Ψ'` | `P`, reduced bucket by bucket every micro-step | `P` | `2P` |
//! | 3 | `Stage3` | `H` + the persistent tensors | `H` | `H` | `2H` |
//!
//! plus transient buffers: each unit's `f32` gradients during backward (as autograd's `.grad`),
//! `f32` copies of 16-bit units while the model computes with them, stage 3's gathered units,
//! the gradient bucket, staging for collectives, and the `f32` copy of the owned gradients the
//! optimizer steps with whenever there is a separate master (DeepSpeed's fp32 gradient
//! partition).
//!
//! With stage 3 offload to NVMe (see [`super::swap`]) the fp32 master and Adam's moments live in
//! files instead (only their swap buffers are memory, counted as optimizer state), and so do
//! the parameter slices the plan puts on NVMe. Whatever the storage,
//! [`ZeroRank::owned_master`], [`ZeroRank::owned_moments`], [`ZeroRank::write_owned_master`] and
//! [`ZeroRank::write_owned_moments`] read and write the owned state as whole `f32` slices.
//!
//! [`ParamSource`]: crate::model::ParamSource

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use dsplan_planner::config::ZeroStage;

use dsplan_planner::plan::BufferKind;

use super::ZeroError;
use super::listed::ListedBuffers;
use super::optimizer::{Master, Optimizer};
use super::options::RankOptions;
use super::partition::EnginePlan;
use super::precision::DtypeVec;
use super::stage0::Stage0;
use super::stage3::Stage3;
use super::stage12::Stage12;
use super::state::{Buffer, Group, Stage};
use super::swap::{NvmeUsage, SwapTraffic};
use crate::comm::{Comm, ReduceOp};
use crate::metrics::{Category, MemoryLedger, Tracked};
use crate::optim::{AdamConfig, adam_step};

/// A rank's stage family and the state it owns.
pub(super) enum RankState {
    /// Stage 0: everything replicated.
    Replicated(Stage0),
    /// Stages 1 and 2: the flat parameters, the optimizer partitioned.
    Flat(Stage12),
    /// Stage 3: parameters, gradients and optimizer sharded per tensor.
    Sharded(Box<Stage3>),
}

impl RankState {
    /// The state of the plan's stage family for `group`'s rank (the one place the stage is
    /// read), and its optimizer.
    fn new(
        group: &Group,
        initial: &[f32],
        listed: &ListedBuffers,
    ) -> Result<(Self, Optimizer), ZeroError> {
        Ok(match group.plan.stage() {
            ZeroStage::Disabled => {
                let (state, optimizer) = Stage0::new(group, initial, listed)?;
                (RankState::Replicated(state), optimizer)
            }
            stage @ (ZeroStage::OptimizerStates | ZeroStage::Gradients) => {
                let (state, optimizer) = Stage12::new(group, initial, listed, stage)?;
                (RankState::Flat(state), optimizer)
            }
            ZeroStage::Weights => {
                let (state, optimizer) = Stage3::new(group, initial, listed)?;
                (RankState::Sharded(Box::new(state)), optimizer)
            }
        })
    }

    /// The family's operations.
    pub(super) fn get(&self) -> &dyn Stage {
        match self {
            RankState::Replicated(state) => state,
            RankState::Flat(state) => state,
            RankState::Sharded(state) => state.as_ref(),
        }
    }

    /// The family's operations, mutably.
    pub(super) fn get_mut(&mut self) -> &mut dyn Stage {
        match self {
            RankState::Replicated(state) => state,
            RankState::Flat(state) => state,
            RankState::Sharded(state) => state.as_mut(),
        }
    }
}

/// One rank's training state: what its ZeRO stage lets it hold (see [`crate::zero`]).
pub struct ZeroRank {
    pub(super) group: Group,
    pub(super) state: RankState,
    /// The accumulated gradients (stage 0/1: `Ψ'`; stage 2: the partition; stage 3: the shard).
    pub(super) grads: Tracked<DtypeVec>,
    /// Where the owned gradients sit in `grads`.
    owned_grads: Range<usize>,
    /// Per unit: its `f32` parameters while fetched (16-bit storage, or stage 3).
    pub(super) live: Vec<Option<Buffer>>,
    /// Per unit: its gradients during backward.
    pub(super) unit_grads: Vec<Option<Buffer>>,
    optimizer: Optimizer,
    /// The owned region's pieces of real tensors, in owned-buffer coordinates (for norms).
    norm_pieces: Vec<Range<usize>>,
}

impl std::fmt::Debug for ZeroRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZeroRank")
            .field("stage", &self.group.options.stage)
            .field("rank", &self.group.rank)
            .field("world", &self.group.world)
            .finish_non_exhaustive()
    }
}

impl ZeroRank {
    /// The state of rank `comm.rank()`, following `plan` (shared by the ranks), for a model
    /// whose initial parameters are `initial` (the full flat buffer every rank can read, like
    /// a checkpoint on disk; each rank copies only what the plan gives it). Its run-long
    /// buffers are those `listed` (the same plan's); `Err(ZeroError::PlanMismatch)` when the
    /// list does not size what the stage holds. With NVMe offload it creates the rank's swap
    /// files and writes the initial state into them: `Err` when that fails (a missing or
    /// read-only `nvme_path`, a full drive, buffers too small).
    pub fn new(
        comm: Box<dyn Comm>,
        plan: Arc<EnginePlan>,
        options: RankOptions,
        initial: &[f32],
        listed: &ListedBuffers,
        ledger: &Rc<MemoryLedger>,
    ) -> Result<Self, ZeroError> {
        let group = Group {
            rank: comm.rank(),
            world: comm.world_size(),
            comm,
            plan,
            options,
            ledger: Rc::clone(ledger),
        };
        let (state, optimizer) = RankState::new(&group, initial, listed)?;
        let stage = state.get();
        let plan = &group.plan;
        let grads_len = listed.take(
            BufferKind::Gradients,
            stage.grads_len(plan),
            "the accumulated gradients",
        )?;
        let grads = Tracked::new(
            ledger,
            Category::Grads,
            DtypeVec::zeros(options.accum_dtype, grads_len),
        );
        let owned_grads = stage.owned_grads(plan, group.rank, grads.len());
        let norm_pieces = stage.norm_pieces(plan, group.rank);
        let units = plan.units().len();
        Ok(Self {
            grads,
            owned_grads,
            live: (0..units).map(|_| None).collect(),
            unit_grads: (0..units).map(|_| None).collect(),
            optimizer,
            norm_pieces,
            state,
            group,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.group.world
    }

    /// The group, for the engine's own collectives (loss, overflow flag, norms).
    pub fn comm(&mut self) -> &mut dyn Comm {
        self.group.comm.as_mut()
    }

    /// What this rank has sent so far.
    pub fn traffic(&self) -> crate::comm::CommTraffic {
        self.group.comm.traffic().clone()
    }

    /// The plan this rank follows.
    pub fn plan(&self) -> &EnginePlan {
        &self.group.plan
    }

    /// The options it was built with.
    pub fn options(&self) -> &RankOptions {
        &self.group.options
    }

    /// The optimizer's step counter.
    pub fn optimizer_steps(&self) -> u64 {
        self.optimizer.adam.step
    }

    /// The owned fp32 master weights held in memory (stage 0 fp32: all parameters); empty when
    /// they live on NVMe ([`ZeroRank::owned_master`] reads them wherever they are).
    pub fn master(&self) -> &[f32] {
        match &self.optimizer.master {
            Master::Memory(master) => master,
            Master::Nvme(_) => &[],
            Master::Params => self.state.get().params().as_f32().unwrap_or(&[]),
        }
    }

    /// Elements of the owned region (the master's and each Adam moment's length).
    pub fn owned_len(&self) -> usize {
        self.group.plan.owned(self.group.rank).len()
    }

    /// The owned fp32 master weights, wherever they live (memory or NVMe), as one slice.
    pub fn owned_master(&self) -> Result<Vec<f32>, ZeroError> {
        match self.optimizer.swap() {
            Some(swap) => Ok(swap.read_master(self.owned_len())?),
            None => Ok(self.master().to_vec()),
        }
    }

    /// Adam's moments of the owned region (`exp_avg`, `exp_avg_sq`), wherever they live.
    pub fn owned_moments(&self) -> Result<(Vec<f32>, Vec<f32>), ZeroError> {
        let adam = &self.optimizer.adam;
        match self.optimizer.swap() {
            Some(swap) => Ok(swap.read_moments(self.owned_len())?),
            None => Ok((adam.exp_avg.clone(), adam.exp_avg_sq.clone())),
        }
    }

    /// Replaces the owned fp32 master weights (the model-dtype parameters are not refreshed).
    /// `values` must hold [`ZeroRank::owned_len`] elements.
    pub fn write_owned_master(&mut self, values: &[f32]) -> Result<(), ZeroError> {
        check_len("master", values.len(), self.owned_len())?;
        match &mut self.optimizer.master {
            Master::Nvme(swap) => swap.write_master(values)?,
            Master::Memory(master) => master.copy_from_slice(values),
            Master::Params => {
                if let Some(params) = self.state.get_mut().params_mut().as_f32_mut() {
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
        let Optimizer { master, adam, .. } = &mut self.optimizer;
        match master {
            Master::Nvme(swap) => swap.write_moments(exp_avg, exp_avg_sq)?,
            Master::Params | Master::Memory(_) => {
                adam.exp_avg.copy_from_slice(exp_avg);
                adam.exp_avg_sq.copy_from_slice(exp_avg_sq);
            }
        }
        adam.step = step;
        Ok(())
    }

    /// Bytes moved to and from the NVMe swap files so far (zero without NVMe offload).
    pub fn swap_traffic(&self) -> SwapTraffic {
        let optimizer = self
            .optimizer
            .swap()
            .map_or(SwapTraffic::default(), |swap| swap.traffic());
        let params = self
            .state
            .get()
            .param_swap()
            .map_or(SwapTraffic::default(), |swap| swap.traffic());
        optimizer.plus(params)
    }

    /// This rank's use of NVMe, measured now (`None` without NVMe offload): the swap files'
    /// sizes on disk and the bytes moved.
    pub fn nvme_usage(&self) -> Result<Option<NvmeUsage>, ZeroError> {
        let (optimizer, params) = (self.optimizer.swap(), self.state.get().param_swap());
        if optimizer.is_none() && params.is_none() {
            return Ok(None);
        }
        let mut usage = NvmeUsage::default();
        let mut init = SwapTraffic::default();
        if let Some(swap) = optimizer {
            usage.directories.push(swap.dir().to_path_buf());
            usage.optimizer_bytes = swap.resident_bytes()?;
            init = init.plus(swap.init_traffic());
        }
        if let Some(swap) = params {
            usage.directories.push(swap.dir().to_path_buf());
            usage.param_bytes = swap.resident_bytes()?;
            init = init.plus(swap.init_traffic());
        }
        usage.resident_bytes = usage.optimizer_bytes + usage.param_bytes;
        usage.init = init;
        usage.steps = self.swap_traffic().since(init);
        Ok(Some(usage))
    }

    /// Starts an optimizer step: the accumulated gradients go back to zero.
    pub fn begin_step(&mut self) {
        self.grads.fill_zero();
    }

    /// After the last micro-step: stages 0 and 1 reduce the accumulated gradients now (stages
    /// 2 and 3 reduced them bucket by bucket during backward).
    pub fn reduce_at_boundary(&mut self) -> Result<(), ZeroError> {
        self.state
            .get_mut()
            .reduce_at_boundary(&mut self.group, &mut self.grads)
    }

    /// Makes the owned gradients available as `f32` ([`ZeroRank::owned_grads`]): copied (and
    /// widened) into the fp32 gradient partition the optimizer steps with whenever there is a
    /// separate master, as DeepSpeed builds it (and the plan lists it) before its step; in
    /// place for fp32 stage 0, whose parameters are the master.
    pub fn stage_owned_grads(&mut self) {
        if self.optimizer.has_master() {
            self.optimizer.staged = Some(self.staged_grads());
        }
    }

    /// A new `f32` copy of the owned gradients.
    fn staged_grads(&self) -> Buffer {
        let range = &self.owned_grads;
        let mut staged = Tracked::zeros(&self.group.ledger, Category::StepScratch, range.len());
        self.grads.read(range.start, &mut staged);
        staged
    }

    /// The owned gradients as `f32` (after [`ZeroRank::stage_owned_grads`]).
    pub fn owned_grads(&self) -> &[f32] {
        owned_view(&self.optimizer.staged, &self.grads, &self.owned_grads)
    }

    /// The owned gradients as `f32`, mutably (after [`ZeroRank::stage_owned_grads`]).
    pub fn owned_grads_mut(&mut self) -> &mut [f32] {
        let range = self.owned_grads.clone();
        match &mut self.optimizer.staged {
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
            .group
            .comm
            .all_reduce_scalar(if local { 1.0 } else { 0.0 }, ReduceOp::Max)?;
        Ok(flag != 0.0)
    }

    /// Drops the staged gradients of a skipped step.
    pub fn discard_step(&mut self) {
        self.optimizer.staged = None;
    }

    /// The optimizer step on the owned region with the (already unscaled and clipped) owned
    /// gradients; the new owned values go into the parameters wherever they live, and the
    /// stage's collectives bring the rest up to date (stages 1 and 2 all-gather the others'
    /// partitions, stage 3 re-gathers the persistent tensors). With the optimizer on NVMe
    /// (stage 3) it steps sub-group by sub-group: swap in, step, swap out, refresh.
    pub fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        if matches!(self.optimizer.master, Master::Nvme(_)) && self.optimizer.staged.is_none() {
            self.optimizer.staged = Some(self.staged_grads());
        }
        let Self {
            group,
            state,
            grads,
            owned_grads,
            optimizer,
            ..
        } = self;
        let stage = state.get_mut();
        let Optimizer {
            master,
            adam: moments,
            staged,
            ..
        } = optimizer;
        let step = moments.step + 1;
        let owned = owned_view(staged, grads, owned_grads);
        match master {
            Master::Nvme(swap) => {
                let stepped = swap.step(owned, step, lr, adam, |start, values| {
                    stage.write_owned(group, start, values)
                });
                *staged = None;
                stepped?;
                moments.step = step;
            }
            Master::Memory(master) => {
                adam_step(
                    master,
                    owned,
                    &mut moments.exp_avg,
                    &mut moments.exp_avg_sq,
                    step,
                    lr,
                    adam,
                )?;
                moments.step = step;
                *staged = None;
                stage.write_owned(group, 0, master)?;
            }
            Master::Params => {
                let params = stage.params_mut().as_f32_mut().unwrap_or(&mut []);
                adam_step(
                    params,
                    owned,
                    &mut moments.exp_avg,
                    &mut moments.exp_avg_sq,
                    step,
                    lr,
                    adam,
                )?;
                moments.step = step;
                *staged = None;
            }
        }
        stage.after_step(group)
    }
}

/// The owned gradients as `f32`: the staged copy, else `range` of the `f32` accumulated `grads`.
fn owned_view<'a>(
    staged: &'a Option<Buffer>,
    grads: &'a Tracked<DtypeVec>,
    range: &Range<usize>,
) -> &'a [f32] {
    match staged {
        Some(staged) => staged,
        None => grads.as_f32().map_or(&[][..], |g| &g[range.clone()]),
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
