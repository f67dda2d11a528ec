//! [`LlamaDeviceLayout`]: every device buffer of a Llama-family training step, laid out on the
//! host before anything is allocated, in the same [`Region`]s as GPT-2's
//! [`super::super::DeviceLayout`].
//!
//! The model states are [`LlamaLayout`]'s (Hugging Face names and order); every other tensor
//! comes from the planner's `memory::cuda_layout::llama_cuda_tensors`. Activation names are
//! the CPU model's ([`crate::model::llama::LlamaActivations`]) where the tensor is the same
//! one. The device keeps no `(B, NH, T, T)` probabilities (`lse` and `attention_delta`,
//! `(B, NH, T)`, replace `att` and `datt`), and it keeps the rotation table (`rope_cos`,
//! `rope_sin`, `(T, hs/2)`, f32) in the statistics region, uploaded once.
//!
//! At world size `W > 1` the model states are the rank's shares of the plan, exactly as
//! GPT-2's ([`LlamaDeviceLayout::for_plan_rank`], the same [`RankShares`]): the flat
//! buffers the kernels use, the rank's partition of the optimizer states at stages 1-2, the
//! gathered-parameter arena, the rank's shard and gradient partition at stage 3, and the
//! collectives' staging.

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::{
    self, CudaAttentionBias, CudaLayoutShape, CudaRegion, LlamaCudaShape,
};
use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_world::CudaShares;
use dsplan_planner::plan::stage3_arena::Stage3Arena;

use crate::cuda::train::buffers::{
    RankShares, Region, RegionLengths, RegionSizes, Tables, TensorRef, logits_rows, plan_placement,
    planner_dtype, shard_spans, share_lengths, whole,
};
use crate::metrics::ByCategory;
use crate::model::llama::{AttentionBias, LlamaConfig, LlamaLayout};
use crate::model::{BatchShape, Recompute};
use crate::tensor::{Span, TensorTable};

/// The activations one decoder layer keeps on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaDeviceBlock {
    /// `input_layernorm` output `(B, T, C)`.
    pub ln1: TensorRef,
    /// Its reciprocal RMS `(B, T)`, f32.
    pub ln1_rstd: TensorRef,
    /// `[q | k | v]`, `q` and `k` rotated `(B, T, QKV)`.
    pub qkv: TensorRef,
    /// Attention's log-sum-exp `(B, NH, T)`, f32 (replaces the CPU's `att`).
    pub lse: TensorRef,
    /// Attention output, heads side by side `(B, T, A)`.
    pub atty: TensorRef,
    /// The residual stream after attention `(B, T, C)`.
    pub residual2: TensorRef,
    /// `post_attention_layernorm` output `(B, T, C)`.
    pub ln2: TensorRef,
    /// Its reciprocal RMS, f32.
    pub ln2_rstd: TensorRef,
    /// `[gate | up]` `(B, T, 2I)`.
    pub gate_up: TensorRef,
    /// `silu(gate) * up` `(B, T, I)`.
    pub swiglu: TensorRef,
    /// The residual stream after the layer `(B, T, C)`.
    pub residual3: TensorRef,
}

