//! Every device buffer of a training step, laid out on the host before anything is allocated:
//! [`DeviceLayout`] names each tensor, the region (one allocation) it lives in and its span,
//! and adds the bytes up per memory category, so a test can hold them against the plan.
//!
//! One layout serves every model family: the model states are the family's parameter table;
//! every other tensor (name, shape, region, element) comes from the planner's
//! `memory::cuda_layout` list, the same list the `dsplan-cuda` plan backend counts, so the
//! plan and the allocation agree by construction. The tensors every family has are
//! [`DeviceLayout`]'s fields; a family's own are read by name in `super::family`.
//!
//! | region | element | holds | category |
//! |---|---|---|---|
//! | `Params` | model dtype | the flat parameters, in the parameter table's order | params |
//! | `Grads` | model dtype | their gradients, accumulated over micro-steps | grads |
//! | `Master` | f32 | the fp32 master weights (16-bit training only) | master |
//! | `ExpAvg`, `ExpAvgSq` | f32 | Adam's moments | optimizer |
//! | `Activations` | model dtype | what forward keeps for backward, the logits, the gradient work buffers | activations |
//! | `Stats` | f32 | LayerNorm means and rstds, attention log-sum-exps, per-position losses | activations |
//! | `Scratch` | f32 | backward's partial sums (LayerNorm, bias) and attention's `delta` | activations |
//! | `Tokens`, `Targets`, `Bucket*` | u32 / i32 | the micro-batch and its token buckets | activations |
//! | `NormPartials`, `NormTotal`, `FoundInf`, `Segments` | f64 / i32 / struct | the step's norm, overflow flag and Adam segment table | step scratch |
//!
//! Activation names follow the CPU models' where the tensor is the same one; the device keeps
//! no `(B, NH, T, T)` attention matrix (`lse` and `delta`, `(B, NH, T)`, replace `att` and
//! `datt`).
//!
//! At world size `W > 1` the model states are the rank's shares of the plan
//! (`planner::plan::cuda_world::CudaShares`, [`DeviceLayout::with_shares`]): `Params` and
//! `Grads` are the flat buffers the kernels use (at stage 3 followed by the rank's parameter
//! shard and gradient partition), `Master` and the moments the rank's partition, and
//! `ReduceStaging`, `GatherIn`, `GatherOut` the collectives' staging (category buckets). At
//! stage 3 `Params` starts with the plan's gathered-parameter arena
//! (`planner::plan::stage3_arena`) instead of the whole model: the plan places every gathered
//! tensor in it ([`DeviceLayout::for_plan_rank`] carries the placement), and the persistent
//! tensors start at their places.
//!
//! At world size 1 ZeRO stages 0-3 compute the same step, and this layout is the same for all
//! of them: the buffers DeepSpeed adds per stage (stage 1/2's fp32 gradient partition built at
//! the step, BF16_Optimizer's fp32 accumulation buffer, stage 3's gathered copies and
//! reduce-scatter staging) have no job on one GPU, since the fused AdamW widens the 16-bit
//! gradients in registers. The memory test prints those categories against the plan.

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_world::CudaShares;
use dsplan_planner::plan::settings::{OffloadStepping, OffloadTarget};
use dsplan_planner::plan::stage3_arena::Stage3Arena;

use super::family::{Family, Recipe};
use super::program::Op;
use super::region::{HostRegion, Region, RegionLengths, RegionSizes, Tables, TensorRef, whole};
use super::shares::{RankShares, plan_placement, planner_dtype, shard_spans, share_lengths};
use super::step_tensors::StepTensors;
use crate::metrics::ByCategory;
use crate::model::{BatchShape, ModelConfig, Recompute};
use crate::tensor::{Span, TensorTable};

