//! The offload step's vector variants for x86-64: AVX2 (8 lanes) and AVX-512 (16 lanes, with
//! or without AVX512-BF16 for the bf16 copy-out). Each does `kernel::element`'s operations in
//! its order with IEEE vector instructions (no FMA), and finishes the tail with the scalar
//! loop, so every variant gives the scalar variant's bits.
//!
//! Conversions: bf16 → f32 is a 16-bit shift; fp16 → f32 is `vcvtph2ps` (exact); f32 → fp16
//! is `vcvtps2ph` with round-to-nearest-even (what `half::f16::from_f32` runs on such CPUs);
//! f32 → bf16 is the integer round-to-nearest-even `(x + 0x7fff + lsb) >> 16` with NaNs kept
//! quiet (`half::bf16::from_f32`'s rule), or `vcvtneps2bf16`, which rounds the same way but
//! treats denormal inputs as zero: a vector holding one is rounded the integer way instead.

use std::arch::x86_64::*;

use super::kernel::{
    Bf16Grads, Bf16Out, Bf16OutNative, F16Grads, F16Out, F32Grads, GradSource, NoOut, OutSink,
    StatePtrs, scalar_loop,
};
use crate::optim::adam::StepScalars;

/// Gradients loaded 8 at a time.
pub(crate) trait Grad256: GradSource {
    /// Elements `i..i + 8`, widened.
    ///
    /// # Safety
    /// In bounds; the CPU has AVX2 and F16C.
    unsafe fn v256(self, i: usize) -> __m256;
}

/// Gradients loaded 16 at a time.
pub(crate) trait Grad512: GradSource {
    /// Elements `i..i + 16`, widened.
    ///
    /// # Safety
    /// In bounds; the CPU has AVX-512F.
    unsafe fn v512(self, i: usize) -> __m512;
}

/// 16-bit parameters stored 8 at a time.
pub(crate) trait Out256: OutSink {
    /// Stores elements `i..i + 8`.
    ///
    /// # Safety
    /// In bounds; the CPU has AVX2 and F16C.
    unsafe fn v256(self, i: usize, x: __m256);
}

/// 16-bit parameters stored 16 at a time.
pub(crate) trait Out512: OutSink {
    /// Stores elements `i..i + 16`.
    ///
    /// # Safety
    /// In bounds; the CPU has AVX-512F (and AVX512-BF16 for [`Bf16OutNative`]).
    unsafe fn v512(self, i: usize, x: __m512);
}

impl Grad256 for F32Grads {
    #[inline(always)]
    unsafe fn v256(self, i: usize) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(self.0.add(i)) }
    }
}

impl Grad256 for Bf16Grads {
    #[inline(always)]
    unsafe fn v256(self, i: usize) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe {
            let bits = _mm_loadu_si128(self.0.add(i).cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
        }
    }
}

impl Grad256 for F16Grads {
    #[inline(always)]
    unsafe fn v256(self, i: usize) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.0.add(i).cast())) }
    }
}

impl Grad512 for F32Grads {
    #[inline(always)]
    unsafe fn v512(self, i: usize) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_loadu_ps(self.0.add(i)) }
    }
}

impl Grad512 for Bf16Grads {
    #[inline(always)]
    unsafe fn v512(self, i: usize) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe {
            let bits = _mm256_loadu_si256(self.0.add(i).cast());
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
        }
    }
}

impl Grad512 for F16Grads {
    #[inline(always)]
    unsafe fn v512(self, i: usize) -> __m512 {
        // SAFETY: the caller's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.0.add(i).cast())) }
    }
}

impl Out256 for NoOut {
    #[inline(always)]
    unsafe fn v256(self, _i: usize, _x: __m256) {}
}

impl Out512 for NoOut {
    #[inline(always)]
    unsafe fn v512(self, _i: usize, _x: __m512) {}
}

/// Round-to-nearest-even bf16 bits of 8 floats, in 32-bit lanes.
#[inline(always)]
unsafe fn bf16_bits_256(x: __m256) -> __m256i {
    // SAFETY: register arithmetic only (the caller runs with AVX2).
    unsafe {
        let bits = _mm256_castps_si256(x);
        let high = _mm256_srli_epi32::<16>(bits);
        let lsb = _mm256_and_si256(high, _mm256_set1_epi32(1));
        let biased = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb);
        let rounded = _mm256_srli_epi32::<16>(biased);
        let quiet_nan = _mm256_or_si256(high, _mm256_set1_epi32(0x40));
        let is_nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        _mm256_blendv_epi8(rounded, quiet_nan, is_nan)
    }
}

