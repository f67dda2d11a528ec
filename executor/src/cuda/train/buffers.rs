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

use std::collections::BTreeMap;

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::{self, CudaElement, CudaRegion, CudaTensor};
use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_world::{CudaScheme, CudaShares};
use dsplan_planner::plan::stage3_arena::Stage3Arena;

use super::family::{Family, Recipe, Tensors};
use super::program::Op;
use crate::cuda::element::{Element, strided_len};
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::metrics::{ByCategory, Category};
use crate::model::{BatchShape, ModelConfig, Recompute};
use crate::tensor::{Span, TensorTable};

/// One device allocation of the step: a model state, or one of the planner's step regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// Parameters in the model dtype.
    Params,
    /// Gradients in the model dtype.
    Grads,
    /// fp32 master weights (16-bit training).
    Master,
    /// Adam's first moment.
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// A region the planner's `cuda_layout` sizes (activations, statistics, scratch, the
    /// batch, the step's norm and segment table).
    Step(CudaRegion),
    /// Stage 3 (W > 1): a bucket packed rank by rank for its reduce-scatter.
    ReduceStaging,
    /// The all-gather's packed input (stage 3's slices of a fetch; a sharded stage-1/2 piece).
    GatherIn,
    /// The all-gather's output (`W ×` its input), unpacked into the parameters.
    GatherOut,
}

impl Region {
    /// Every region, in allocation order: the model states, then the planner's regions.
    pub const ALL: [Region; 20] = [
        Region::Params,
        Region::Grads,
        Region::Master,
        Region::ExpAvg,
        Region::ExpAvgSq,
        Region::Step(CudaRegion::Activations),
        Region::Step(CudaRegion::Stats),
        Region::Step(CudaRegion::Scratch),
        Region::Step(CudaRegion::Tokens),
        Region::Step(CudaRegion::Targets),
        Region::Step(CudaRegion::BucketTokens),
        Region::Step(CudaRegion::BucketStarts),
        Region::Step(CudaRegion::BucketRows),
        Region::Step(CudaRegion::NormPartials),
        Region::Step(CudaRegion::NormTotal),
        Region::Step(CudaRegion::FoundInf),
        Region::Step(CudaRegion::Segments),
        Region::ReduceStaging,
        Region::GatherIn,
        Region::GatherOut,
    ];

    /// What the region's elements are (the planner's, [`cuda_layout::CudaRegion::element`],
    /// for all but the model states).
    pub fn element(self) -> Element {
        match self {
            Region::Params
            | Region::Grads
            | Region::ReduceStaging
            | Region::GatherIn
            | Region::GatherOut => Element::Model,
            Region::Master | Region::ExpAvg | Region::ExpAvgSq => Element::F32,
            Region::Step(region) => match region.element() {
                CudaElement::Model => Element::Model,
                CudaElement::F32 => Element::F32,
                CudaElement::F64 => Element::F64,
                CudaElement::U32 => Element::U32,
                CudaElement::I32 => Element::I32,
                CudaElement::AdamSegment => Element::AdamSegment,
            },
        }
    }

    /// The memory category its bytes count in.
    pub fn category(self) -> Category {
        match self {
            Region::Params => Category::Params,
            Region::Grads => Category::Grads,
            Region::ReduceStaging | Region::GatherIn | Region::GatherOut => Category::Buckets,
            Region::Master => Category::Master,
            Region::ExpAvg | Region::ExpAvgSq => Category::Optimizer,
            Region::Step(
                CudaRegion::NormPartials
                | CudaRegion::NormTotal
                | CudaRegion::FoundInf
                | CudaRegion::Segments,
            ) => Category::StepScratch,
            Region::Step(_) => Category::Activations,
        }
    }
}

/// A tensor on the device: a span of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRef {
    /// The region.
    pub region: Region,
    /// Where in it.
    pub span: Span,
}

