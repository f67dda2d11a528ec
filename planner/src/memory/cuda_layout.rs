//! The activation and scratch buffers of dsplan's CUDA training step, one GPU: the one place
//! their names, shapes and element types are defined. The plan's `dsplan-cuda` backend lists
//! them ([`crate::plan::cuda_buffers`]) and the executor's device layout
//! (`dsplan_executor::cuda::train::DeviceLayout`) is built from [`cuda_tensors`], so the plan
//! and the allocation cannot drift apart.
//!
//! With `B` sequences of `T` tokens (`N = BT`), width `C`, `NH` heads, vocabulary `V`, `L`
//! blocks and `P` parameter tensors; the MLP is `4C` wide (GPT-2):
//!
//! | region | element | tensors | elements |
//! |---|---|---|---|
//! | activations | model dtype | `encoded`; per block `ln1`, `qkv` (`3C`), `atty`, `attproj`, `residual2`, `ln2`, `fch`, `fch_gelu` (`4C`), `fcproj`, `residual3`; `lnf`, `logits` (`Vp`); `dresidual`, `dbtc`, `dbt4c` (`4C`) | `NC·(18L + 8) + N·Vp` |
//! | stats | f32 | per block `ln1_mean`, `ln1_rstd`, `lse` `(B, NH, T)`, `ln2_mean`, `ln2_rstd`; `lnf_mean`, `lnf_rstd`, `losses` | `N·(4L + 3) + B·NH·T·L` |
//! | scratch | f32 | `layernorm_partials` `⌈N/32⌉·2·C`, `bias_partials` `⌈N/64⌉·4C`, `attention_delta` `(B, NH, T)` | `2C·⌈N/32⌉ + 4C·⌈N/64⌉ + B·NH·T` |
//! | tokens, targets | u32, i32 | the micro-batch's ids and targets | `N` each |
//! | bucket tokens, bucket starts, bucket rows | u32, i32, i32 | the embedding backward's token buckets | `N`, `N + 1`, `N` |
//! | norm partials, norm total | f64 | the gradient norm's per-block sums and their total | `1024`, `1` |
//! | found inf | i32 | the overflow flag | `1` |
//! | segments | Adam segment (24 bytes) | the fused AdamW's table, one per parameter tensor | `P` |
//!
//! The Llama family ([`llama_cuda_tensors`]; `KV` key/value heads of width `hs`, `A = NH·hs`,
//! `QKV = (NH + 2KV)·hs`, SwiGLU width `I`) keeps the rotated `q` and `k` in `qkv`, adds the
//! output and down projections straight into the residual stream (no `attproj`/`fcproj`) and
//! has no means (RMSNorm); the batch, bucket and step regions are GPT-2's:
//!
//! | region | tensors | elements |
//! |---|---|---|
//! | activations | `encoded`; per block `ln1`, `qkv` (`QKV`), `atty` (`A`), `residual2`, `ln2`, `gate_up` (`2I`), `swiglu` (`I`), `residual3`; `lnf`, `logits`; `dresidual`, `dbtc`, `dwide` (`max(QKV, 2I)`), `dmid` (`max(A, I)`) | `N·(4C + L·(4C + QKV + A + 3I) + max(QKV, 2I) + max(A, I)) + N·Vp` |
//! | stats | `rope_cos`, `rope_sin` `(T, hs/2)` (the rotation table, uploaded once); per block `ln1_rstd`, `lse`, `ln2_rstd`; `lnf_rstd`, `losses` | `T·hs + N·(2L + 2) + B·NH·T·L` |
//! | scratch | `rmsnorm_partials` `⌈N/32⌉·C`, `bias_partials` `⌈N/64⌉·` the widest biased projection (only with biases), `attention_delta` | |
//!
//! With activation checkpointing ([`Recompute::EachLayer`]; [`gpt2_cuda_tensors`], and
//! [`LlamaCudaShape::recompute`]) forward keeps each block's output `h.{l}.residual3` and all
//! blocks share one working set `h.recomputed.*` (its statistics too), as the CPU arena does:
//! the per-block terms above count once (`L` becomes 1) plus `L·NC` for the kept outputs.
//!
//! The logits' rows are `Vp` elements apart ([`padded_vocab`]: `V` rounded up to a multiple of
//! [`LOGITS_ROW_ALIGN`], 50,304 for GPT-2's 50,257): the three vocabulary products are issued
//! over the `V` real columns with a leading dimension of `Vp`, and the classifier kernel reads
//! and writes the same `V` columns. The `Vp - V` padding columns of each row are allocated and
//! counted here, and nothing reads or writes them.
//!
//! There is no `(B, NH, T, T)` attention matrix (flash attention keeps the log-sum-exp) and no
//! fp32 copy of the logits (the classifier kernel computes the loss and writes the gradient in
//! place).