/// Every device buffer of a Llama-family step, before allocation.
#[derive(Debug, Clone)]
pub struct LlamaDeviceLayout {
    /// The model.
    pub config: LlamaConfig,
    /// The micro-batch shape.
    pub shape: BatchShape,
    /// The model dtype.
    pub dtype: Dtype,
    /// What forward keeps of each layer.
    pub recompute: Recompute,
    /// The parameter layout (params, grads, master and moments share it).
    pub params: LlamaLayout,
    /// The activations' names and spans (region `Activations`).
    pub activation_table: TensorTable,
    /// The f32 statistics' names and spans (region `Stats`).
    pub stats_table: TensorTable,
    /// Token embeddings `(B, T, C)`.
    pub encoded: TensorRef,
    /// The rotation table's cosines `(T, hs/2)`, f32.
    pub rope_cos: TensorRef,
    /// Its sines `(T, hs/2)`, f32.
    pub rope_sin: TensorRef,
    /// Per layer.
    pub blocks: Vec<LlamaDeviceBlock>,
    /// `model.norm` output `(B, T, C)`.
    pub lnf: TensorRef,
    /// Its reciprocal RMS `(B, T)`, f32.
    pub lnf_rstd: TensorRef,
    /// Logits `(B, T, V)` with rows [`Self::logits_stride`] apart, in the planner's
    /// `(B, T, Vp)` tensor; dlogits after the classifier.
    pub logits: TensorRef,
    /// `Vp`: elements between the logits' rows
    /// ([`dsplan_planner::memory::cuda_layout::padded_vocab`]).
    pub logits_stride: usize,
    /// Per-position losses `(B, T)`, f32.
    pub losses: TensorRef,
    /// The residual stream's gradient `(B, T, C)`.
    pub dresidual: TensorRef,
    /// A `(B, T, C)` gradient work buffer.
    pub dbtc: TensorRef,
    /// `(B, T, max(QKV, 2I))`: `dqkv` or `dgate_up`.
    pub dwide: TensorRef,
    /// `(B, T, max(A, I))`: `datty` or `dswiglu`.
    pub dmid: TensorRef,
    /// RMSNorm backward's partials `ceil(N/32) x C`, f32.
    pub rmsnorm_partials: TensorRef,
    /// Bias backward's partials `ceil(N/64) x` the widest biased projection, f32 (empty
    /// without biases).
    pub bias_partials: TensorRef,
    /// Attention backward's `delta` `(B, NH, T)`, f32.
    pub attention_delta: TensorRef,
    /// What this rank holds of the model states and the collectives' staging (one GPU:
    /// everything whole).
    pub shares: CudaShares,
    /// Stage 3: each parameter tensor's slice in the shard, [`LlamaLayout`] order; empty
    /// otherwise.
    pub shard_spans: Vec<Span>,
    /// Stage 3: the plan's gathered-parameter arena ([`Self::for_plan_rank`]).
    pub arena: Option<Stage3Arena>,
    /// Stage 3: each persistent tensor's flat span and its place in the arena.
    pub persistent_places: Vec<(Span, Span)>,
    lengths: RegionLengths,
}

/// The planner's dimensions of a Llama-family step's buffers.
pub fn llama_layout_shape(
    config: &LlamaConfig,
    shape: BatchShape,
    params: &LlamaLayout,
    recompute: Recompute,
) -> LlamaCudaShape {
    let as_u64 = |n: usize| n as u64;
    LlamaCudaShape {
        base: CudaLayoutShape {
            layers: as_u64(config.num_hidden_layers),
            hidden: as_u64(config.hidden_size),
            heads: as_u64(config.num_attention_heads),
            vocab: as_u64(config.vocab_size),
            batch: as_u64(shape.batch),
            seq_len: as_u64(shape.seq_len),
            param_tensors: as_u64(params.table().entries().len()),
        },
        kv_heads: as_u64(config.num_key_value_heads),
        head_dim: as_u64(config.head_dim),
        intermediate: as_u64(config.intermediate_size),
        attention_bias: match config.attention_bias {
            AttentionBias::Absent => CudaAttentionBias::Absent,
            AttentionBias::Qkv => CudaAttentionBias::Qkv,
            AttentionBias::QkvO => CudaAttentionBias::QkvO,
        },
        recompute,
    }
}

impl LlamaDeviceLayout {
    /// The buffers of a step of `config` on micro-batches of `shape`, stored in `dtype`.
    pub fn new(config: LlamaConfig, shape: BatchShape, dtype: Dtype) -> Self {
        Self::recomputing(config, shape, dtype, Recompute::Nothing)
    }

    /// [`LlamaDeviceLayout::new`] with activation checkpointing as `recompute` says: under
    /// [`Recompute::EachLayer`] every layer's [`LlamaDeviceBlock`] but `residual3` is the one
    /// working set all layers share, which backward refills by re-running the layer.
    pub fn recomputing(
        config: LlamaConfig,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
    ) -> Self {
        let psi = LlamaLayout::new(&config).num_params() as u64;
        let shares = CudaShares::one_gpu(psi, planner_dtype(dtype));
        Self::with_shares(config, shape, dtype, recompute, shares)
    }

    /// The buffers of rank `rank` of `plan` (its shares of the model states, and at stage 3
    /// the plan's arena), as GPT-2's `DeviceLayout::for_plan_rank`.
    pub fn for_plan_rank(
        config: LlamaConfig,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
        plan: &Plan,
        rank: usize,
    ) -> Result<Self, String> {
        let shares = CudaShares::of_plan(plan).for_rank(rank as u64);
        let mut layout = Self::with_shares(config, shape, dtype, recompute, shares);
        let (arena, places) = plan_placement(plan, &shares, layout.params.table())?;
        layout.arena = arena;
        layout.persistent_places = places;
        Ok(layout)
    }

