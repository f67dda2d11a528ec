//! The minimal tensor layer: named spans of one flat `f32` buffer.
//!
//! There is no tensor type. Parameters, gradients and activations each live in one `Vec<f32>`
//! (llm.c style); a [`TensorTable`] names the pieces, gives their shapes and where they start,
//! and [`Span`] cuts a piece out of a buffer. [`split_spans_mut`] hands out several disjoint
//! pieces of one buffer at once, which is what a layer's `forward`/`backward` needs (read the
//! input, write the output, both inside the same arena).

mod span;
mod table;

pub use span::{Span, split_spans_mut};
pub use table::{TensorEntry, TensorTable};
