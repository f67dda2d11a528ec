//! The dispatch of the offload step's element loop: the variant `isa` names, for each pairing
//! of gradient dtype and output dtype, and the weight-size branch made a constant. `kernel`
//! holds the arithmetic and the scalar loop, `kernel_x86` the vector loops; both sit below
//! this file.

use super::isa::Isa;
#[cfg(target_arch = "x86_64")]
use super::kernel::Bf16OutNative;
use super::kernel::{
    Bf16Grads, Bf16Out, F16Grads, F16Out, F32Grads, GradPtr, GradSource, Lanes, NoOut, OutPtr,
    OutSink, StatePtrs, scalar_loop,
};
use crate::optim::adam::StepScalars;

/// Runs `$body` with `$g` and `$o` bound to the typed gradient source and output sink of
/// `$lanes`, the bf16 sink being of type `$bf16` (integer or AVX512-BF16 rounding).
macro_rules! with_kinds {
    ($lanes:expr, $bf16:ident, |$g:ident, $o:ident| $body:expr) => {{
        let lanes = $lanes;
        macro_rules! out {
            ($gv:expr) => {{
                let $g = $gv;
                match lanes.out {
                    OutPtr::None => {
                        let $o = NoOut;
                        $body
                    }
                    OutPtr::Bf16(p) => {
                        let $o = $bf16(p);
                        $body
                    }
                    OutPtr::F16(p) => {
                        let $o = F16Out(p);
                        $body
                    }
                }
            }};
        }
        match lanes.grads {
            GradPtr::F32(p) => out!(F32Grads(p)),
            GradPtr::Bf16(p) => out!(Bf16Grads(p)),
            GradPtr::F16(p) => out!(F16Grads(p)),
        }
    }};
}

/// Updates every element of `lanes` with the `isa` variant.
///
/// # Safety
/// `lanes` describes valid, writable memory for `lanes.len` elements per pointer, `dst` equal
/// to `src` or disjoint from it, nothing else touching it meanwhile; `isa.is_available()`.
pub(crate) unsafe fn run(isa: Isa, lanes: &Lanes, s: &StepScalars, factor: f32) {
    let small = s.m_weight.abs() < 0.5;
    let (src, dst, len) = (lanes.src, lanes.dst, lanes.len);
    macro_rules! both_weights {
        ($f:ident, $g:expr, $o:expr) => {
            if small {
                $f::<_, _, true>(src, dst, $g, $o, len, s, factor)
            } else {
                $f::<_, _, false>(src, dst, $g, $o, len, s, factor)
            }
        };
    }
    // SAFETY: the caller's contract; each variant runs only where the CPU has it.
    unsafe {
        match isa {
            Isa::Scalar => with_kinds!(lanes, Bf16Out, |g, o| both_weights!(scalar_kernel, g, o)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => with_kinds!(lanes, Bf16Out, |g, o| {
                use super::kernel_x86::avx2;
                both_weights!(avx2, g, o)
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => with_kinds!(lanes, Bf16Out, |g, o| {
                use super::kernel_x86::avx512;
                both_weights!(avx512, g, o)
            }),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 => with_kinds!(lanes, Bf16OutNative, |g, o| {
                use super::kernel_x86::avx512_bf16;
                both_weights!(avx512_bf16, g, o)
            }),
            #[cfg(not(target_arch = "x86_64"))]
            _ => with_kinds!(lanes, Bf16Out, |g, o| both_weights!(scalar_kernel, g, o)),
        }
    }
}

/// The scalar variant.
///
/// # Safety
/// As [`scalar_loop`].
#[allow(clippy::too_many_arguments)]
unsafe fn scalar_kernel<G: GradSource, O: OutSink, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    len: usize,
    s: &StepScalars,
    factor: f32,
) {
    // SAFETY: the caller's contract.
    unsafe { scalar_loop::<G, O, SMALL_WEIGHT>(src, dst, g, o, 0..len, s, factor) }
}