/// Every device buffer of a step, before allocation: the tensors every family has
/// ([`StepTensors`]), the family's own and its recipe ([`Family`]), and the rank's shares of
/// the model states.
#[derive(Debug, Clone)]
pub struct DeviceLayout {
    /// The tensors every family has, and the step's shape and dtype.
    pub step: StepTensors,
    /// The model family, its tensors and its recipe.
    pub family: Family,
    /// The activations' names and spans (region `Activations`).
    pub activation_table: TensorTable,
    /// The f32 statistics' names and spans (region `Stats`).
    pub stats_table: TensorTable,
    /// What this rank holds of the model states and the collectives' staging (one GPU:
    /// everything whole).
    pub shares: CudaShares,
    /// Stage 3: each parameter tensor's slice in the shard (after the gathered parameters in
    /// [`Region::Params`], after the working gradients in [`Region::Grads`]), offsets from the
    /// shard's start, flat order; empty otherwise.
    pub shard_spans: Vec<Span>,
    /// Stage 3: the plan's gathered-parameter arena (the start of [`Region::Params`]); `None`
    /// otherwise, or when the layout was built from shares alone ([`Self::with_shares`]).
    pub arena: Option<Stage3Arena>,
    /// Stage 3: each persistent tensor's flat span and its place in the arena, where the rank
    /// starts it ([`Self::initial_params`]).
    pub persistent_places: Vec<(Span, Span)>,
    /// Region lengths in elements.
    lengths: RegionLengths,
}

impl DeviceLayout {
    /// The buffers of a step of `model` on micro-batches of `shape`, stored in `dtype`: the
    /// model states from its parameter layout, everything else from the planner's
    /// `memory::cuda_layout` list (the one the `dsplan-cuda` plan counts).
    pub fn new(model: impl Into<ModelConfig>, shape: BatchShape, dtype: Dtype) -> Self {
        Self::recomputing(model, shape, dtype, Recompute::Nothing)
    }

    /// [`DeviceLayout::new`] with activation checkpointing as `recompute` says: under
    /// [`Recompute::EachLayer`] every layer's tensors but `residual3` are the one working set
    /// all layers share, which backward refills by re-running the layer.
    pub fn recomputing(
        model: impl Into<ModelConfig>,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
    ) -> Self {
        let model = model.into();
        let psi = model.layout().num_params() as u64;
        let shares = CudaShares::one_gpu(psi, planner_dtype(dtype));
        Self::with_shares(model, shape, dtype, recompute, shares)
    }

    /// The buffers of one rank holding `shares` of the model states (from the plan:
    /// `CudaShares::of_plan(plan).for_rank(rank)`), recomputing as `recompute` says;
    /// [`Self::recomputing`] is one GPU's.
    pub fn with_shares(
        model: impl Into<ModelConfig>,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
        shares: CudaShares,
    ) -> Self {
        let model = model.into();
        let mut tables = Tables::new(&Family::planner_tensors(&model, shape, recompute));
        let family = Family::new(&model, recompute, &tables);
        let step = StepTensors::new(
            (shape, dtype, recompute),
            model.vocab_size(),
            shares.scheme,
            &tables,
        );
        let lengths = share_lengths(&shares, &tables);
        let shard_spans = shard_spans(&shares, family.recipe().param_table());
        Self {
            step,
            family,
            activation_table: tables.take(Region::Step(CudaRegion::Activations)),
            stats_table: tables.take(Region::Step(CudaRegion::Stats)),
            shares,
            shard_spans,
            arena: None,
            persistent_places: Vec::new(),
            lengths,
        }
    }

    /// The buffers of rank `rank` of `plan` ([`Self::with_shares`] with the plan's shares for
    /// that rank), carrying the plan's stage-3 arena; an error when the plan shards the
    /// parameters without placing them, or places a tensor the model does not have.
    pub fn for_plan_rank(
        model: impl Into<ModelConfig>,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
        plan: &Plan,
        rank: usize,
    ) -> Result<Self, String> {
        // Under offload the device program is built as without it, its optimizer then moved
        // to the host ([`Self::offload_optimizer`], by `super::world::rank_models`).
        super::offload_plan::check_offload_plan(plan)?;
        let mut settings = plan.settings.clone();
        settings.offload_optimizer = OffloadTarget::None;
        let shares = CudaShares::new(
            &settings,
            &plan.layout,
            &plan.shards,
            &plan.buckets,
            plan.stage3.as_ref(),
        )
        .for_rank(rank as u64);
        let mut layout = Self::with_shares(model, shape, dtype, recompute, shares);
        let (arena, places) = plan_placement(plan, &shares, layout.param_table())?;
        layout.arena = arena;
        layout.persistent_places = places;
        Ok(layout)
    }

    /// The family's recipe.
    pub fn recipe(&self) -> &dyn Recipe {
        self.family.recipe()
    }

    /// The model dtype.
    pub fn dtype(&self) -> Dtype {
        self.step.dtype
    }

    /// The parameter tensors in flat order.
    pub fn param_table(&self) -> &TensorTable {
        self.recipe().param_table()
    }