impl TensorRef {
    /// Elements.
    pub fn len(&self) -> usize {
        self.span.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The first `len` elements.
    pub fn prefix(&self, len: usize) -> TensorRef {
        TensorRef {
            region: self.region,
            span: Span::new(self.span.offset, len.min(self.span.len)),
        }
    }

    /// Whether the two share an element.
    pub fn overlaps(&self, other: &TensorRef) -> bool {
        self.region == other.region
            && self.span.offset < other.span.end()
            && other.span.offset < self.span.end()
    }
}

/// Every device buffer of a step, before allocation: the tensors every family has here, the
/// family's own in [`Family`].
#[derive(Debug, Clone)]
pub struct DeviceLayout {
    /// The model family, its tensors and its recipe.
    pub family: Family,
    /// The micro-batch shape.
    pub shape: BatchShape,
    /// The model dtype.
    pub dtype: Dtype,
    /// What forward keeps of each layer.
    pub recompute: Recompute,
    /// The activations' names and spans (region `Activations`).
    pub activation_table: TensorTable,
    /// The f32 statistics' names and spans (region `Stats`).
    pub stats_table: TensorTable,
    /// The embeddings `(B, T, C)`.
    pub encoded: TensorRef,
    /// The final norm's output `(B, T, C)`.
    pub lnf: TensorRef,
    /// Its rstd `(B, T)`, f32.
    pub lnf_rstd: TensorRef,
    /// Logits `(B, T, V)` with rows [`Self::logits_stride`] apart, in the planner's
    /// `(B, T, Vp)` tensor; dlogits after the classifier.
    pub logits: TensorRef,
    /// `Vp`: elements between the logits' rows ([`cuda_layout::padded_vocab`]).
    pub logits_stride: usize,
    /// Per-position losses `(B, T)`, f32.
    pub losses: TensorRef,
    /// The residual stream's gradient `(B, T, C)`.
    pub dresidual: TensorRef,
    /// A `(B, T, C)` gradient work buffer.
    pub dbtc: TensorRef,
    /// Bias backward's partials `ceil(N/64) x` the widest biased product, f32 (empty without
    /// biases).
    pub bias_partials: TensorRef,
    /// Attention backward's `delta` `(B, NH, T)`, f32.
    pub attention_delta: TensorRef,
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

/// Blocks of `unscale_norm_partials` (its `NORM_BLOCKS`; defined by the planner).
pub const NORM_BLOCKS: usize = cuda_layout::NORM_BLOCKS as usize;

// The planner sizes the segment table with the struct's size.
const _: () = assert!(
    std::mem::size_of::<super::super::adamw::AdamSegment>() as u64
        == cuda_layout::ADAM_SEGMENT_BYTES
);

pub(crate) fn whole(region: Region, len: usize) -> TensorRef {
    TensorRef {
        region,
        span: Span::new(0, len),
    }
}

/// The `(N, V)` logits the products and the classifier use, rows `Vp` apart
/// ([`cuda_layout::padded_vocab`]), at the start of the planner's `(N, Vp)` tensor `whole`,
/// and `Vp`. The span ends at the last row's last real column; the padding is never touched.
pub(crate) fn logits_rows(whole: TensorRef, rows: usize, vocab: usize) -> (TensorRef, usize) {
    let stride = to_usize(cuda_layout::padded_vocab(vocab as u64));
    (whole.prefix(strided_len(rows, vocab, stride)), stride)
}

/// The planner's name of a model dtype.
pub fn planner_dtype(dtype: Dtype) -> dsplan_planner::plan::Dtype {
    use dsplan_planner::plan::Dtype as P;
    match dtype {
        Dtype::F32 => P::Fp32,
        Dtype::Bf16 => P::Bf16,
        Dtype::F16 => P::Fp16,
        Dtype::F64 => P::Fp64,
    }
}

pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// The planner's tensors, one table per region, and the spans of named ones.
pub(crate) struct Tables(BTreeMap<Region, TensorTable>);

impl Tables {
    pub(crate) fn new(tensors: &[CudaTensor]) -> Self {
        let mut tables: BTreeMap<Region, TensorTable> = BTreeMap::new();
        for tensor in tensors {
            let dims: Vec<usize> = tensor.shape.iter().map(|&d| to_usize(d)).collect();
            tables
                .entry(Region::Step(tensor.region))
                .or_default()
                .push(tensor.name.clone(), &dims);
        }
        Self(tables)
    }