    /// The buffers of one rank holding `shares` of the model states;
    /// [`Self::recomputing`] is one GPU's.
    pub fn with_shares(
        config: LlamaConfig,
        shape: BatchShape,
        dtype: Dtype,
        recompute: Recompute,
        shares: CudaShares,
    ) -> Self {
        let params = LlamaLayout::new(&config);
        let mut tables = Tables::new(&cuda_layout::llama_cuda_tensors(&llama_layout_shape(
            &config, shape, &params, recompute,
        )));
        let act = |name: &str| tables.get(Region::Step(CudaRegion::Activations), name);
        let stat = |name: &str| tables.get(Region::Step(CudaRegion::Stats), name);
        let scratch = |name: &str| tables.get(Region::Step(CudaRegion::Scratch), name);
        let blocks = (0..config.num_hidden_layers)
            .map(|l| {
                let prefix = cuda_layout::working_set_prefix(recompute, l as u64);
                let name = |what: &str| match what {
                    "residual3" => format!("h.{l}.residual3"),
                    _ => format!("{prefix}.{what}"),
                };
                LlamaDeviceBlock {
                    ln1: act(&name("ln1")),
                    ln1_rstd: stat(&name("ln1_rstd")),
                    qkv: act(&name("qkv")),
                    lse: stat(&name("lse")),
                    atty: act(&name("atty")),
                    residual2: act(&name("residual2")),
                    ln2: act(&name("ln2")),
                    ln2_rstd: stat(&name("ln2_rstd")),
                    gate_up: act(&name("gate_up")),
                    swiglu: act(&name("swiglu")),
                    residual3: act(&name("residual3")),
                }
            })
            .collect();
        let lengths = share_lengths(&shares, &tables);
        let shard_spans = shard_spans(&shares, params.table());
        let (encoded, rope_cos, rope_sin) = (act("encoded"), stat("rope_cos"), stat("rope_sin"));
        let (lnf, lnf_rstd) = (act("lnf"), stat("lnf_rstd"));
        let (logits, logits_stride) = logits_rows(act("logits"), shape.tokens(), config.vocab_size);
        let losses = stat("losses");
        let (dresidual, dbtc) = (act("dresidual"), act("dbtc"));
        let (dwide, dmid) = (act("dwide"), act("dmid"));
        let rmsnorm_partials = scratch("rmsnorm_partials");
        let bias_partials = scratch("bias_partials");
        let attention_delta = scratch("attention_delta");
        Self {
            config,
            shape,
            dtype,
            recompute,
            params,
            activation_table: tables.take(Region::Step(CudaRegion::Activations)),
            stats_table: tables.take(Region::Step(CudaRegion::Stats)),
            encoded,
            rope_cos,
            rope_sin,
            blocks,
            lnf,
            lnf_rstd,
            logits,
            logits_stride,
            losses,
            dresidual,
            dbtc,
            dwide,
            dmid,
            rmsnorm_partials,
            bias_partials,
            attention_delta,
            shares,
            shard_spans,
            arena: None,
            persistent_places: Vec::new(),
            lengths,
        }
    }

    /// This rank's shares of the model states, as every family's step reads them.
    pub fn rank_shares(&self) -> RankShares<'_> {
        RankShares {
            shares: &self.shares,
            table: self.params.table(),
            shard_spans: &self.shard_spans,
            arena: self.arena.as_ref(),
            persistent_places: &self.persistent_places,
        }
    }

    /// The range of `region` (parameters or gradients) this rank's optimizer owns
    /// ([`RankShares::owned`]).
    pub fn owned(&self, region: Region) -> TensorRef {
        self.rank_shares().owned(region)
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

    /// Bytes per memory category (what allocating every region costs).
    pub fn bytes_by_category(&self) -> ByCategory {
        self.rank_shares()
            .bytes_by_category(&self.lengths, self.dtype)
    }
}

impl RegionSizes for LlamaDeviceLayout {
    fn region_len(&self, region: Region) -> usize {
        self.len(region)
    }

    fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        self.rank_shares().initial_params(whole)
    }

    fn initial_master(&self, whole: &[f32]) -> Vec<f32> {
        self.rank_shares()
            .initial_master(whole, self.trains_master())
    }

    fn adam_segments(&self, _param_table: &TensorTable) -> Vec<(usize, usize)> {
        self.rank_shares().segments()
    }
}
