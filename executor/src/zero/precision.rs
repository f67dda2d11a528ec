//! Mixed precision on a CPU that computes in `f32`.
//!
//! DeepSpeed's 16-bit training keeps the model's parameters and gradients in bf16 or fp16, an
//! fp32 master copy of the parameters for the optimizer, and (fp16 only) scales the loss so
//! that small gradients survive the 16-bit range. Here the 16-bit values are *stored* as
//! [`half::bf16`] / [`half::f16`] ([`DtypeVec`]) and the model *computes* in `f32`: a unit's
//! parameters are widened to `f32` when fetched (exact), and each gradient the model produces
//! is rounded to the model dtype when it is handed over, as a 16-bit autograd would have
//! produced it. Reductions go through the `f32` [`crate::comm::Comm`]; their inputs and results
//! are rounded to the communication dtype, which reproduces a 16-bit reduction of two ranks
//! exactly and of more ranks up to double rounding. What this does not reproduce is 16-bit
//! *arithmetic inside* the model (DeepSpeed's bf16 GPT-2 also rounds every activation): a
//! bf16 run here is closer to fp32 than DeepSpeed's is.

use dsplan_planner::config::ZeroStage;
use dsplan_planner::schedule::loss_scale::{
    Fp16ScaleSettings, Fp16Wrapper, LossScaleError, LossScaler, OverflowCheck,
};
use half::{bf16, f16};

use crate::metrics::FixedBuffer;

/// The element type of a model-dtype buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE single precision.
    F32,
    /// bfloat16 (8-bit exponent, 8-bit significand).
    Bf16,
    /// IEEE half precision (5-bit exponent, 11-bit significand, largest finite 65504).
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub const fn bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    /// DeepSpeed's name for it.
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "fp32",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "fp16",
        }
    }

    /// `x` rounded to this dtype (round to nearest even; fp16 overflows to infinity).
    #[inline]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => bf16::from_f32(x).to_f32(),
            Dtype::F16 => f16::from_f32(x).to_f32(),
        }
    }

    /// Rounds every value of `values` to this dtype.
    pub fn round_slice(self, values: &mut [f32]) {
        if self != Dtype::F32 {
            for x in values {
                *x = self.round(*x);
            }
        }
    }
}

/// A flat buffer of one dtype, read and written as `f32`. Its length is fixed at creation.
#[derive(Debug, Clone, PartialEq)]
pub struct DtypeVec {
    data: Data,
}

#[derive(Debug, Clone, PartialEq)]
enum Data {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
}