    /// The tensor `name` of `region` (empty when the planner has none: the step's check
    /// refuses every op on it).
    pub(crate) fn get(&self, region: Region, name: &str) -> TensorRef {
        let span = self
            .0
            .get(&region)
            .and_then(|table| table.get(name))
            .map_or(Span::new(0, 0), |entry| entry.span);
        TensorRef { region, span }
    }

    pub(crate) fn len(&self, region: Region) -> usize {
        self.0.get(&region).map_or(0, TensorTable::total_len)
    }

    pub(crate) fn take(&mut self, region: Region) -> TensorTable {
        self.0.remove(&region).unwrap_or_default()
    }
}

impl DeviceLayout {
    /// The buffers of a step of `model` on micro-batches of `shape`, stored in `dtype`: the
    /// model states from its parameter layout, everything else from the planner's
    /// [`cuda_layout`] list (the one the `dsplan-cuda` plan counts).
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
        let family = Family::new(&model, recompute, &Tensors(&tables));
        let named = Tensors(&tables);
        let (encoded, lnf, lnf_rstd) = (
            named.activation("encoded"),
            named.activation("lnf"),
            named.stat("lnf_rstd"),
        );
        let (logits, logits_stride) = logits_rows(
            named.activation("logits"),
            shape.tokens(),
            model.vocab_size(),
        );
        let losses = named.stat("losses");
        let (dresidual, dbtc) = (named.activation("dresidual"), named.activation("dbtc"));
        let bias_partials = named.scratch("bias_partials");
        let attention_delta = named.scratch("attention_delta");
        let lengths = share_lengths(&shares, &tables);
        let shard_spans = shard_spans(&shares, family.recipe().param_table());
        Self {
            family,
            shape,
            dtype,
            recompute,
            activation_table: tables.take(Region::Step(CudaRegion::Activations)),
            stats_table: tables.take(Region::Step(CudaRegion::Stats)),
            encoded,
            lnf,
            lnf_rstd,
            logits,
            logits_stride,
            losses,
            dresidual,
            dbtc,
            bias_partials,
            attention_delta,
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
        let shares = CudaShares::of_plan(plan).for_rank(rank as u64);
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

    /// The parameter tensors in flat order.
    pub fn param_table(&self) -> &TensorTable {
        self.recipe().param_table()
    }

    /// The forward (through the classifier) and backward ops over the flat parameters and
    /// gradients: the family's recipe.
    pub fn passes(&self) -> [Vec<Op>; 2] {
        let recipe = self.recipe();
        [recipe.forward(self), recipe.backward(self)]
    }

    /// The `lm_head` (an `nn.Linear` over `weight (V, C)`, GPT-2's tied to `wte`) from `lnf`
    /// into the logits, their rows `Vp` apart, then the classifier (losses, and dlogits in
    /// place).
    pub fn lm_head_forward(&self, weight: TensorRef) -> [Op; 2] {
        let (vocab, stride) = (self.vocab(), self.logits_stride);
        [
            Op::Linear {
                product: self.lm_head_product(Pass::Forward, Accumulate::Overwrite),
                out: self.logits,
                first: self.lnf,
                second: weight,
                bias: None,
            },
            Op::FusedClassifier {
                logits: self.logits,
                losses: self.losses,
                targets: self.whole(Region::Step(CudaRegion::Targets)),
                vocab,
                stride,
            },
        ]
    }

    /// The `lm_head`'s backward: `dlnf = dlogits @ W` into `dbtc`, `dW += dlogits^T @ lnf`.
    pub fn lm_head_backward(&self, weight: TensorRef, dweight: TensorRef) -> [Op; 2] {
        [
            Op::Linear {
                product: self.lm_head_product(Pass::BackwardInput, Accumulate::Overwrite),
                out: self.dbtc,
                first: self.logits,
                second: weight,
                bias: None,
            },
            Op::Linear {
                product: self.lm_head_product(Pass::BackwardWeight, Accumulate::Add),
                out: dweight,
                first: self.lnf,
                second: self.logits,
                bias: None,
            },
        ]
    }

    fn vocab(&self) -> usize {
        self.recipe().model().vocab_size()
    }

    fn lm_head_product(&self, pass: Pass, accumulate: Accumulate) -> Product {
        let c = self.lnf.len() / self.shape.tokens().max(1);
        Product {
            pass,
            weight: WeightLayout::OutIn,
            dims: (self.shape.tokens(), c, self.vocab()),
            stride: self.logits_stride,
            accumulate,
        }
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
        self.lengths.bytes(region, self.dtype)
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
            .bytes_by_category(&self.lengths, self.dtype)
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

    /// Every region with its bytes, in allocation order.
    pub fn regions(&self) -> Vec<(Region, u64)> {
        Region::ALL.iter().map(|&r| (r, self.bytes(r))).collect()
    }
}

/// A rank's shares of the plan's model states, borrowed from its layout (GPT-2's
/// [`DeviceLayout`], the Llama family's `LlamaDeviceLayout`): what its owned range, its AdamW
/// segments and its first uploads follow, one path for every family.
#[derive(Debug, Clone, Copy)]
pub struct RankShares<'a> {
    /// The rank's shares of the plan (one GPU: everything whole).
    pub shares: &'a CudaShares,
    /// The parameter tensors in flat order.
    pub table: &'a TensorTable,
    /// Stage 3: each tensor's slice in the shard ([`DeviceLayout::shard_spans`]); empty
    /// otherwise.
    pub shard_spans: &'a [Span],
    /// Stage 3: the plan's gathered-parameter arena.
    pub arena: Option<&'a Stage3Arena>,
    /// Stage 3: each persistent tensor's flat span and its place in the arena.
    pub persistent_places: &'a [(Span, Span)],
}

impl RankShares<'_> {
    /// The range of `region` (parameters or gradients) this rank's optimizer owns: everything
    /// on one GPU and at stage 0, its flat partition at stages 1-2, its shard at stage 3.
    pub fn owned(&self, region: Region) -> TensorRef {
        let (start, len) = match self.shares.scheme {
            CudaScheme::Replicated => (0, self.table.total_len() as u64),
            CudaScheme::FlatPartition => (self.shares.partition, self.shares.optimizer),
            CudaScheme::Sharded => match region {
                Region::Grads => (self.shares.grads, self.shares.grad_partition),
                _ => (self.shares.params, self.shares.param_shard),
            },
        };
        TensorRef {
            region,
            span: Span::new(to_usize(start), to_usize(len)),
        }
    }