use super::Recompute;

/// Rows per block of the LayerNorm backward kernel (its `LAYERNORM_BACKWARD_ROWS`).
pub const LAYERNORM_BACKWARD_ROWS: u64 = 32;
/// Rows per chunk of the bias backward's column partials (its `COLUMN_PARTIAL_ROWS`).
pub const COLUMN_PARTIAL_ROWS: u64 = 64;
/// Blocks of the gradient norm's partial sums (`unscale_norm_partials`' `NORM_BLOCKS`).
pub const NORM_BLOCKS: u64 = 1024;
/// Bytes of one entry of the fused AdamW's segment table (`struct AdamSegment`).
pub const ADAM_SEGMENT_BYTES: u64 = 24;
/// Elements the logits' row stride is a multiple of: 64 elements are 128 bytes in bf16/f16 and
/// 256 in f32, so every row starts 16-byte aligned in every model dtype. cuBLASLt picks
/// Hopper's (sm90) GEMM kernels for the vocabulary products only with 16-byte aligned leading
/// dimensions; GPT-2's unpadded rows (50,257 bf16 elements, 100,514 bytes) made it fall back to
/// Turing-era kernels.
pub const LOGITS_ROW_ALIGN: u64 = 64;

/// The logits' row stride `Vp`: `vocab` rounded up to a multiple of [`LOGITS_ROW_ALIGN`]
/// (50,257 → 50,304; a vocabulary already a multiple, such as 32,000, keeps its width).
pub fn padded_vocab(vocab: u64) -> u64 {
    vocab
        .div_ceil(LOGITS_ROW_ALIGN)
        .saturating_mul(LOGITS_ROW_ALIGN)
}

/// The dimensions the device buffers depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaLayoutShape {
    /// Transformer blocks `L`.
    pub layers: u64,
    /// Model width `C`.
    pub hidden: u64,
    /// Attention heads `NH`.
    pub heads: u64,
    /// Vocabulary `V`.
    pub vocab: u64,
    /// Sequences per micro-batch `B`.
    pub batch: u64,
    /// Tokens per sequence `T`.
    pub seq_len: u64,
    /// Parameter tensors `P` (one Adam segment each).
    pub param_tensors: u64,
}

/// One allocation of the step besides the model states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CudaRegion {
    /// Activations and gradient work buffers, model dtype.
    Activations,
    /// f32 statistics forward saves (means, rstds, log-sum-exps) and the losses.
    Stats,
    /// f32 partial sums of backward.
    Scratch,
    /// Token ids.
    Tokens,
    /// Targets (-1: none).
    Targets,
    /// The distinct tokens of the batch.
    BucketTokens,
    /// Where each token's rows start.
    BucketStarts,
    /// Row indices grouped by token.
    BucketRows,
    /// Partial sums of squares of the gradient norm.
    NormPartials,
    /// Their total.
    NormTotal,
    /// The inf/NaN flag.
    FoundInf,
    /// Adam's segment table.
    Segments,
}