    /// The forward (through the classifier) and backward ops over the flat parameters and
    /// gradients: the family's recipe over the step's tensors.
    pub fn passes(&self) -> [Vec<Op>; 2] {
        let recipe = self.recipe();
        [recipe.forward(&self.step), recipe.backward(&self.step)]
    }

    /// This rank's shares of the model states, as every family's step reads them.
    pub fn rank_shares(&self) -> RankShares<'_> {
        RankShares {
            shares: &self.shares,
            table: self.param_table(),
            shard_spans: &self.shard_spans,
            arena: self.arena.as_ref(),
            persistent_places: &self.persistent_places,
        }
    }

    /// Elements of `region`.
    pub fn len(&self, region: Region) -> usize {
        self.lengths.len(region)
    }

    /// Bytes of `region`.
    pub fn bytes(&self, region: Region) -> u64 {
        self.lengths.bytes(region, self.step.dtype)
    }

    /// A region whole.
    pub fn whole(&self, region: Region) -> TensorRef {
        whole(region, self.len(region))
    }

    /// A parameter (or its gradient, master copy or moment: pass the region) by span.
    pub fn param(&self, region: Region, span: Span) -> TensorRef {
        TensorRef { region, span }
    }

    /// Bytes per memory category (what allocating every region costs). At stage 3 the
    /// parameters' region holds the gathered-parameter arena (category gathered) and then
    /// the rank's shard (category params).
    pub fn bytes_by_category(&self) -> ByCategory {
        self.rank_shares()
            .bytes_by_category(&self.lengths, self.step.dtype)
    }

    /// The range of `region` (parameters or gradients) this rank's optimizer owns
    /// ([`RankShares::owned`]).
    pub fn owned(&self, region: Region) -> TensorRef {
        self.rank_shares().owned(region)
    }

    /// The fused AdamW's segments ([`RankShares::segments`]).
    pub fn segments(&self) -> Vec<(usize, usize)> {
        self.rank_shares().segments()
    }

    /// The parameters' region as this rank starts it ([`RankShares::initial_params`]).
    pub fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        self.rank_shares().initial_params(whole)
    }

    /// The fp32 master this rank starts from ([`RankShares::initial_master`]).
    pub fn initial_master(&self, whole: &[f32]) -> Vec<f32> {
        self.rank_shares()
            .initial_master(whole, RegionSizes::trains_master(self))
    }

    /// The layout with its optimizer on the host (ZeRO-Offload, [`super::offload`]): the
    /// device's master and moments are not allocated; the host holds the owned range's fp32
    /// master and moments, its gradient staging (model dtype), the AdamW segment table, and
    /// under `stepping` speculative the saved side of the state.
    pub fn offload_optimizer(&mut self, stepping: OffloadStepping) {
        let owned = self.len(Region::ExpAvg);
        let segments = self.len(Region::Step(CudaRegion::Segments));
        for region in [Region::Master, Region::ExpAvg, Region::ExpAvgSq] {
            if let Some(index) = Region::ALL.iter().position(|r| *r == region) {
                self.lengths.device[index] = 0;
            }
        }
        let speculative = stepping == OffloadStepping::Speculative;
        self.lengths.host = HostRegion::ALL.map(|host| match host {
            HostRegion::Segments => segments,
            HostRegion::SavedMaster | HostRegion::SavedExpAvg | HostRegion::SavedExpAvgSq
                if !speculative =>
            {
                0
            }
            _ => owned,
        });
    }

    /// Every region with its bytes, in allocation order.
    pub fn regions(&self) -> Vec<(Region, u64)> {
        Region::ALL.iter().map(|&r| (r, self.bytes(r))).collect()
    }
}

impl RegionSizes for DeviceLayout {
    fn region_len(&self, region: Region) -> usize {
        self.len(region)
    }

    fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        DeviceLayout::initial_params(self, whole)
    }

    fn initial_master(&self, whole: &[f32]) -> Vec<f32> {
        DeviceLayout::initial_master(self, whole)
    }

    fn initial_host_master(&self, whole: &[f32]) -> Vec<f32> {
        if self.lengths.offloads() {
            self.rank_shares().initial_master(whole, true)
        } else {
            Vec::new()
        }
    }

    fn adam_segments(&self, _param_table: &TensorTable) -> Vec<(usize, usize)> {
        self.segments()
    }
}