    /// The fused AdamW's segments `(offset, len)` over the owned range ([`Self::owned`]):
    /// one per parameter tensor that reaches into it, offsets from the range's start.
    pub fn segments(&self) -> Vec<(usize, usize)> {
        let entries = self.table.entries();
        match self.shares.scheme {
            CudaScheme::Replicated => entries
                .iter()
                .map(|e| (e.span.offset, e.span.len))
                .collect(),
            CudaScheme::FlatPartition => {
                let start = to_usize(self.shares.partition);
                let end = start + to_usize(self.shares.optimizer);
                entries
                    .iter()
                    .filter_map(|e| {
                        let (a, b) = (e.span.offset.max(start), e.span.end().min(end));
                        (a < b).then(|| (a - start, b - a))
                    })
                    .collect()
            }
            CudaScheme::Sharded => self
                .shard_spans
                .iter()
                .filter(|s| s.len > 0)
                .map(|s| (s.offset, s.len))
                .collect(),
        }
    }

    /// The parameters' region as this rank starts it from the whole model `whole` (f32,
    /// flat order): the model and zero padding to the flat buffer's length; at
    /// stage 3 the arena (the persistent tensors at their places, zeros elsewhere) and the
    /// rank's slices of every tensor (zero-padded) after it.
    pub fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        let mut out = match self.shares.scheme {
            CudaScheme::Sharded => {
                let mut arena = vec![0.0; to_usize(self.shares.params)];
                for &(flat, place) in self.persistent_places {
                    if let (Some(dst), Some(src)) = (
                        arena.get_mut(place.offset..place.end()),
                        whole.get(flat.offset..flat.end()),
                    ) {
                        dst.copy_from_slice(src);
                    }
                }
                arena
            }
            CudaScheme::Replicated | CudaScheme::FlatPartition => {
                let mut flat = whole.to_vec();
                flat.resize(to_usize(self.shares.params), 0.0);
                flat
            }
        };
        if self.shares.scheme == CudaScheme::Sharded {
            let rank = to_usize(self.shares.rank);
            for (entry, slice) in self.table.entries().iter().zip(self.shard_spans) {
                let from = (entry.span.offset + rank * slice.len).min(entry.span.end());
                let to = (from + slice.len).min(entry.span.end());
                let mut piece = whole.get(from..to).unwrap_or(&[]).to_vec();
                piece.resize(slice.len, 0.0);
                out.extend(piece);
            }
        }
        out
    }