impl CudaRegion {
    /// Every region, in allocation order.
    pub const ALL: [CudaRegion; 12] = [
        CudaRegion::Activations,
        CudaRegion::Stats,
        CudaRegion::Scratch,
        CudaRegion::Tokens,
        CudaRegion::Targets,
        CudaRegion::BucketTokens,
        CudaRegion::BucketStarts,
        CudaRegion::BucketRows,
        CudaRegion::NormPartials,
        CudaRegion::NormTotal,
        CudaRegion::FoundInf,
        CudaRegion::Segments,
    ];

    /// What its elements are.
    pub fn element(self) -> CudaElement {
        match self {
            CudaRegion::Activations => CudaElement::Model,
            CudaRegion::Stats | CudaRegion::Scratch => CudaElement::F32,
            CudaRegion::Tokens | CudaRegion::BucketTokens => CudaElement::U32,
            CudaRegion::Targets
            | CudaRegion::BucketStarts
            | CudaRegion::BucketRows
            | CudaRegion::FoundInf => CudaElement::I32,
            CudaRegion::NormPartials | CudaRegion::NormTotal => CudaElement::F64,
            CudaRegion::Segments => CudaElement::AdamSegment,
        }
    }

    /// Whether the region belongs to the optimizer step (the rest are the pass's).
    pub fn is_step_scratch(self) -> bool {
        matches!(
            self,
            CudaRegion::NormPartials
                | CudaRegion::NormTotal
                | CudaRegion::FoundInf
                | CudaRegion::Segments
        )
    }

    /// A short name for the region's allocation.
    pub fn as_str(self) -> &'static str {
        match self {
            CudaRegion::Activations => "activations",
            CudaRegion::Stats => "f32 statistics and losses",
            CudaRegion::Scratch => "backward f32 scratch",
            CudaRegion::Tokens => "token ids",
            CudaRegion::Targets => "targets",
            CudaRegion::BucketTokens => "embedding buckets: tokens",
            CudaRegion::BucketStarts => "embedding buckets: starts",
            CudaRegion::BucketRows => "embedding buckets: rows",
            CudaRegion::NormPartials => "gradient norm partials",
            CudaRegion::NormTotal => "gradient norm total",
            CudaRegion::FoundInf => "overflow flag",
            CudaRegion::Segments => "AdamW segment table",
        }
    }
}

/// The element type of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaElement {
    /// The model dtype (f32, bf16 or f16).
    Model,
    /// f32.
    F32,
    /// f64.
    F64,
    /// u32.
    U32,
    /// i32.
    I32,
    /// `struct AdamSegment` ([`ADAM_SEGMENT_BYTES`]).
    AdamSegment,
}

impl CudaElement {
    /// Bytes per element when the model dtype has `model_bytes` bytes.
    pub fn bytes(self, model_bytes: u64) -> u64 {
        match self {
            CudaElement::Model => model_bytes,
            CudaElement::F32 | CudaElement::U32 | CudaElement::I32 => 4,
            CudaElement::F64 => 8,
            CudaElement::AdamSegment => ADAM_SEGMENT_BYTES,
        }
    }
}

/// One named tensor of a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaTensor {
    /// Its name (the CPU model's where the tensor is the same one).
    pub name: String,
    /// The allocation it lives in.
    pub region: CudaRegion,
    /// Its shape, outermost dimension first.
    pub shape: Vec<u64>,
}

