//! [`AttentionKernel`]: which CUDA attention kernels a run launches, chosen per run
//! (`dsplan run --attention-kernel`) and carried by the settings into the device step.

use std::fmt;

/// The CUDA attention implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionKernel {
    /// `attention.cu`: scalar f32 arithmetic, every storage type; checked on an H200.
    #[default]
    Scalar,
    /// `attention_tc.cu`: flash attention on tensor cores (`mma.sync`), bf16 and f16 only;
    /// checked on an H100 and an H200 (2026-11-27). `dsplan run` picks it for 16-bit GPU runs
    /// unless `--attention-kernel scalar` says otherwise; the library's default stays scalar,
    /// which every precision can run.
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