    /// The fp32 master this rank starts from (its owned range of [`Self::initial_params`]);
    /// empty when the parameters are the master.
    pub fn initial_master(&self, whole: &[f32], trains_master: bool) -> Vec<f32> {
        if !trains_master {
            return Vec::new();
        }
        let owned = self.owned(Region::Params);
        let params = self.initial_params(whole);
        params
            .get(owned.span.offset..owned.span.end())
            .unwrap_or(&[])
            .to_vec()
    }

    /// Bytes per memory category of `lengths` (this rank's regions) stored in `dtype`: at
    /// stage 3 the parameters' region holds the gathered-parameter arena (category gathered)
    /// and then the rank's shard (category params).
    pub fn bytes_by_category(&self, lengths: &RegionLengths, dtype: Dtype) -> ByCategory {
        let mut total = ByCategory::default();
        let mut add = |category: Category, bytes: u64| {
            total.set(category, total.get(category) + bytes);
        };
        for region in Region::ALL {
            let bytes = lengths.bytes(region, dtype);
            if region == Region::Params && self.shares.scheme == CudaScheme::Sharded {
                let shard = self.shares.param_shard * region.element().size(dtype) as u64;
                add(Category::Gathered, bytes - shard);
                add(Category::Params, shard);
            } else {
                add(region.category(), bytes);
            }
        }
        total
    }
}

/// The lengths of a rank's regions holding `shares` of the model states, the planner's
/// step regions from `tables`.
pub(crate) fn share_lengths(shares: &CudaShares, tables: &Tables) -> RegionLengths {
    let n = |v: u64| to_usize(v);
    RegionLengths(Region::ALL.map(|region| match region {
        Region::Params => n(shares.params + shares.param_shard),
        Region::Grads => n(shares.grads + shares.grad_partition),
        Region::ExpAvg | Region::ExpAvgSq => n(shares.optimizer),
        Region::Master => n(shares.master),
        Region::ReduceStaging => n(shares.bucket),
        Region::GatherIn => n(shares.gather),
        Region::GatherOut => n(shares.gather_out()),
        other => tables.len(other),
    }))
}

/// Stage 3: each tensor of `table`'s slice in the rank's shard (`ceil(numel / W)` each, back
/// to back, in flat order); empty otherwise.
pub(crate) fn shard_spans(shares: &CudaShares, table: &TensorTable) -> Vec<Span> {
    match shares.scheme {
        CudaScheme::Sharded => {
            let world = to_usize(shares.world).max(1);
            let mut offset = 0;
            table
                .entries()
                .iter()
                .map(|e| {
                    let slice = e.span.len.div_ceil(world);
                    let span = Span::new(offset, slice);
                    offset += slice;
                    span
                })
                .collect()
        }
        CudaScheme::Replicated | CudaScheme::FlatPartition => Vec::new(),
    }
}

/// Stage 3: the plan's gathered-parameter arena and each persistent tensor's flat span in
/// `table` with its place there; nothing below stage 3. An error when the plan shards the
/// parameters without placing them, or places a tensor `table` does not have.
#[allow(clippy::type_complexity)]
pub(crate) fn plan_placement(
    plan: &Plan,
    shares: &CudaShares,
    table: &TensorTable,
) -> Result<(Option<Stage3Arena>, Vec<(Span, Span)>), String> {
    if shares.scheme != CudaScheme::Sharded {
        return Ok((None, Vec::new()));
    }
    let arena = plan
        .stage3
        .as_ref()
        .and_then(|s| s.arena.as_ref())
        .ok_or("the plan shards the parameters but places no stage-3 arena")?;
    let entries = table.entries();
    let mut places = Vec::new();
    for place in arena.persistent() {
        let name = plan
            .layout
            .entries
            .iter()
            .find(|e| e.tensor == place.tensor)
            .map(|e| e.name.as_str());
        let flat = entries
            .iter()
            .find(|e| Some(e.name.as_str()) == name)
            .map(|e| e.span)
            .filter(|s| s.len as u64 == place.numel)
            .ok_or_else(|| {
                format!(
                    "the plan's persistent tensor {} ({name:?}) is not a parameter of {} elements of the device model",
                    place.tensor, place.numel
                )
            })?;
        places.push((
            flat,
            Span::new(to_usize(place.offset), to_usize(place.numel)),
        ));
    }
    Ok((Some(arena.clone()), places))
}

/// The sizes of a layout's regions (GPT-2's [`DeviceLayout`], the Llama family's
/// `LlamaDeviceLayout`): what the op checks and the step's whole-region ops need.
pub trait RegionSizes {
    /// Elements of `region`.
    fn region_len(&self, region: Region) -> usize;