impl CudaTensor {
    /// Elements (saturating).
    pub fn elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// Every tensor of the step but the model states, region by region in allocation order and
/// within a region in layout order (see the [module documentation](self)), every block
/// keeping its working set.
pub fn cuda_tensors(shape: &CudaLayoutShape) -> Vec<CudaTensor> {
    gpt2_cuda_tensors(shape, Recompute::Nothing)
}

/// The name prefix of layer `l`'s working set: its own (`h.{l}`), or under
/// [`Recompute::EachLayer`] the one all layers share (`h.recomputed`, the CPU arena's name).
pub fn working_set_prefix(recompute: Recompute, l: u64) -> String {
    match recompute {
        Recompute::Nothing => format!("h.{l}"),
        Recompute::EachLayer => "h.recomputed".to_string(),
    }
}

/// The layers whose working set is pushed: every layer, or the first alone when all share
/// one (none without layers).
fn working_sets(recompute: Recompute, layers: u64) -> std::ops::Range<u64> {
    match recompute {
        Recompute::Nothing => 0..layers,
        Recompute::EachLayer => 0..layers.min(1),
    }
}

/// [`cuda_tensors`] with activation checkpointing: under [`Recompute::EachLayer`] forward
/// keeps each block's output (`h.{l}.residual3`) and all blocks share one working set
/// (`h.recomputed.*`, statistics included), which backward refills by re-running the block.
pub fn gpt2_cuda_tensors(shape: &CudaLayoutShape, recompute: Recompute) -> Vec<CudaTensor> {
    let (b, t, c) = (shape.batch, shape.seq_len, shape.hidden);
    let (nh, vp) = (shape.heads, padded_vocab(shape.vocab));
    let n = b.saturating_mul(t);
    let mut list = Vec::new();
    let mut push = |region: CudaRegion, name: String, dims: &[u64]| {
        list.push(CudaTensor {
            name,
            region,
            shape: dims.to_vec(),
        });
    };
    use CudaRegion as R;
    let (btc, bt) = ([b, t, c], [b, t]);
    push(R::Activations, "encoded".into(), &btc);
    for l in working_sets(recompute, shape.layers) {
        let prefix = working_set_prefix(recompute, l);
        let name = |what: &str| format!("{prefix}.{what}");
        push(R::Activations, name("ln1"), &btc);
        push(R::Stats, name("ln1_mean"), &bt);
        push(R::Stats, name("ln1_rstd"), &bt);
        push(R::Activations, name("qkv"), &[b, t, 3 * c]);
        push(R::Stats, name("lse"), &[b, nh, t]);
        for what in ["atty", "attproj", "residual2", "ln2"] {
            push(R::Activations, name(what), &btc);
        }
        push(R::Stats, name("ln2_mean"), &bt);
        push(R::Stats, name("ln2_rstd"), &bt);
        push(R::Activations, name("fch"), &[b, t, 4 * c]);
        push(R::Activations, name("fch_gelu"), &[b, t, 4 * c]);
        push(R::Activations, name("fcproj"), &btc);
        if recompute == Recompute::Nothing {
            push(R::Activations, name("residual3"), &btc);
        }
    }
    if recompute == Recompute::EachLayer {
        for l in 0..shape.layers {
            push(R::Activations, format!("h.{l}.residual3"), &btc);
        }
    }
    push(R::Activations, "lnf".into(), &btc);
    push(R::Stats, "lnf_mean".into(), &bt);
    push(R::Stats, "lnf_rstd".into(), &bt);
    push(R::Activations, "logits".into(), &[b, t, vp]);
    push(R::Stats, "losses".into(), &bt);
    push(R::Activations, "dresidual".into(), &btc);
    push(R::Activations, "dbtc".into(), &btc);
    push(R::Activations, "dbt4c".into(), &[b, t, 4 * c]);
    push(
        R::Scratch,
        "layernorm_partials".into(),
        &[n.div_ceil(LAYERNORM_BACKWARD_ROWS), 2, c],
    );
    push(
        R::Scratch,
        "bias_partials".into(),
        &[n.div_ceil(COLUMN_PARTIAL_ROWS), 4 * c],
    );
    push(R::Scratch, "attention_delta".into(), &[b, nh, t]);
    push_step_inputs(&mut push, n, shape.param_tensors);
    // Region order, tensor order kept within each region.
    list.sort_by_key(|tensor| tensor.region);
    list
}

/// Which projections of a Llama-family layer carry a bias (the bias backward's partials are
/// as wide as the widest of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaAttentionBias {
    /// None (Llama, Mistral).
    Absent,
    /// `q_proj`, `k_proj`, `v_proj` (Qwen2).
    Qkv,
    /// `q_proj`, `k_proj`, `v_proj` and `o_proj`.
    QkvO,
}

