//! [`AttentionKernel`]: which CUDA attention kernels a run launches, chosen per run
//! (`dsplan run --attention-kernel`) and carried by the settings into the device step.

use std::fmt;

/// The CUDA attention implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// `attention.cu`: scalar f32 arithmetic, every storage type; checked on an H200.
    #[default]
    Scalar,
    /// `attention_tc.cu`: flash attention on tensor cores (`mma.sync`), bf16 and f16 only.
    /// Opt-in until a GPU session's `dsplan report --check` passes it.
    TensorCore,
}

impl AttentionKernel {
    /// The name `--attention-kernel` takes and reports print.
    pub const fn name(self) -> &'static str {
        match self {
            AttentionKernel::Scalar => "scalar",
            AttentionKernel::TensorCore => "tensor-core",
        }
    }
}

impl fmt::Display for AttentionKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
