//! The host optimizer of ZeRO-Offload: Adam/AdamW over fp32 master weights and moments in
//! host memory, as one pass per element.
//!
//! One pass reads the gradient in the dtype it arrived in from the device ([`GradsIn`]: bf16,
//! fp16 or f32), multiplies it by one factor the caller gives (loss-scale unscale × clip
//! coefficient), updates master and moments with `optim::adam`'s arithmetic, and writes the
//! 16-bit parameter for the device ([`ParamsOut`], round-to-nearest-even) or nothing (fp32
//! training). Bytes per parameter ([`bytes`]): 28 for f32 in/none out, 2 + 24 + 2 = 28 for
//! bf16 in/bf16 out, against DeepSpeed's 42 (fp32 gradient buffer, separate unscale pass,
//! fp32 step, separate copy-out).
//!
//! * Results: with f32 gradients, factor 1 and no output, bit-identical to
//!   `optim::adam::adam_step`; the 16-bit variants bit-identical to "widen, `adam_step`,
//!   round" (tests). Every [`Isa`] variant gives the same bits.
//! * Entry points: [`OffloadPool::adam_step`] (a partition), [`OffloadPool::adam_step_range`]
//!   (one bucket's slice of it, as soon as its gradients are in), and
//!   [`SpeculativeState`] for the speculative mode's exact rollback.
//! * Threads: [`OffloadPool`], sized to the cores given, each thread streaming one
//!   contiguous part; NUMA-aware with several nodes (see [`pool`]).
//! * Shape: the steps are methods of the pool, which carries the threads, their placement
//!   and the kernel variant; [`AdamSlices`] holds the fp32 state and [`OffloadStep`] the step
//!   number, learning rate and gradient factor (instead of one nine-argument function).
//!   The caller computes the factor (`1 / combined_scale`: unscale times clip coefficient, as
//!   DeepSpeed's `unscale_and_clip_grads` does) and skips overflowed steps itself.
//!
//! Files: `io` (gradient and output types), `isa` (variants, run-time choice), `kernel`
//! (arithmetic, scalar variant), `dispatch` (the variant for an [`Isa`]), `kernel_x86`
//! (AVX2, AVX-512, AVX512-BF16), `numa` (nodes and CPUs), `pool` (threads and placement),
//! `step` (entry points), `speculative` (double-buffered state), `bytes` (bytes moved).

pub mod bytes;
mod dispatch;
mod io;
mod isa;
mod kernel;
#[cfg(target_arch = "x86_64")]
mod kernel_x86;
pub mod numa;
pub mod pool;
mod speculative;
mod step;

#[cfg(test)]
mod tests;

pub use io::{GradDtype, GradsIn, OutDtype, ParamsOut};
pub use isa::Isa;
pub use pool::{Affinity, OffloadPool, Placement, PoolError, PoolOptions};
pub use speculative::{HostAdamState, SpeculativeState, UncoveredRange};
pub use step::{AdamSlices, OffloadError, OffloadStep};
