//! The offload step's element loop on raw, already-checked pointers: the arithmetic (the same
//! as `optim::adam::adam_step`'s, plus one gradient factor), the typed gradient sources and
//! output sinks, and the scalar loop. `dispatch` picks a variant; the vector ones are in
//! `kernel_x86`.
//!
//! The state is read from `src` and written to `dst`; they are the same pointers for an
//! in-place step and two copies for the speculative mode's double-buffered state.

use half::f16;

use crate::optim::adam::StepScalars;

/// fp32 state pointers (master weights and both moments) of one slice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StatePtrs {
    pub(crate) master: *mut f32,
    pub(crate) exp_avg: *mut f32,
    pub(crate) exp_avg_sq: *mut f32,
}

impl StatePtrs {
    /// The pointers `start` elements on.
    ///
    /// # Safety
    /// `start` is within the slices the pointers came from.
    unsafe fn add(self, start: usize) -> Self {
        // SAFETY: within the caller's slices (the caller's contract).
        unsafe {
            Self {
                master: self.master.add(start),
                exp_avg: self.exp_avg.add(start),
                exp_avg_sq: self.exp_avg_sq.add(start),
            }
        }
    }
}

/// The gradients, typed (16-bit ones as their raw bits).
#[derive(Debug, Clone, Copy)]
pub(crate) enum GradPtr {
    F32(*const f32),
    Bf16(*const u16),
    F16(*const u16),
}

/// The 16-bit copy of the parameters, typed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum OutPtr {
    None,
    Bf16(*mut u16),
    F16(*mut u16),
}

/// Everything one kernel call touches: `len` elements from each pointer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes {
    pub(crate) src: StatePtrs,
    pub(crate) dst: StatePtrs,
    pub(crate) grads: GradPtr,
    pub(crate) out: OutPtr,
    pub(crate) len: usize,
}

// SAFETY: `Lanes` is handed to pool threads that each work on a disjoint sub-range (see
// `pool::OffloadPool::run`), while the slices it points into stay borrowed by the caller.
unsafe impl Send for Lanes {}
// SAFETY: as above; shared references only ever produce disjoint sub-ranges.
unsafe impl Sync for Lanes {}

impl Lanes {
    /// Elements `start..start + len` of these lanes.
    ///
    /// # Safety
    /// `start + len <= self.len`.
    pub(crate) unsafe fn sub(&self, start: usize, len: usize) -> Lanes {
        debug_assert!(start + len <= self.len);
        // SAFETY: within the lanes' slices (the caller's contract).
        unsafe {
            Lanes {
                src: self.src.add(start),
                dst: self.dst.add(start),
                grads: match self.grads {
                    GradPtr::F32(p) => GradPtr::F32(p.add(start)),
                    GradPtr::Bf16(p) => GradPtr::Bf16(p.add(start)),
                    GradPtr::F16(p) => GradPtr::F16(p.add(start)),
                },
                out: match self.out {
                    OutPtr::None => OutPtr::None,
                    OutPtr::Bf16(p) => OutPtr::Bf16(p.add(start)),
                    OutPtr::F16(p) => OutPtr::F16(p.add(start)),
                },
                len,
            }
        }
    }
}

/// One element's update: `adam_step`'s arithmetic (see `optim::adam`), the gradient first
/// multiplied by `factor`. Every vector kernel does these operations in this order.
#[inline(always)]
pub(crate) fn element<const SMALL_WEIGHT: bool>(
    s: &StepScalars,
    factor: f32,
    p: f32,
    g: f32,
    m: f32,
    v: f32,
) -> (f32, f32, f32) {
    let g = g * factor;
    let g = g + s.l2 * p;
    let p = p * s.decay_factor;
    let m = if SMALL_WEIGHT {
        m + s.m_weight * (g - m)
    } else {
        g - (g - m) * (1.0 - s.m_weight)
    };
    let v = v * s.beta2 + s.one_minus_beta2 * g * g;
    let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
    let p = p + s.neg_step_size * m / denom;
    (p, m, v)
}

