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
//! | activations | model dtype | `encoded`; per block `ln1`, `qkv` (`3C`), `atty`, `attproj`, `residual2`, `ln2`, `fch`, `fch_gelu` (`4C`), `fcproj`, `residual3`; `lnf`, `logits` (`V`); `dresidual`, `dbtc`, `dbt4c` (`4C`) | `NC·(18L + 8) + NV` |
//! | stats | f32 | per block `ln1_mean`, `ln1_rstd`, `lse` `(B, NH, T)`, `ln2_mean`, `ln2_rstd`; `lnf_mean`, `lnf_rstd`, `losses` | `N·(4L + 3) + B·NH·T·L` |
//! | scratch | f32 | `layernorm_partials` `⌈N/32⌉·2·C`, `bias_partials` `⌈N/64⌉·4C`, `attention_delta` `(B, NH, T)` | `2C·⌈N/32⌉ + 4C·⌈N/64⌉ + B·NH·T` |
//! | tokens, targets | u32, i32 | the micro-batch's ids and targets | `N` each |
//! | bucket tokens, bucket starts, bucket rows | u32, i32, i32 | the embedding backward's token buckets | `N`, `N + 1`, `N` |
//! | norm partials, norm total | f64 | the gradient norm's per-block sums and their total | `1024`, `1` |
//! | found inf | i32 | the overflow flag | `1` |
//! | segments | Adam segment (24 bytes) | the fused AdamW's table, one per parameter tensor | `P` |
//!
//! There is no `(B, NH, T, T)` attention matrix (flash attention keeps the log-sum-exp) and no
//! fp32 copy of the logits (the classifier kernel computes the loss and writes the gradient in
//! place).

/// Rows per block of the LayerNorm backward kernel (its `LAYERNORM_BACKWARD_ROWS`).
pub const LAYERNORM_BACKWARD_ROWS: u64 = 32;
/// Rows per chunk of the bias backward's column partials (its `COLUMN_PARTIAL_ROWS`).
pub const COLUMN_PARTIAL_ROWS: u64 = 64;
/// Blocks of the gradient norm's partial sums (`unscale_norm_partials`' `NORM_BLOCKS`).
pub const NORM_BLOCKS: u64 = 1024;
/// Bytes of one entry of the fused AdamW's segment table (`struct AdamSegment`).
pub const ADAM_SEGMENT_BYTES: u64 = 24;

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
/// within a region in layout order (see the [module documentation](self)).
pub fn cuda_tensors(shape: &CudaLayoutShape) -> Vec<CudaTensor> {
    let (b, t, c) = (shape.batch, shape.seq_len, shape.hidden);
    let (nh, v) = (shape.heads, shape.vocab);
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
    for l in 0..shape.layers {
        let name = |what: &str| format!("h.{l}.{what}");
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
        push(R::Activations, name("residual3"), &btc);
    }
    push(R::Activations, "lnf".into(), &btc);
    push(R::Stats, "lnf_mean".into(), &bt);
    push(R::Stats, "lnf_rstd".into(), &bt);
    push(R::Activations, "logits".into(), &[b, t, v]);
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
    push(R::Tokens, "tokens".into(), &[n]);
    push(R::Targets, "targets".into(), &[n]);
    push(R::BucketTokens, "bucket_tokens".into(), &[n]);
    push(R::BucketStarts, "bucket_starts".into(), &[n + 1]);
    push(R::BucketRows, "bucket_rows".into(), &[n]);
    push(R::NormPartials, "norm_partials".into(), &[NORM_BLOCKS]);
    push(R::NormTotal, "norm_total".into(), &[1]);
    push(R::FoundInf, "found_inf".into(), &[1]);
    push(R::Segments, "segments".into(), &[shape.param_tensors]);
    // Region order, tensor order kept within each region.
    list.sort_by_key(|tensor| tensor.region);
    list
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
        assert_eq!(
            region_elements(&tensors, CudaRegion::Activations),
            nc * (18 * l + 8) + n * v
        );
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
}