impl Out256 for Bf16Out {
    #[inline(always)]
    unsafe fn v256(self, i: usize, x: __m256) {
        // SAFETY: the caller's contract.
        unsafe {
            let lanes32 = bf16_bits_256(x);
            // Each 128-bit half packs to 4 words twice; keep quad-words 0 and 2.
            let packed = _mm256_packus_epi32(lanes32, lanes32);
            let ordered = _mm256_permute4x64_epi64::<0b1000>(packed);
            _mm_storeu_si128(self.0.add(i).cast(), _mm256_castsi256_si128(ordered));
        }
    }
}

impl Out256 for F16Out {
    #[inline(always)]
    unsafe fn v256(self, i: usize, x: __m256) {
        // SAFETY: the caller's contract.
        unsafe {
            let half = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm_storeu_si128(self.0.add(i).cast(), half);
        }
    }
}

/// Round-to-nearest-even bf16 bits of 16 floats, in 16-bit lanes.
#[inline(always)]
unsafe fn bf16_bits_512(x: __m512) -> __m256i {
    // SAFETY: register arithmetic only (the caller runs with AVX-512F).
    unsafe {
        let bits = _mm512_castps_si512(x);
        let high = _mm512_srli_epi32::<16>(bits);
        let lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
        let biased = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb);
        let rounded = _mm512_srli_epi32::<16>(biased);
        let quiet_nan = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
        let is_nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, rounded, quiet_nan))
    }
}

impl Out512 for Bf16Out {
    #[inline(always)]
    unsafe fn v512(self, i: usize, x: __m512) {
        // SAFETY: the caller's contract.
        unsafe { _mm256_storeu_si256(self.0.add(i).cast(), bf16_bits_512(x)) }
    }
}

/// `vcvtneps2bf16`, except for vectors holding a denormal (which it would flush to zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
fn bf16_bits_512_native(x: __m512) -> __m256i {
    let magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff));
    // 1 <= magnitude <= 0x007f_ffff: a nonzero denormal.
    let denormal = _mm512_cmplt_epu32_mask(
        _mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)),
        _mm512_set1_epi32(0x007f_ffff),
    );
    if denormal != 0 {
        // SAFETY: AVX-512F is enabled here.
        return unsafe { bf16_bits_512(x) };
    }
    // SAFETY: `__m256bh` and `__m256i` are both 256 plain bits.
    unsafe { std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x)) }
}

impl Out512 for Bf16OutNative {
    #[inline(always)]
    unsafe fn v512(self, i: usize, x: __m512) {
        // SAFETY: the caller's contract (AVX512-BF16 available).
        unsafe { _mm256_storeu_si256(self.0.add(i).cast(), bf16_bits_512_native(x)) }
    }
}

impl Out512 for F16Out {
    #[inline(always)]
    unsafe fn v512(self, i: usize, x: __m512) {
        // SAFETY: the caller's contract.
        unsafe {
            let half = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            _mm256_storeu_si256(self.0.add(i).cast(), half);
        }
    }
}

/// The AVX2 variant.
///
/// # Safety
/// As `kernel::scalar_loop`; the CPU has AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(crate) unsafe fn avx2<G: Grad256, O: Out256, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    len: usize,
    s: &StepScalars,
    factor: f32,
) {
    let decay = _mm256_set1_ps(s.decay_factor);
    let l2 = _mm256_set1_ps(s.l2);
    let m_weight = _mm256_set1_ps(s.m_weight);
    let one_minus_m_weight = _mm256_set1_ps(1.0 - s.m_weight);
    let beta2 = _mm256_set1_ps(s.beta2);
    let one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
    let neg_step_size = _mm256_set1_ps(s.neg_step_size);
    let bc2_sqrt = _mm256_set1_ps(s.bias_correction2_sqrt);
    let eps = _mm256_set1_ps(s.eps);
    let factor_v = _mm256_set1_ps(factor);
    let mut i = 0;
    while i + 8 <= len {
        // SAFETY: `i + 8 <= len` (the caller's contract for the pointers).
        unsafe {
            let p = _mm256_loadu_ps(src.master.add(i));
            let m = _mm256_loadu_ps(src.exp_avg.add(i));
            let v = _mm256_loadu_ps(src.exp_avg_sq.add(i));
            let grad = _mm256_mul_ps(g.v256(i), factor_v);
            let grad = _mm256_add_ps(grad, _mm256_mul_ps(l2, p));
            let p = _mm256_mul_ps(p, decay);
            let m = if SMALL_WEIGHT {
                _mm256_add_ps(m, _mm256_mul_ps(m_weight, _mm256_sub_ps(grad, m)))
            } else {
                _mm256_sub_ps(
                    grad,
                    _mm256_mul_ps(_mm256_sub_ps(grad, m), one_minus_m_weight),
                )
            };
            let v = _mm256_add_ps(
                _mm256_mul_ps(v, beta2),
                _mm256_mul_ps(_mm256_mul_ps(one_minus_beta2, grad), grad),
            );
            let denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), bc2_sqrt), eps);
            let p = _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom));
            _mm256_storeu_ps(dst.master.add(i), p);
            _mm256_storeu_ps(dst.exp_avg.add(i), m);
            _mm256_storeu_ps(dst.exp_avg_sq.add(i), v);
            o.v256(i, p);
        }
        i += 8;
    }
    // SAFETY: the caller's contract.
    unsafe { scalar_loop::<G, O, SMALL_WEIGHT>(src, dst, g, o, i..len, s, factor) }
}

