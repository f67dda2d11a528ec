//! What the offload step reads and writes besides the fp32 state: the gradients in the dtype
//! they arrive in from the device, and the 16-bit copy of the updated parameters.

use half::{bf16, f16};

/// The gradients of the slice being updated, as they arrived (no widening pass first).
#[derive(Debug, Clone, Copy)]
pub enum GradsIn<'a> {
    /// fp32 gradients (fp32 training, or a buffer the caller widened itself).
    F32(&'a [f32]),
    /// bf16 gradients, widened exactly (a 16-bit shift) inside the update.
    Bf16(&'a [bf16]),
    /// fp16 gradients, widened exactly inside the update.
    F16(&'a [f16]),
}

impl GradsIn<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            GradsIn::F32(g) => g.len(),
            GradsIn::Bf16(g) => g.len(),
            GradsIn::F16(g) => g.len(),
        }
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes per element.
    pub fn element_bytes(&self) -> usize {
        match self {
            GradsIn::F32(_) => 4,
            GradsIn::Bf16(_) | GradsIn::F16(_) => 2,
        }
    }
}

/// Where the updated parameters also go, rounded to nearest-even as torch's `.to()` does.
#[derive(Debug)]
pub enum ParamsOut<'a> {
    /// No 16-bit copy (fp32 training: the fp32 master is the parameter).
    None,
    /// bf16 copy, written in the same pass as the update.
    Bf16(&'a mut [bf16]),
    /// fp16 copy, written in the same pass as the update.
    F16(&'a mut [f16]),
}

impl ParamsOut<'_> {
    /// Elements, or `None` when there is no copy.
    pub fn elements(&self) -> Option<usize> {
        match self {
            ParamsOut::None => None,
            ParamsOut::Bf16(p) => Some(p.len()),
            ParamsOut::F16(p) => Some(p.len()),
        }
    }

    /// Bytes per element written (0 without a copy).
    pub fn element_bytes(&self) -> usize {
        match self {
            ParamsOut::None => 0,
            ParamsOut::Bf16(_) | ParamsOut::F16(_) => 2,
        }
    }
}

/// The gradient dtypes, without the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GradDtype {
    /// fp32.
    F32,
    /// bf16.
    Bf16,
    /// fp16.
    F16,
}

/// The 16-bit copy's dtype, without the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutDtype {
    /// No copy.
    None,
    /// bf16.
    Bf16,
    /// fp16.
    F16,
}

impl GradsIn<'_> {
    /// The dtype.
    pub fn dtype(&self) -> GradDtype {
        match self {
            GradsIn::F32(_) => GradDtype::F32,
            GradsIn::Bf16(_) => GradDtype::Bf16,
            GradsIn::F16(_) => GradDtype::F16,
        }
    }
}

impl ParamsOut<'_> {
    /// The dtype.
    pub fn dtype(&self) -> OutDtype {
        match self {
            ParamsOut::None => OutDtype::None,
            ParamsOut::Bf16(_) => OutDtype::Bf16,
            ParamsOut::F16(_) => OutDtype::F16,
        }
    }
}
