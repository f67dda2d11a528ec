//! The kernel registry: every kernel, where it lives, how it is launched and which CPU function
//! of `dsplan-executor` it must match.
//!
//! Entry points are `extern "C"` functions named `<kernel>_<dtype>` (attention adds the head
//! size: `<kernel>_hs64_<dtype>`; its grouped-query variants are kernels of their own,
//! `<kernel>_gqa`). Tests check that every entry point listed here is defined in
//! its file, that every `__global__` function of every file is listed here, that NVRTC compiles
//! each file and emits each entry point, and (on a GPU) that each kernel matches its CPU
//! reference.

use std::fmt;

use crate::launch::LaunchRule;
use crate::source::{
    ADAMW, ATTENTION, ATTENTION_TC, CAST, CLASSIFIER, CudaSource, ENCODER, GELU, LAYERNORM, REDUCE,
    RMSNORM, ROPE, SWIGLU, UNSCALE_NORM,
};

/// The element type a kernel stores its tensors in (arithmetic is f32, or f64 for norms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// IEEE double precision (partial sums of squares).
    F64,
}

impl Dtype {
    /// The suffix of entry points instantiated for this type (`f32`, `bf16`, `f16`, `f64`).
    pub const fn suffix(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F64 => "f64",
        }
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F64 => 8,
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

/// One kernel (a family of entry points sharing one template).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSpec {
    /// The kernel's name, the common prefix of its entry points.
    pub name: &'static str,
    /// The file defining it.
    pub source: &'static CudaSource,
    /// Every `extern "C" __global__` function of this kernel.
    pub entry_points: &'static [&'static str],
    /// How grid and block follow from the problem size.
    pub launch: LaunchRule,
    /// `#define`s of the file that the launch rule relies on, with the value the rule assumes.
    pub source_constants: &'static [(&'static str, i64)],
    /// The CPU functions (paths in `dsplan-executor`, or a crate) whose results it must match.
    pub cpu_reference: &'static [&'static str],
    /// The storage types it is instantiated for.
    pub dtypes: &'static [Dtype],
    /// What it fuses, and anything a caller must know.
    pub summary: &'static str,
}

/// Why an entry point could not be found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingEntryPoint {
    /// The kernel.
    pub kernel: &'static str,
    /// The entry point asked for.
    pub entry_point: String,
}

impl fmt::Display for MissingEntryPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel `{}` has no entry point `{}`",
            self.kernel, self.entry_point
        )
    }
}

impl std::error::Error for MissingEntryPoint {}

impl KernelSpec {
    /// The entry point for `dtype`: `<name>_<dtype>`.
    pub fn entry_point(&self, dtype: Dtype) -> Result<&'static str, MissingEntryPoint> {
        self.find(format!("{}_{}", self.name, dtype.suffix()))
    }

    /// The entry point for `dtype` and head size (attention kernels): `<name>_hs<hs>_<dtype>`.
    pub fn entry_point_for_head_dim(
        &self,
        dtype: Dtype,
        head_dim: usize,
    ) -> Result<&'static str, MissingEntryPoint> {
        self.find(format!("{}_hs{head_dim}_{}", self.name, dtype.suffix()))
    }

    fn find(&self, wanted: String) -> Result<&'static str, MissingEntryPoint> {
        self.entry_points
            .iter()
            .copied()
            .find(|e| *e == wanted)
            .ok_or(MissingEntryPoint {
                kernel: self.name,
                entry_point: wanted,
            })
    }
}

/// The registered kernel called `name`.
pub fn kernel(name: &str) -> Option<&'static KernelSpec> {
    KERNELS.iter().find(|k| k.name == name)
}

const STORAGE: &[Dtype] = &[Dtype::F32, Dtype::Bf16, Dtype::F16];
/// The tensor-core kernels' types (f32 keeps the scalar kernels).
const SIXTEEN_BIT: &[Dtype] = &[Dtype::Bf16, Dtype::F16];