/// The dimensions of a Llama-family step's buffers: the GPT-2 ones ([`CudaLayoutShape`],
/// `heads` the query heads) plus grouped-query attention, the SwiGLU width and the biases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaCudaShape {
    /// What GPT-2 and the Llama family share.
    pub base: CudaLayoutShape,
    /// Key/value heads `KV` (divides `heads`).
    pub kv_heads: u64,
    /// Head width `hs`.
    pub head_dim: u64,
    /// SwiGLU inner width `I`.
    pub intermediate: u64,
    /// The projections with a bias.
    pub attention_bias: CudaAttentionBias,
    /// What forward keeps of each layer (activation checkpointing: [`Recompute::EachLayer`]).
    pub recompute: Recompute,
}

/// Every tensor of a Llama-family step but the model states (see the [module
/// documentation](self), Llama table), in allocation order. Activation names are the CPU
/// model's (`executor::model::llama::LlamaActivations`) where the tensor is the same one.
pub fn llama_cuda_tensors(shape: &LlamaCudaShape) -> Vec<CudaTensor> {
    let base = &shape.base;
    let (b, t, c) = (base.batch, base.seq_len, base.hidden);
    let (nh, vp, i) = (base.heads, padded_vocab(base.vocab), shape.intermediate);
    let hs = shape.head_dim;
    let (a, qkv) = (nh * hs, (nh + 2 * shape.kv_heads) * hs);
    let n = b.saturating_mul(t);
    let mut list = Vec::new();
    let mut push = |region: CudaRegion, name: String, dims: &[u64]| {
        list.push(CudaTensor {
            name,
            region,
            shape: dims.to_vec(),
        });
    };
    use CudaRegion as R;
    let (btc, bt) = ([b, t, c], [b, t]);
    push(R::Activations, "encoded".into(), &btc);
    push(R::Stats, "rope_cos".into(), &[t, hs / 2]);
    push(R::Stats, "rope_sin".into(), &[t, hs / 2]);
    for l in working_sets(shape.recompute, base.layers) {
        let prefix = working_set_prefix(shape.recompute, l);
        let name = |what: &str| format!("{prefix}.{what}");
        push(R::Activations, name("ln1"), &btc);
        push(R::Stats, name("ln1_rstd"), &bt);
        push(R::Activations, name("qkv"), &[b, t, qkv]);
        push(R::Stats, name("lse"), &[b, nh, t]);
        push(R::Activations, name("atty"), &[b, t, a]);
        push(R::Activations, name("residual2"), &btc);
        push(R::Activations, name("ln2"), &btc);
        push(R::Stats, name("ln2_rstd"), &bt);
        push(R::Activations, name("gate_up"), &[b, t, 2 * i]);
        push(R::Activations, name("swiglu"), &[b, t, i]);
        if shape.recompute == Recompute::Nothing {
            push(R::Activations, name("residual3"), &btc);
        }
    }
    if shape.recompute == Recompute::EachLayer {
        for l in 0..base.layers {
            push(R::Activations, format!("h.{l}.residual3"), &btc);
        }
    }
    push(R::Activations, "lnf".into(), &btc);
    push(R::Stats, "lnf_rstd".into(), &bt);
    push(R::Activations, "logits".into(), &[b, t, vp]);
    push(R::Stats, "losses".into(), &bt);
    push(R::Activations, "dresidual".into(), &btc);
    push(R::Activations, "dbtc".into(), &btc);
    push(R::Activations, "dwide".into(), &[b, t, qkv.max(2 * i)]);
    push(R::Activations, "dmid".into(), &[b, t, a.max(i)]);
    push(
        R::Scratch,
        "rmsnorm_partials".into(),
        &[n.div_ceil(LAYERNORM_BACKWARD_ROWS), c],
    );
    let bias_width = match shape.attention_bias {
        CudaAttentionBias::Absent => 0,
        CudaAttentionBias::Qkv => qkv,
        CudaAttentionBias::QkvO => qkv.max(c),
    };
    if bias_width > 0 {
        push(
            R::Scratch,
            "bias_partials".into(),
            &[n.div_ceil(COLUMN_PARTIAL_ROWS), bias_width],
        );
    }
    push(R::Scratch, "attention_delta".into(), &[b, nh, t]);
    push_step_inputs(&mut push, n, base.param_tensors);
    list.sort_by_key(|tensor| tensor.region);
    list
}

