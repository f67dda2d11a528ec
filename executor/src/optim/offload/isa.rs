//! The instruction sets the offload kernels are compiled for, and which of them this CPU runs.
//!
//! Every kernel does the same IEEE operations in the same order (no FMA contraction, which
//! Rust never does on its own), and every conversion is exact or rounds to nearest-even, so
//! the choice changes the speed only, never a bit of the result (tests compare them all).

use std::fmt;

/// A compiled variant of the offload kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, one element at a time (any target).
    Scalar,
    /// 256-bit AVX2 with F16C conversions.
    Avx2,
    /// 512-bit AVX-512F; the bf16 copy-out rounded with integer arithmetic.
    Avx512,
    /// AVX-512F with AVX512-BF16's `vcvtneps2bf16` for the bf16 copy-out (denormal inputs,
    /// which that instruction flushes to zero, are rounded with integer arithmetic instead).
    Avx512Bf16,
}

impl Isa {
    /// The fastest variant this CPU runs (checked at run time).
    pub fn best() -> Isa {
        Isa::all_available().last().copied().unwrap_or(Isa::Scalar)
    }

    /// Every variant this CPU runs, slowest first.
    pub fn all_available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Avx512Bf16]
            .into_iter()
            .filter(|isa| isa.is_available())
            .collect()
    }

    /// Whether this CPU runs the variant.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => {
                std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512bf16")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Elements per vector.
    pub fn lanes(self) -> usize {
        match self {
            Isa::Scalar => 1,
            Isa::Avx2 => 8,
            Isa::Avx512 | Isa::Avx512Bf16 => 16,
        }
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Bf16 => "avx512+bf16",
        })
    }
}
