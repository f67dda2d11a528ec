//! The CUDA C sources, embedded in the binary.
//!
//! Each file is compiled on its own, as one NVRTC program: the [`PRELUDE`] (storage types,
//! conversions, warp and block reductions) followed by the file, with a `#line` directive so
//! compiler messages name the file and line the author sees.

/// One `.cu` file of `kernels/cu/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaSource {
    /// The file name, e.g. `layernorm.cu`.
    pub file_name: &'static str,
    /// The file's text.
    pub text: &'static str,
}

impl CudaSource {
    /// The text NVRTC compiles: the prelude, then this file under its own name and line numbers.
    pub fn program_text(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file_name, self.text)
    }

    /// The source with this file name, if there is one.
    pub fn named(file_name: &str) -> Option<&'static CudaSource> {
        SOURCES.iter().find(|s| s.file_name == file_name)
    }
}

/// `common.cuh`: compiled in front of every file.
pub const PRELUDE: &str = include_str!("../cu/common.cuh");

macro_rules! cuda_source {
    ($name:literal) => {
        CudaSource {
            file_name: $name,
            text: include_str!(concat!("../cu/", $name)),
        }
    };
}

/// Token and position embeddings.
pub const ENCODER: CudaSource = cuda_source!("encoder.cu");
/// LayerNorm forward/backward and the residual add fused with it.
pub const LAYERNORM: CudaSource = cuda_source!("layernorm.cu");
/// Deterministic column sums (bias and LayerNorm parameter gradients).
pub const REDUCE: CudaSource = cuda_source!("reduce.cu");
/// GELU and bias + GELU.
pub const GELU: CudaSource = cuda_source!("gelu.cu");
/// Flash-style causal attention (multi-head and grouped-query).
pub const ATTENTION: CudaSource = cuda_source!("attention.cu");
/// Flash attention on tensor cores (bf16/f16; multi-head and grouped-query).
pub const ATTENTION_TC: CudaSource = cuda_source!("attention_tc.cu");
/// Fused softmax + cross-entropy + gradient.
pub const CLASSIFIER: CudaSource = cuda_source!("classifier.cu");
/// f32 <-> bf16/f16 casts.
pub const CAST: CudaSource = cuda_source!("cast.cu");
/// Unscale + inf/NaN check + squared norm.
pub const UNSCALE_NORM: CudaSource = cuda_source!("unscale_norm.cu");
/// Multi-tensor fused AdamW.
pub const ADAMW: CudaSource = cuda_source!("adamw.cu");
/// RMSNorm forward/backward (the Llama family).
pub const RMSNORM: CudaSource = cuda_source!("rmsnorm.cu");
/// Rotary position embeddings on the q/k heads, in place (the Llama family).
pub const ROPE: CudaSource = cuda_source!("rope.cu");
/// SwiGLU forward/backward (the Llama family's MLP).
pub const SWIGLU: CudaSource = cuda_source!("swiglu.cu");

/// Every kernel file, in the order the registry lists them.
pub const SOURCES: &[CudaSource] = &[
    ENCODER,
    LAYERNORM,
    REDUCE,
    GELU,
    ATTENTION,
    ATTENTION_TC,
    CLASSIFIER,
    CAST,
    UNSCALE_NORM,
    ADAMW,
    RMSNORM,
    ROPE,
    SWIGLU,
];