/// The batch, its token buckets and the optimizer step's tensors: the same for every family.
fn push_step_inputs(push: &mut impl FnMut(CudaRegion, String, &[u64]), n: u64, params: u64) {
    use CudaRegion as R;
    push(R::Tokens, "tokens".into(), &[n]);
    push(R::Targets, "targets".into(), &[n]);
    push(R::BucketTokens, "bucket_tokens".into(), &[n]);
    push(R::BucketStarts, "bucket_starts".into(), &[n + 1]);
    push(R::BucketRows, "bucket_rows".into(), &[n]);
    push(R::NormPartials, "norm_partials".into(), &[NORM_BLOCKS]);
    push(R::NormTotal, "norm_total".into(), &[1]);
    push(R::FoundInf, "found_inf".into(), &[1]);
    push(R::Segments, "segments".into(), &[params]);
}

/// Elements of `region` (the sum of its tensors).
pub fn region_elements(tensors: &[CudaTensor], region: CudaRegion) -> u64 {
    tensors
        .iter()
        .filter(|t| t.region == region)
        .map(CudaTensor::elements)
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_hold_the_documented_element_counts() {
        let shape = CudaLayoutShape {
            layers: 2,
            hidden: 8,
            heads: 2,
            vocab: 10,
            batch: 3,
            seq_len: 5,
            param_tensors: 28,
        };
        let tensors = cuda_tensors(&shape);
        let (l, c, nh, v, b, t) = (2, 8, 2, 10, 3, 5);
        let n = b * t;
        let nc = n * c;
        // V = 10 is padded to Vp = 64.
        let vp = padded_vocab(v);
        assert_eq!(vp, 64);
        assert_eq!(
            region_elements(&tensors, CudaRegion::Activations),
            nc * (18 * l + 8) + n * vp
        );
        let logits = tensors.iter().find(|t| t.name == "logits");
        assert_eq!(logits.map(|t| t.shape.clone()), Some(vec![b, t, vp]));
        assert_eq!(
            region_elements(&tensors, CudaRegion::Stats),
            n * (4 * l + 3) + b * nh * t * l
        );
        assert_eq!(
            region_elements(&tensors, CudaRegion::Scratch),
            // one LayerNorm block (15 rows <= 32), one bias chunk (15 <= 64)
            2 * c + 4 * c + b * nh * t
        );
        assert_eq!(region_elements(&tensors, CudaRegion::BucketStarts), n + 1);
        assert_eq!(region_elements(&tensors, CudaRegion::NormPartials), 1024);
        assert_eq!(region_elements(&tensors, CudaRegion::Segments), 28);
        // Regions come in allocation order, each tensor once.
        let regions: Vec<CudaRegion> = tensors.iter().map(|t| t.region).collect();
        assert!(regions.windows(2).all(|w| w[0] <= w[1]));
        let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), tensors.len());
    }

    #[test]
    fn the_logits_row_stride_is_the_vocabulary_rounded_up_to_64() {
        // GPT-2's 50,257 becomes nanoGPT's and llm.c's 50,304; multiples of 64 stay.
        assert_eq!(padded_vocab(50_257), 50_304);
        assert_eq!(padded_vocab(50_304), 50_304);
        assert_eq!(padded_vocab(32_000), 32_000);
        assert_eq!(padded_vocab(151_936), 151_936);
        assert_eq!(padded_vocab(1), 64);
        assert_eq!(padded_vocab(0), 0);
        // Every row starts 16-byte aligned in every model dtype.
        for bytes in [2, 4] {
            assert_eq!((padded_vocab(50_257) * bytes) % 16, 0);
        }
    }

    #[test]
    fn checkpointing_keeps_each_blocks_output_and_one_working_set() {
        let base = CudaLayoutShape {
            layers: 3,
            hidden: 8,
            heads: 2,
            vocab: 10,
            batch: 3,
            seq_len: 5,
            param_tensors: 40,
        };
        let (l, c, nh, b, t) = (3, 8, 2, 3, 5);
        let n = b * t;
        let full = gpt2_cuda_tensors(&base, Recompute::Nothing);
        let recomputing = gpt2_cuda_tensors(&base, Recompute::EachLayer);
        let activations = |list: &[CudaTensor]| region_elements(list, CudaRegion::Activations);
        let stats = |list: &[CudaTensor]| region_elements(list, CudaRegion::Stats);
        // A block's working set is 17 NC (residual3 aside); L - 1 of them go, L outputs stay.
        assert_eq!(
            activations(&full) - activations(&recomputing),
            (l - 1) * 17 * n * c
        );
        assert_eq!(
            stats(&full) - stats(&recomputing),
            (l - 1) * (4 * n + b * nh * t)
        );
        for l in 0..3 {
            assert!(
                recomputing
                    .iter()
                    .any(|t| t.name == format!("h.{l}.residual3"))
            );
        }
        assert!(recomputing.iter().any(|t| t.name == "h.recomputed.qkv"));
        assert!(!recomputing.iter().any(|t| t.name == "h.1.qkv"));

        let llama = |recompute| LlamaCudaShape {
            base,
            kv_heads: 1,
            head_dim: 4,
            intermediate: 12,
            attention_bias: CudaAttentionBias::Absent,
            recompute,
        };
        let (full, recomputing) = (
            llama_cuda_tensors(&llama(Recompute::Nothing)),
            llama_cuda_tensors(&llama(Recompute::EachLayer)),
        );
        let (a, qkv, i) = (8, 16, 12);
        assert_eq!(
            activations(&full) - activations(&recomputing),
            (l - 1) * n * (3 * c + qkv + a + 3 * i)
        );
        assert_eq!(
            stats(&full) - stats(&recomputing),
            (l - 1) * (2 * n + b * nh * t)
        );
    }

    #[test]
    fn llama_regions_hold_the_documented_element_counts() {
        let (l, c, nh, kv, hs, i, v, b, t) = (2u64, 8, 2, 1, 4, 12, 10, 3, 5);
        for (bias, bias_width) in [
            (CudaAttentionBias::Absent, 0),
            (CudaAttentionBias::Qkv, 16),
            (CudaAttentionBias::QkvO, 16),
        ] {
            let shape = LlamaCudaShape {
                base: CudaLayoutShape {
                    layers: l,
                    hidden: c,
                    heads: nh,
                    vocab: v,
                    batch: b,
                    seq_len: t,
                    param_tensors: 20,
                },
                kv_heads: kv,
                head_dim: hs,
                intermediate: i,
                attention_bias: bias,
                recompute: Recompute::Nothing,
            };
            let tensors = llama_cuda_tensors(&shape);
            let (n, a, qkv) = (b * t, nh * hs, (nh + 2 * kv) * hs);
            assert_eq!(
                region_elements(&tensors, CudaRegion::Activations),
                n * (4 * c + l * (4 * c + qkv + a + 3 * i) + qkv.max(2 * i) + a.max(i))
                    + n * padded_vocab(v)
            );
            assert_eq!(
                region_elements(&tensors, CudaRegion::Stats),
                t * hs + n * (2 * l + 2) + b * nh * t * l
            );
            assert_eq!(
                region_elements(&tensors, CudaRegion::Scratch),
                c + bias_width + b * nh * t
            );
            assert_eq!(region_elements(&tensors, CudaRegion::Segments), 20);
            // The losses close the statistics (the trainer reads them from the end).
            let last_stat = tensors
                .iter()
                .rfind(|t| t.region == CudaRegion::Stats)
                .map(|t| t.name.as_str());
            assert_eq!(last_stat, Some("losses"));
        }
    }
}
