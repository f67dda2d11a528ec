//! Stage 0 (plain data parallelism), and stage 1's reduction: every rank holds the whole
//! gradient, accumulated over the micro-steps, and all-reduces it once at the accumulation
//! boundary, in chunks of `reduce_bucket_size` elements.
//!
//! Stage 0 averages as DeepSpeed's engine does (`allreduce_bucket`: sum, then multiply by
//! `1/W`); stage 1 as its ZeRO optimizer does (divide by `W`, then sum). Stage 1 then keeps only
//! its partition of the result for the optimizer (`ZeroRank::owned_grads`).

use super::ZeroError;
use super::average::average;
use super::rank::ZeroRank;
use crate::metrics::{Category, Tracked};

impl ZeroRank {
    /// All-reduces the whole accumulated gradient buffer, chunk by chunk: in place when it is
    /// `f32`, through an `f32` staging chunk when it is 16-bit (the `Comm` works on `f32`).
    pub(super) fn reduce_accumulated(&mut self) -> Result<(), ZeroError> {
        let len = self.grads.len();
        let chunk = self.options.reduce_bucket_size.clamp(1, len.max(1));
        let Self {
            grads,
            comm,
            options,
            ledger,
            ..
        } = self;
        if let Some(values) = grads.as_f32_mut() {
            for piece in values.chunks_mut(chunk) {
                average(comm.as_mut(), options, piece)?;
            }
            return Ok(());
        }
        let mut staging = Tracked::zeros(ledger, Category::Buckets, chunk);
        let mut start = 0;
        while start < len {
            let end = (start + chunk).min(len);
            let values = &mut staging[..end - start];
            grads.read(start, values);
            average(comm.as_mut(), options, values)?;
            grads.write(start, values);
            start = end;
        }
        Ok(())
    }
}