    /// A region whole.
    fn whole_region(&self, region: Region) -> TensorRef {
        whole(region, self.region_len(region))
    }

    /// Whether 16-bit parameters are trained through fp32 master weights.
    fn trains_master(&self) -> bool {
        self.region_len(Region::Master) > 0
    }

    /// What this rank uploads into [`Region::Params`] from the whole model's parameters
    /// (flat order): all of them, unless the layout shares them out across ranks.
    fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        whole.to_vec()
    }

    /// What this rank uploads into [`Region::Master`]: the parameters it owns, in fp32.
    fn initial_master(&self, whole: &[f32]) -> Vec<f32> {
        if self.trains_master() {
            whole.to_vec()
        } else {
            Vec::new()
        }
    }

    /// The AdamW segments (offset, length) of this rank's optimizer region: one per tensor of
    /// `param_table` unless the layout shares the optimizer out across ranks.
    fn adam_segments(&self, param_table: &TensorTable) -> Vec<(usize, usize)> {
        param_table
            .entries()
            .iter()
            .map(|e| (e.span.offset, e.span.len))
            .collect()
    }
}

impl RegionSizes for RegionLengths {
    fn region_len(&self, region: Region) -> usize {
        self.len(region)
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

    fn adam_segments(&self, _param_table: &TensorTable) -> Vec<(usize, usize)> {
        self.segments()
    }
}

/// Elements of every region, [`Region::ALL`] order: what a layout of any family allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionLengths([usize; Region::ALL.len()]);

impl RegionLengths {
    /// Elements of `region`.
    pub fn len(&self, region: Region) -> usize {
        let index = Region::ALL.iter().position(|r| *r == region).unwrap_or(0);
        self.0[index]
    }

    /// Bytes of `region` when the model is stored in `dtype`.
    pub fn bytes(&self, region: Region, dtype: Dtype) -> u64 {
        (self.len(region) * region.element().size(dtype)) as u64
    }

    /// Bytes per memory category.
    pub fn bytes_by_category(&self, dtype: Dtype) -> ByCategory {
        let mut total = ByCategory::default();
        for region in Region::ALL {
            let category = region.category();
            total.set(category, total.get(category) + self.bytes(region, dtype));
        }
        total
    }
}
