//! The ground floor of the CUDA backend's buffers: what a device buffer's elements are
//! ([`Element`]), whether a kernel or an op reads or writes one ([`Access`]), and how many
//! elements a block of rows spans when its rows lie apart ([`strided_len`]). Every other
//! module of `cuda/` may use these; they use nothing of it but the AdamW segment's size.

use dsplan_kernels::Dtype;

/// The element type of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    /// The model dtype (f32, bf16 or f16).
    Model,
    /// f32.
    F32,
    /// f64.
    F64,
    /// u32.
    U32,
    /// i32.
    I32,
    /// `struct AdamSegment` (24 bytes).
    AdamSegment,
}

impl Element {
    /// Bytes per element when the model is stored in `model`.
    pub fn size(self, model: Dtype) -> usize {
        match self {
            Element::Model => model.size(),
            Element::F32 | Element::U32 | Element::I32 => 4,
            Element::F64 => 8,
            Element::AdamSegment => std::mem::size_of::<super::adamw::AdamSegment>(),
        }
    }
}

/// Whether a kernel argument (or an op's operand) is read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only (`const` in the `.cu` signature).
    Read,
    /// Written (or accumulated into).
    Write,
}

/// Elements a `(rows, cols)` block spans when its rows lie `stride` apart.
pub fn strided_len(rows: usize, cols: usize, stride: usize) -> usize {
    match rows {
        0 => 0,
        r => (r - 1) * stride + cols,
    }
}