/// Every kernel.
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec {
        name: "encoder_forward",
        source: &ENCODER,
        entry_points: &[
            "encoder_forward_f32",
            "encoder_forward_bf16",
            "encoder_forward_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("ENCODER_THREADS", 256)],
        cpu_reference: &["executor::model::encoder::encoder_forward"],
        dtypes: STORAGE,
        summary: "out = wte[token] + wpe[t]; one thread per element of (B*T, C)",
    },
    KernelSpec {
        name: "encoder_backward_wpe",
        source: &ENCODER,
        entry_points: &[
            "encoder_backward_wpe_f32",
            "encoder_backward_wpe_bf16",
            "encoder_backward_wpe_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("ENCODER_THREADS", 256)],
        cpu_reference: &["executor::model::encoder::encoder_backward"],
        dtypes: STORAGE,
        summary: "dwpe[t] += sum over the batch, in batch order; one thread per element of (T, C)",
    },
    KernelSpec {
        name: "encoder_backward_wte",
        source: &ENCODER,
        entry_points: &[
            "encoder_backward_wte_f32",
            "encoder_backward_wte_bf16",
            "encoder_backward_wte_f16",
        ],
        launch: LaunchRule::ColumnsByGroup { threads: 256 },
        source_constants: &[("ENCODER_THREADS", 256)],
        cpu_reference: &["executor::model::encoder::encoder_backward"],
        dtypes: STORAGE,
        summary: "dwte[token] += its rows in row order, deterministic; groups are the host-built \
                  token buckets (executor::cuda::encoder_buckets)",
    },
    KernelSpec {
        name: "layernorm_forward",
        source: &LAYERNORM,
        entry_points: &[
            "layernorm_forward_f32",
            "layernorm_forward_bf16",
            "layernorm_forward_f16",
        ],
        launch: LaunchRule::WarpPerRow { threads: 256 },
        source_constants: &[("LAYERNORM_THREADS", 256)],
        cpu_reference: &["executor::model::layernorm::layernorm_forward"],
        dtypes: STORAGE,
        summary: "LayerNorm of each row, saving f32 mean and rstd; one warp per row",
    },
    KernelSpec {
        name: "residual_layernorm_forward",
        source: &LAYERNORM,
        entry_points: &[
            "residual_layernorm_forward_f32",
            "residual_layernorm_forward_bf16",
            "residual_layernorm_forward_f16",
        ],
        launch: LaunchRule::WarpPerRow { threads: 256 },
        source_constants: &[("LAYERNORM_THREADS", 256)],
        cpu_reference: &[
            "executor::model::residual::residual_forward",
            "executor::model::layernorm::layernorm_forward",
        ],
        dtypes: STORAGE,
        summary: "residual = a + b and LayerNorm(residual) in one pass over the row",
    },
    KernelSpec {
        name: "layernorm_backward",
        source: &LAYERNORM,
        entry_points: &[
            "layernorm_backward_f32",
            "layernorm_backward_bf16",
            "layernorm_backward_f16",
        ],
        launch: LaunchRule::RowChunks {
            threads: 256,
            rows_per_block: 32,
        },
        source_constants: &[("LAYERNORM_THREADS", 256), ("LAYERNORM_BACKWARD_ROWS", 32)],
        cpu_reference: &["executor::model::layernorm::layernorm_backward"],
        dtypes: STORAGE,
        summary: "dinp += in one kernel with per-32-row partial (dweight, dbias) in f32 scratch \
                  (ceil(N/32), 2, C); add_partials finishes dweight and dbias",
    },
    KernelSpec {
        name: "column_partials",
        source: &REDUCE,
        entry_points: &[
            "column_partials_f32",
            "column_partials_bf16",
            "column_partials_f16",
        ],
        launch: LaunchRule::ColumnsByRowChunks {
            threads: 256,
            rows_per_chunk: 64,
        },
        source_constants: &[("REDUCE_THREADS", 256), ("COLUMN_PARTIAL_ROWS", 64)],
        cpu_reference: &["executor::model::matmul::add_column_sums"],
        dtypes: STORAGE,
        summary: "f32 column sums of 64-row chunks (bias gradients, first step)",
    },
    KernelSpec {
        name: "add_partials",
        source: &REDUCE,
        entry_points: &["add_partials_f32", "add_partials_bf16", "add_partials_f16"],
        launch: LaunchRule::Columns { threads: 256 },
        source_constants: &[("REDUCE_THREADS", 256)],
        cpu_reference: &[
            "executor::model::matmul::add_column_sums",
            "executor::model::layernorm::layernorm_backward",
        ],
        dtypes: STORAGE,
        summary: "acc += partials in chunk order (bias and LayerNorm parameter gradients, \
                  second step)",
    },
    KernelSpec {
        name: "accumulate",
        source: &REDUCE,
        entry_points: &["accumulate_f32", "accumulate_bf16", "accumulate_f16"],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("REDUCE_THREADS", 256)],
        cpu_reference: &["executor::model::residual::accumulate"],
        dtypes: STORAGE,
        summary: "dst += src element-wise (a reduced gradient bucket added into a rank's \
                  gradient partition)",
    },
    KernelSpec {
        name: "gelu_forward",
        source: &GELU,
        entry_points: &["gelu_forward_f32", "gelu_forward_bf16", "gelu_forward_f16"],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("GELU_THREADS", 256)],
        cpu_reference: &["executor::model::gelu::gelu_forward"],
        dtypes: STORAGE,
        summary: "GELU (tanh approximation) element-wise",
    },
    KernelSpec {
        name: "bias_gelu_forward",
        source: &GELU,
        entry_points: &[
            "bias_gelu_forward_f32",
            "bias_gelu_forward_bf16",
            "bias_gelu_forward_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("GELU_THREADS", 256)],
        cpu_reference: &[
            "executor::model::matmul::matmul_forward",
            "executor::model::gelu::gelu_forward",
        ],
        dtypes: STORAGE,
        summary: "pre += bias (kept for backward) and out = gelu(pre) in one pass",
    },
    KernelSpec {
        name: "gelu_backward_inplace",
        source: &GELU,
        entry_points: &[
            "gelu_backward_inplace_f32",
            "gelu_backward_inplace_bf16",
            "gelu_backward_inplace_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("GELU_THREADS", 256)],
        cpu_reference: &["executor::model::gelu::gelu_backward_inplace"],
        dtypes: STORAGE,
        summary: "d *= gelu'(inp), in place",
    },
    KernelSpec {
        name: "attention_forward",
        source: &ATTENTION,
        entry_points: &[
            "attention_forward_hs64_f32",
            "attention_forward_hs64_bf16",
            "attention_forward_hs64_f16",
            "attention_forward_hs128_f32",
            "attention_forward_hs128_bf16",
            "attention_forward_hs128_f16",
        ],
        launch: LaunchRule::AttentionQueries { threads: 64 },
        source_constants: &[("ATTENTION_QUERY_BLOCK", 64), ("ATTENTION_KEY_TILE", 32)],
        cpu_reference: &["executor::model::attention::attention_forward"],
        dtypes: STORAGE,
        summary: "causal attention with online softmax; saves f32 logsumexp (B, NH, T), no \
                  T x T matrix; head sizes 64 and 128",
    },
    KernelSpec {
        name: "attention_backward_preprocess",
        source: &ATTENTION,
        entry_points: &[
            "attention_backward_preprocess_f32",
            "attention_backward_preprocess_bf16",
            "attention_backward_preprocess_f16",
        ],
        launch: LaunchRule::WarpPerRow { threads: 256 },
        source_constants: &[("ATTENTION_PREPROCESS_THREADS", 256)],
        cpu_reference: &["executor::model::attention::attention_backward"],
        dtypes: STORAGE,
        summary: "delta = rowsum(dout * out) per (b, h, t), one warp each (rows = B*NH*T)",
    },
    KernelSpec {
        name: "attention_backward_dkdv",
        source: &ATTENTION,
        entry_points: &[
            "attention_backward_dkdv_hs64_f32",
            "attention_backward_dkdv_hs64_bf16",
            "attention_backward_dkdv_hs64_f16",
            "attention_backward_dkdv_hs128_f32",
            "attention_backward_dkdv_hs128_bf16",
            "attention_backward_dkdv_hs128_f16",
        ],
        launch: LaunchRule::AttentionKeys {
            threads_times_head_dim: 4096,
        },
        source_constants: &[],
        cpu_reference: &["executor::model::attention::attention_backward"],
        dtypes: STORAGE,
        summary: "dk, dv per key row, probabilities recomputed from lse; 64 keys per block for \
                  hs 64, 32 for hs 128 (the template arguments in attention.cu)",
    },
    KernelSpec {
        name: "attention_backward_dq",
        source: &ATTENTION,
        entry_points: &[
            "attention_backward_dq_hs64_f32",
            "attention_backward_dq_hs64_bf16",
            "attention_backward_dq_hs64_f16",
            "attention_backward_dq_hs128_f32",
            "attention_backward_dq_hs128_bf16",
            "attention_backward_dq_hs128_f16",
        ],
        launch: LaunchRule::AttentionQueries { threads: 64 },
        source_constants: &[("ATTENTION_QUERY_BLOCK", 64), ("ATTENTION_KEY_TILE", 32)],
        cpu_reference: &["executor::model::attention::attention_backward"],
        dtypes: STORAGE,
        summary: "dq per query row, probabilities recomputed from lse; no atomics",
    },
    KernelSpec {
        name: "attention_forward_gqa",
        source: &ATTENTION,
        entry_points: &[
            "attention_forward_gqa_hs64_f32",
            "attention_forward_gqa_hs64_bf16",
            "attention_forward_gqa_hs64_f16",
            "attention_forward_gqa_hs128_f32",
            "attention_forward_gqa_hs128_bf16",
            "attention_forward_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionQueries { threads: 64 },
        source_constants: &[("ATTENTION_QUERY_BLOCK", 64), ("ATTENTION_KEY_TILE", 32)],
        cpu_reference: &["executor::model::attention::grouped_attention_forward"],
        dtypes: STORAGE,
        summary: "attention_forward with KV key/value heads (grouped-query attention): qkv rows \
                  [q (NH*hs) | k (KV*hs) | v (KV*hs)], query head h reads kv head h / (NH/KV); \
                  grid (ceil(T / 64), NH, B)",
    },
    KernelSpec {
        name: "attention_backward_dkdv_gqa",
        source: &ATTENTION,
        entry_points: &[
            "attention_backward_dkdv_gqa_hs64_f32",
            "attention_backward_dkdv_gqa_hs64_bf16",
            "attention_backward_dkdv_gqa_hs64_f16",
            "attention_backward_dkdv_gqa_hs128_f32",
            "attention_backward_dkdv_gqa_hs128_bf16",
            "attention_backward_dkdv_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionKeys {
            threads_times_head_dim: 4096,
        },
        source_constants: &[],
        cpu_reference: &["executor::model::attention::grouped_attention_backward"],
        dtypes: STORAGE,
        summary: "dk, dv of each key/value head summed over its group's query heads in order, in \
                  one block (no atomics); launched with Work::Attention { heads: KV }, so the \
                  grid is (ceil(T / keys), KV, B)",
    },
    KernelSpec {
        name: "attention_backward_dq_gqa",
        source: &ATTENTION,
        entry_points: &[
            "attention_backward_dq_gqa_hs64_f32",
            "attention_backward_dq_gqa_hs64_bf16",
            "attention_backward_dq_gqa_hs64_f16",
            "attention_backward_dq_gqa_hs128_f32",
            "attention_backward_dq_gqa_hs128_bf16",
            "attention_backward_dq_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionQueries { threads: 64 },
        source_constants: &[("ATTENTION_QUERY_BLOCK", 64), ("ATTENTION_KEY_TILE", 32)],
        cpu_reference: &["executor::model::attention::grouped_attention_backward"],
        dtypes: STORAGE,
        summary: "dq per query row of the grouped-query layout; no atomics",
    },
    KernelSpec {
        name: "attention_tc_forward",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_forward_hs64_bf16",
            "attention_tc_forward_hs64_f16",
            "attention_tc_forward_hs128_bf16",
            "attention_tc_forward_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 8192,
            max_rows: 64,
        },
        source_constants: &[
            ("ATTENTION_TC_QUERY_BLOCK", 64),
            ("ATTENTION_TC_KEY_TILE", 64),
        ],
        cpu_reference: &["executor::model::attention::attention_forward"],
        dtypes: SIXTEEN_BIT,
        summary: "attention_forward on tensor cores (mma.sync m16n8k16, f32 accumulators): 64 queries \
                  (4 warps of 16) per block, key tiles of 64; bf16 and f16 only",
    },
    KernelSpec {
        name: "attention_tc_backward_dkdv",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_backward_dkdv_hs64_bf16",
            "attention_tc_backward_dkdv_hs64_f16",
            "attention_tc_backward_dkdv_hs128_bf16",
            "attention_tc_backward_dkdv_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 4096,
            max_rows: 64,
        },
        source_constants: &[],
        cpu_reference: &["executor::model::attention::attention_backward"],
        dtypes: SIXTEEN_BIT,
        summary: "dk, dv on tensor cores: 64 keys (4 warps) per block at hs 64, 32 (2 warps) at hs 128 \
                  (the template arguments in attention_tc.cu); delta from \
                  attention_backward_preprocess",
    },
    KernelSpec {
        name: "attention_tc_backward_dq",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_backward_dq_hs64_bf16",
            "attention_tc_backward_dq_hs64_f16",
            "attention_tc_backward_dq_hs128_bf16",
            "attention_tc_backward_dq_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 8192,
            max_rows: 64,
        },
        source_constants: &[("ATTENTION_TC_QUERY_BLOCK", 64)],
        cpu_reference: &["executor::model::attention::attention_backward"],
        dtypes: SIXTEEN_BIT,
        summary: "dq on tensor cores: 64 queries (4 warps) per block; no atomics",
    },
    KernelSpec {
        name: "attention_tc_forward_gqa",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_forward_gqa_hs64_bf16",
            "attention_tc_forward_gqa_hs64_f16",
            "attention_tc_forward_gqa_hs128_bf16",
            "attention_tc_forward_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 8192,
            max_rows: 64,
        },
        source_constants: &[
            ("ATTENTION_TC_QUERY_BLOCK", 64),
            ("ATTENTION_TC_KEY_TILE", 64),
        ],
        cpu_reference: &["executor::model::attention::grouped_attention_forward"],
        dtypes: SIXTEEN_BIT,
        summary: "attention_tc_forward with KV key/value heads (the layout of attention_forward_gqa)",
    },
    KernelSpec {
        name: "attention_tc_backward_dkdv_gqa",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_backward_dkdv_gqa_hs64_bf16",
            "attention_tc_backward_dkdv_gqa_hs64_f16",
            "attention_tc_backward_dkdv_gqa_hs128_bf16",
            "attention_tc_backward_dkdv_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 4096,
            max_rows: 64,
        },
        source_constants: &[],
        cpu_reference: &["executor::model::attention::grouped_attention_backward"],
        dtypes: SIXTEEN_BIT,
        summary: "attention_tc_backward_dkdv summed over each key/value head's group of query heads in \
                  order; grid (ceil(T / keys), KV, B)",
    },
    KernelSpec {
        name: "attention_tc_backward_dq_gqa",
        source: &ATTENTION_TC,
        entry_points: &[
            "attention_tc_backward_dq_gqa_hs64_bf16",
            "attention_tc_backward_dq_gqa_hs64_f16",
            "attention_tc_backward_dq_gqa_hs128_bf16",
            "attention_tc_backward_dq_gqa_hs128_f16",
        ],
        launch: LaunchRule::AttentionWarpRows {
            rows_times_head_dim: 8192,
            max_rows: 64,
        },
        source_constants: &[("ATTENTION_TC_QUERY_BLOCK", 64)],
        cpu_reference: &["executor::model::attention::grouped_attention_backward"],
        dtypes: SIXTEEN_BIT,
        summary: "attention_tc_backward_dq of the grouped-query layout; no atomics",
    },
    KernelSpec {
        name: "fused_classifier",
        source: &CLASSIFIER,
        entry_points: &[
            "fused_classifier_f32",
            "fused_classifier_bf16",
            "fused_classifier_f16",
        ],
        launch: LaunchRule::BlockPerRow { threads: 512 },
        source_constants: &[("CLASSIFIER_THREADS", 512)],
        cpu_reference: &["executor::model::classifier::crossentropy_forward_backward"],
        dtypes: STORAGE,
        summary: "softmax, cross-entropy loss and dlogits (in place) in one pass; target -1 = \
                  no target",
    },
    KernelSpec {
        name: "cast",
        source: &CAST,
        entry_points: &[
            "cast_f32_to_bf16",
            "cast_f32_to_f16",
            "cast_bf16_to_f32",
            "cast_f16_to_f32",
        ],
        launch: LaunchRule::GridStride {
            threads: 256,
            max_blocks: 65_535,
        },
        source_constants: &[("CAST_THREADS", 256)],
        cpu_reference: &[
            "half::slice::HalfFloatSliceExt::convert_from_f32_slice",
            "half::slice::HalfFloatSliceExt::convert_to_f32_slice",
        ],
        dtypes: &[Dtype::F32, Dtype::Bf16, Dtype::F16],
        summary: "f32 <-> bf16/f16, round to nearest even",
    },
    KernelSpec {
        name: "unscale_norm_partials",
        source: &UNSCALE_NORM,
        entry_points: &[
            "unscale_norm_partials_f32",
            "unscale_norm_partials_bf16",
            "unscale_norm_partials_f16",
        ],
        launch: LaunchRule::FixedGrid {
            threads: 512,
            blocks: 1024,
        },
        source_constants: &[("NORM_THREADS", 512), ("NORM_BLOCKS", 1024)],
        cpu_reference: &["executor::optim::clip::sum_of_squares"],
        dtypes: STORAGE,
        summary: "g *= 1/loss_scale, inf/NaN flag and f64 sum-of-squares partials in one pass",
    },
    KernelSpec {
        name: "sum_partials",
        source: &UNSCALE_NORM,
        entry_points: &["sum_partials_f64"],
        launch: LaunchRule::SingleBlock { threads: 512 },
        source_constants: &[],
        cpu_reference: &["executor::optim::clip::sum_of_squares"],
        dtypes: &[Dtype::F64],
        summary: "the f64 total of unscale_norm_partials' partials, one block, fixed order",
    },
    KernelSpec {
        name: "adamw",
        source: &ADAMW,
        entry_points: &["adamw_f32", "adamw_bf16", "adamw_f16"],
        launch: LaunchRule::Segments {
            threads: 256,
            blocks_per_segment: 128,
        },
        source_constants: &[("ADAMW_THREADS", 256), ("ADAMW_BLOCKS_PER_SEGMENT", 128)],
        cpu_reference: &["executor::optim::adam::adam_step"],
        dtypes: STORAGE,
        summary: "multi-tensor Adam/AdamW over segments of flat buffers: f32 master weights and \
                  moments updated, 16-bit copy written in the same pass; grads scaled first",
    },
    KernelSpec {
        name: "rmsnorm_forward",
        source: &RMSNORM,
        entry_points: &[
            "rmsnorm_forward_f32",
            "rmsnorm_forward_bf16",
            "rmsnorm_forward_f16",
        ],
        launch: LaunchRule::WarpPerRow { threads: 256 },
        source_constants: &[("RMSNORM_THREADS", 256)],
        cpu_reference: &["executor::model::rmsnorm::rmsnorm_forward"],
        dtypes: STORAGE,
        summary: "RMSNorm of each row in f32 (as transformers), saving f32 rstd; the normalised \
                  row is rounded to the storage type before the weight multiplies; one warp per row",
    },
    KernelSpec {
        name: "rmsnorm_backward",
        source: &RMSNORM,
        entry_points: &[
            "rmsnorm_backward_f32",
            "rmsnorm_backward_bf16",
            "rmsnorm_backward_f16",
        ],
        launch: LaunchRule::RowChunks {
            threads: 256,
            rows_per_block: 32,
        },
        source_constants: &[("RMSNORM_THREADS", 256), ("RMSNORM_BACKWARD_ROWS", 32)],
        cpu_reference: &["executor::model::rmsnorm::rmsnorm_backward"],
        dtypes: STORAGE,
        summary: "dinp += in one kernel with per-32-row partial dweight in f32 scratch \
                  (ceil(N/32), C); add_partials finishes dweight in chunk order, as the CPU",
    },
    KernelSpec {
        name: "rope_forward",
        source: &ROPE,
        entry_points: &["rope_forward_f32", "rope_forward_bf16", "rope_forward_f16"],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("ROPE_THREADS", 256)],
        cpu_reference: &["executor::model::rope::rope_forward"],
        dtypes: STORAGE,
        summary: "rotate-half RoPE in place on the q and k heads of [q | k | v] rows, from the \
                  host's f32 cos/sin table (T, hs/2) (rope_theta and rope_scaling applied there); \
                  one thread per (row, head, pair)",
    },
    KernelSpec {
        name: "rope_backward",
        source: &ROPE,
        entry_points: &[
            "rope_backward_f32",
            "rope_backward_bf16",
            "rope_backward_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("ROPE_THREADS", 256)],
        cpu_reference: &["executor::model::rope::rope_backward"],
        dtypes: STORAGE,
        summary: "the rotation by the opposite angle, in place on dq and dk",
    },
    KernelSpec {
        name: "swiglu_forward",
        source: &SWIGLU,
        entry_points: &[
            "swiglu_forward_f32",
            "swiglu_forward_bf16",
            "swiglu_forward_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("SWIGLU_THREADS", 256)],
        cpu_reference: &["executor::model::swiglu::swiglu_forward"],
        dtypes: STORAGE,
        summary: "h = silu(gate) * up from [gate | up] rows; one thread per element of (N, I)",
    },
    KernelSpec {
        name: "swiglu_backward",
        source: &SWIGLU,
        entry_points: &[
            "swiglu_backward_f32",
            "swiglu_backward_bf16",
            "swiglu_backward_f16",
        ],
        launch: LaunchRule::PerElement { threads: 256 },
        source_constants: &[("SWIGLU_THREADS", 256)],
        cpu_reference: &["executor::model::swiglu::swiglu_backward"],
        dtypes: STORAGE,
        summary: "[dgate | dup] written from dh and [gate | up]; one thread per element of (N, I)",
    },
];