/// bf16 bits to f32: exact (a 16-bit shift; NaN payloads kept as they are).
#[inline(always)]
pub(crate) fn widen_bf16(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 to bf16 bits, rounded to nearest-even (`half::bf16::from_f32`, torch's rounding).
#[inline(always)]
pub(crate) fn narrow_bf16(x: f32) -> u16 {
    half::bf16::from_f32(x).to_bits()
}

/// fp16 bits to f32: exact.
#[inline(always)]
pub(crate) fn widen_f16(bits: u16) -> f32 {
    f16::from_bits(bits).to_f32()
}

/// f32 to fp16 bits, rounded to nearest-even.
#[inline(always)]
pub(crate) fn narrow_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// Where a kernel reads its gradients from, one element at a time.
pub(crate) trait GradSource: Copy {
    /// Element `i`, widened to f32.
    ///
    /// # Safety
    /// `i` is within the gradients' slice.
    unsafe fn scalar(self, i: usize) -> f32;
}

/// Where a kernel writes the 16-bit parameters, one element at a time.
pub(crate) trait OutSink: Copy {
    /// Writes element `i`.
    ///
    /// # Safety
    /// `i` is within the output slice.
    unsafe fn scalar(self, i: usize, x: f32);
}

#[derive(Clone, Copy)]
pub(crate) struct F32Grads(pub(crate) *const f32);
#[derive(Clone, Copy)]
pub(crate) struct Bf16Grads(pub(crate) *const u16);
#[derive(Clone, Copy)]
pub(crate) struct F16Grads(pub(crate) *const u16);
#[derive(Clone, Copy)]
pub(crate) struct NoOut;
/// bf16 copy-out with integer rounding.
#[derive(Clone, Copy)]
pub(crate) struct Bf16Out(pub(crate) *mut u16);
/// bf16 copy-out with AVX512-BF16 `vcvtneps2bf16` (only inside the kernel compiled for it).
#[derive(Clone, Copy)]
pub(crate) struct Bf16OutNative(pub(crate) *mut u16);
#[derive(Clone, Copy)]
pub(crate) struct F16Out(pub(crate) *mut u16);

impl GradSource for F32Grads {
    #[inline(always)]
    unsafe fn scalar(self, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(i) }
    }
}

impl GradSource for Bf16Grads {
    #[inline(always)]
    unsafe fn scalar(self, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        widen_bf16(unsafe { *self.0.add(i) })
    }
}

impl GradSource for F16Grads {
    #[inline(always)]
    unsafe fn scalar(self, i: usize) -> f32 {
        // SAFETY: the caller's contract.
        widen_f16(unsafe { *self.0.add(i) })
    }
}

impl OutSink for NoOut {
    #[inline(always)]
    unsafe fn scalar(self, _i: usize, _x: f32) {}
}

impl OutSink for Bf16Out {
    #[inline(always)]
    unsafe fn scalar(self, i: usize, x: f32) {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(i) = narrow_bf16(x) }
    }
}

impl OutSink for Bf16OutNative {
    #[inline(always)]
    unsafe fn scalar(self, i: usize, x: f32) {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(i) = narrow_bf16(x) }
    }
}

impl OutSink for F16Out {
    #[inline(always)]
    unsafe fn scalar(self, i: usize, x: f32) {
        // SAFETY: the caller's contract.
        unsafe { *self.0.add(i) = narrow_f16(x) }
    }
}

/// Elements `span` one at a time (the scalar kernel, and the vector kernels' tails).
///
/// # Safety
/// Every pointer of `src`, `dst`, `g` and `o` is valid for `span.end` elements; `dst` equals `src`
/// or does not overlap it.
#[inline(always)]
pub(crate) unsafe fn scalar_loop<G: GradSource, O: OutSink, const SMALL_WEIGHT: bool>(
    src: StatePtrs,
    dst: StatePtrs,
    g: G,
    o: O,
    span: std::ops::Range<usize>,
    s: &StepScalars,
    factor: f32,
) {
    for i in span {
        // SAFETY: `i` is within the pointers' elements (the caller's contract).
        unsafe {
            let (p, m, v) = element::<SMALL_WEIGHT>(
                s,
                factor,
                *src.master.add(i),
                g.scalar(i),
                *src.exp_avg.add(i),
                *src.exp_avg_sq.add(i),
            );
            *dst.master.add(i) = p;
            *dst.exp_avg.add(i) = m;
            *dst.exp_avg_sq.add(i) = v;
            o.scalar(i, p);
        }
    }
}