impl DtypeVec {
    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: Dtype, len: usize) -> Self {
        let data = match dtype {
            Dtype::F32 => Data::F32(vec![0.0; len]),
            Dtype::Bf16 => Data::Bf16(vec![bf16::ZERO; len]),
            Dtype::F16 => Data::F16(vec![f16::ZERO; len]),
        };
        Self { data }
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            Data::F32(_) => Dtype::F32,
            Data::Bf16(_) => Dtype::Bf16,
            Data::F16(_) => Dtype::F16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::F32(v) => v.len(),
            Data::Bf16(v) => v.len(),
            Data::F16(v) => v.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements, when the dtype is `f32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The elements, mutably, when the dtype is `f32`.
    pub fn as_f32_mut(&mut self) -> Option<&mut [f32]> {
        match &mut self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// Widens `out.len()` elements starting at `start` into `out`.
    ///
    /// # Panics
    /// When the range lies outside the buffer (a layout bug).
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[start..end]),
            Data::Bf16(v) => {
                for (o, x) in out.iter_mut().zip(&v[start..end]) {
                    *o = x.to_f32();
                }
            }
            Data::F16(v) => {
                for (o, x) in out.iter_mut().zip(&v[start..end]) {
                    *o = x.to_f32();
                }
            }
        }
    }

    /// Stores `src` (rounded to the dtype) at `start..start + src.len()`.
    pub fn write(&mut self, start: usize, src: &[f32]) {
        let end = start + src.len();
        match &mut self.data {
            Data::F32(v) => v[start..end].copy_from_slice(src),
            Data::Bf16(v) => {
                for (x, &s) in v[start..end].iter_mut().zip(src) {
                    *x = bf16::from_f32(s);
                }
            }
            Data::F16(v) => {
                for (x, &s) in v[start..end].iter_mut().zip(src) {
                    *x = f16::from_f32(s);
                }
            }
        }
    }

    /// `self[start + i] = round(self[start + i] + src[i])`: accumulation in the dtype.
    pub fn accumulate(&mut self, start: usize, src: &[f32]) {
        let end = start + src.len();
        match &mut self.data {
            Data::F32(v) => {
                for (x, &s) in v[start..end].iter_mut().zip(src) {
                    *x += s;
                }
            }
            Data::Bf16(v) => {
                for (x, &s) in v[start..end].iter_mut().zip(src) {
                    *x = bf16::from_f32(x.to_f32() + s);
                }
            }
            Data::F16(v) => {
                for (x, &s) in v[start..end].iter_mut().zip(src) {
                    *x = f16::from_f32(x.to_f32() + s);
                }
            }
        }
    }

    /// Sets every element to zero.
    pub fn fill_zero(&mut self) {
        match &mut self.data {
            Data::F32(v) => v.fill(0.0),
            Data::Bf16(v) => v.fill(bf16::ZERO),
            Data::F16(v) => v.fill(f16::ZERO),
        }
    }
}

impl FixedBuffer for DtypeVec {
    fn bytes(&self) -> u64 {
        (self.len() * self.dtype().bytes()) as u64
    }
}

/// How a run mixes precisions (DeepSpeed's `fp16` / `bf16` sections).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MixedPrecision {
    /// Everything in fp32; no loss scaling, no overflow checks.
    Fp32,
    /// bf16 parameters and gradients, fp32 master weights; loss scale 1.
    Bf16 {
        /// Whether a step whose gradients hold inf/NaN is skipped (`bf16.check_grad_overflow`).
        overflow: OverflowCheck,
    },
    /// fp16 parameters and gradients, fp32 master weights, loss scaling.
    Fp16 {
        /// The scaler's settings, after DeepSpeed's default-argument rules.
        scale: Fp16ScaleSettings,
    },
}

impl MixedPrecision {
    /// The dtype of the model's parameters and gradients.
    pub fn model_dtype(&self) -> Dtype {
        match self {
            MixedPrecision::Fp32 => Dtype::F32,
            MixedPrecision::Bf16 { .. } => Dtype::Bf16,
            MixedPrecision::Fp16 { .. } => Dtype::F16,
        }
    }

    /// The loss scaler DeepSpeed builds for this precision under `stage` (fp16 without ZeRO
    /// goes through `FP16_Optimizer`, which ignores hysteresis).
    pub fn loss_scaler(&self, stage: ZeroStage) -> Result<LossScaler, LossScaleError> {
        match self {
            MixedPrecision::Fp32 => Ok(LossScaler::full_precision()),
            MixedPrecision::Bf16 { overflow } => Ok(LossScaler::bf16(*overflow)),
            MixedPrecision::Fp16 { scale } => {
                let wrapper = if stage == ZeroStage::Disabled {
                    Fp16Wrapper::Fp16Optimizer
                } else {
                    Fp16Wrapper::Zero
                };
                LossScaler::fp16(scale, wrapper)
            }
        }
    }

    /// Whether steps are checked for inf/NaN gradients.
    pub fn checks_overflow(&self) -> bool {
        match self {
            MixedPrecision::Fp32 => false,
            MixedPrecision::Bf16 { overflow } => *overflow == OverflowCheck::SkipStep,
            MixedPrecision::Fp16 { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bit_buffers_round_on_write_and_accumulate() {
        let mut v = DtypeVec::zeros(Dtype::Bf16, 3);
        v.write(0, &[1.0, 1.0 + 1.0 / 512.0, 3.0]);
        let mut out = [0.0f32; 3];
        v.read(0, &mut out);
        assert_eq!(out, [1.0, 1.0, 3.0]);
        v.accumulate(1, &[1.0 / 128.0, 0.5]);
        v.read(0, &mut out);
        assert_eq!(out, [1.0, 1.0078125, 3.5]);
        assert_eq!(v.bytes(), 6);

        let mut h = DtypeVec::zeros(Dtype::F16, 1);
        h.write(0, &[1.0e5]);
        h.read(0, &mut out[..1]);
        assert!(out[0].is_infinite(), "fp16 overflows to inf");
        assert_eq!(Dtype::F16.round(65504.0), 65504.0);
    }
}