/// The AVX-512 loop, inlined into the two entry points below.
///
/// # Safety
/// As `kernel::scalar_loop`; the CPU has AVX-512F (and AVX512-BF16 for [`Bf16OutNative`]).
#[inline(always)]
unsafe fn avx512_loop<G: Grad512, O: Out512, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    len: usize,
    s: &StepScalars,
    factor: f32,
) {
    // SAFETY: the caller runs with AVX-512F; every access is in bounds (`i + 16 <= len`).
    unsafe {
        let decay = _mm512_set1_ps(s.decay_factor);
        let l2 = _mm512_set1_ps(s.l2);
        let m_weight = _mm512_set1_ps(s.m_weight);
        let one_minus_m_weight = _mm512_set1_ps(1.0 - s.m_weight);
        let beta2 = _mm512_set1_ps(s.beta2);
        let one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
        let neg_step_size = _mm512_set1_ps(s.neg_step_size);
        let bc2_sqrt = _mm512_set1_ps(s.bias_correction2_sqrt);
        let eps = _mm512_set1_ps(s.eps);
        let factor_v = _mm512_set1_ps(factor);
        let mut i = 0;
        while i + 16 <= len {
            let p = _mm512_loadu_ps(src.master.add(i));
            let m = _mm512_loadu_ps(src.exp_avg.add(i));
            let v = _mm512_loadu_ps(src.exp_avg_sq.add(i));
            let grad = _mm512_mul_ps(g.v512(i), factor_v);
            let grad = _mm512_add_ps(grad, _mm512_mul_ps(l2, p));
            let p = _mm512_mul_ps(p, decay);
            let m = if SMALL_WEIGHT {
                _mm512_add_ps(m, _mm512_mul_ps(m_weight, _mm512_sub_ps(grad, m)))
            } else {
                _mm512_sub_ps(
                    grad,
                    _mm512_mul_ps(_mm512_sub_ps(grad, m), one_minus_m_weight),
                )
            };
            let v = _mm512_add_ps(
                _mm512_mul_ps(v, beta2),
                _mm512_mul_ps(_mm512_mul_ps(one_minus_beta2, grad), grad),
            );
            let denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bc2_sqrt), eps);
            let p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
            _mm512_storeu_ps(dst.master.add(i), p);
            _mm512_storeu_ps(dst.exp_avg.add(i), m);
            _mm512_storeu_ps(dst.exp_avg_sq.add(i), v);
            o.v512(i, p);
            i += 16;
        }
        scalar_loop::<G, O, SMALL_WEIGHT>(src, dst, g, o, i..len, s, factor);
    }
}

/// The AVX-512 variant, bf16 copy-out rounded with integer arithmetic.
///
/// # Safety
/// As `kernel::scalar_loop`; the CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn avx512<G: Grad512, O: Out512, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    len: usize,
    s: &StepScalars,
    factor: f32,
) {
    // SAFETY: the caller's contract.
    unsafe { avx512_loop::<G, O, SMALL_WEIGHT>(src, dst, g, o, len, s, factor) }
}

/// The AVX-512 variant with AVX512-BF16 available for the bf16 copy-out.
///
/// # Safety
/// As `kernel::scalar_loop`; the CPU has AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
pub(crate) unsafe fn avx512_bf16<G: Grad512, O: Out512, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    len: usize,
    s: &StepScalars,
    factor: f32,
) {
    // SAFETY: the caller's contract.
    unsafe { avx512_loop::<G, O, SMALL_WEIGHT>(src, dst, g, o, len, s, factor) }
}

/// The bf16 rounding of the two AVX-512 paths for 16 floats, for tests.
#[cfg(test)]
pub(crate) fn bf16_round_16(x: [f32; 16], native: bool) -> [u16; 16] {
    let mut out = [0u16; 16];
    // SAFETY: the tests call this only where the CPU has the features used.
    unsafe {
        let v = _mm512_loadu_ps(x.as_ptr());
        let bits = if native {
            bf16_bits_512_native(v)
        } else {
            bf16_round_16_plain(v)
        };
        _mm256_storeu_si256(out.as_mut_ptr().cast(), bits);
    }
    out
}

#[cfg(test)]
#[target_feature(enable = "avx512f")]
fn bf16_round_16_plain(x: __m512) -> __m256i {
    // SAFETY: AVX-512F is enabled here.
    unsafe { bf16_bits_512(x) }
}
