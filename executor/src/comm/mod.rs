//! Collectives: the few communication operations the ZeRO engines need, behind one small trait.
//!
//! A ZeRO engine sees its data-parallel group through [`Comm`]: its rank, the world size, and
//! six collectives on `f32` slices in host memory:
//!
//! | method | what every rank ends with | used by (DeepSpeed) |
//! |---|---|---|
//! | [`Comm::all_reduce`] | the element-wise reduction of every rank's buffer | stage 0/1 gradient buckets, stage 2's default bucket all-reduce |
//! | [`Comm::reduce_scatter`] | its own contiguous shard of the reduction | stage 3 gradients, the ZeRO paper's stage 2 |
//! | [`Comm::all_gather`] | every rank's shard, concatenated in rank order | stage 1/2 parameters after the step, stage 3 parameters before use |
//! | [`Comm::broadcast`] | the root's buffer | initial parameters (`zero.Init` broadcasts rank 0's values) |
//! | [`Comm::all_reduce_scalar`] | one reduced `f64` | gradient norms, the fp16 overflow flag (MAX) |
//! | [`Comm::barrier`] | nothing; no rank leaves before all arrived | checkpoints |
//!
//! # Contract shared by every implementation
//!
//! * **Collective calls.** Every rank of the group calls the same collectives in the same order
//!   with the same lengths, reduce op and root. A rank that disagrees, or passes lengths that break
//!   a rule below, makes the call fail **on every rank** with the same [`CommError`]: no rank is
//!   left waiting.
//! * **Padding is the caller's job.** `reduce_scatter` and `all_gather` move contiguous, equal
//!   shards: `reduce_scatter` needs `input.len() == world_size * output.len()` and rank `r`
//!   receives the reduction of elements `[r * output.len(), (r + 1) * output.len())`;
//!   `all_gather` needs `output.len() == world_size * input.len()` and rank `q`'s input lands at
//!   `[q * input.len(), (q + 1) * input.len())`. ZeRO pads its flat buffers to a multiple of the
//!   world size (DeepSpeed stage 1/2 to a multiple of `2 * world`, stage 3 per parameter) before it
//!   communicates, so the shards are always equal; an uneven length is a bug in the caller and is
//!   reported as [`CommError::UnevenShards`].
//! * **Deterministic reductions.** A reduction combines the ranks' values in rank order
//!   `((x_0 op x_1) op x_2) ...`, the same order for every element, on every rank and in every
//!   run, so all ranks receive bit-identical results. [`ReduceOp::Avg`] divides that sum by the
//!   world size; [`ReduceOp::Max`] propagates NaN (an overflow check must not miss one).
//! * **Failure is an error, not a hang.** A rank that has left the group (its handle was dropped,
//!   normally or while panicking) makes every pending and later collective fail with
//!   [`CommError::PeerLeft`].
//! * **Traffic is counted** per operation kind ([`CommTraffic`]), as the bytes this rank's buffers
//!   contributed to other ranks, for comparison with the plan's predicted volume (the
//!   bandwidth-optimal figures of DeepSpeed's §4.8 volume table: `(W-1)/W` of the buffer for a
//!   reduce-scatter or all-gather, twice that for an all-reduce).
//!
//! # Implementations and the path to GPUs
//!
//! [`LocalComm`] runs `W` ranks as threads of one process and performs real shared-memory
//! collectives (see [`local`]). It is what the CPU backend and every multi-rank test use.
//!
//! `MpiComm` (module `mpi`, cargo feature `mpi`) runs one rank per process under `mpirun`. It
//! keeps the whole contract, the rank-ordered reductions included: it never calls MPI's own
//! reductions (their order is the library's choice) but moves shards with `MPI_Alltoall` /
//! `MPI_Allgather` and reduces them locally in rank order, so processes equal threads bit for
//! bit. A rank that dies ends the job through `mpirun`, a rank that fails aborts it, and a
//! collective that outlasts the timeout is reported as [`CommError::TimedOut`].
//!
//! [`crate::cuda::nccl::NcclComm`] implements it for one process per GPU over NCCL, staging the
//! host slices through device buffers (a copy each way per call); a GPU engine calls its
//! `*_device` methods on device buffers instead. Over NCCL the contract weakens in two places:
//! a failing library call is [`CommError::Backend`] with NCCL's or the driver's text, seen by the
//! rank that hit it (the others see NCCL's asynchronous error, or time out: a [`watchdog`]
//! watches every NCCL wait, aborts the communicator and names the rank and the wait); and a
//! reduction is as deterministic as NCCL makes it (the same algorithm and channel count give
//! repeatable results, not the rank-ordered sum). Lengths are still checked before any call, so
//! uneven shards and a bad root are the same errors as on [`LocalComm`].

mod calls;
mod error;
pub mod local;
#[cfg(feature = "mpi")]
pub mod mpi;
mod reduce;
mod rendezvous;
mod traffic;
pub mod watchdog;

/// How long a rank waits on its peers before its wait fails, unless told otherwise: torch's and
/// DeepSpeed's default process-group timeout (30 minutes).
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

pub use error::{CallShape, CommError, Departure, OpKind, StepPhase, Waiting};
pub use local::{LocalComm, run_ranks};
#[cfg(feature = "mpi")]
pub use mpi::{MpiComm, MpiJob};
pub use traffic::{CommTraffic, OpTraffic};

/// How a reduction combines the ranks' values (always in rank order 0, 1, ..., W-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `x_0 + x_1 + ... + x_{W-1}`, added left to right.
    Sum,
    /// The rank-ordered sum divided by the world size (one rounding for the division).
    Avg,
    /// The largest value; NaN if any rank holds NaN.
    Max,
}

impl ReduceOp {
    /// The lower-case name (`sum`, `avg`, `max`), as printed in errors.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
        }
    }
}

/// A data-parallel group as one rank sees it. See the [module documentation](self) for the
/// contract every implementation keeps.
///
/// Methods take `&mut self`: a rank issues its collectives one at a time, in program order.
pub trait Comm {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// The number of ranks in the group.
    fn world_size(&self) -> usize;

    /// Replaces `data` on every rank by the element-wise reduction of all ranks' `data`.
    /// Every rank passes the same length.
    fn all_reduce(&mut self, data: &mut [f32], op: ReduceOp) -> Result<(), CommError>;

    /// Reduces all ranks' `input` element-wise and gives rank `r` the shard
    /// `[r * output.len(), (r + 1) * output.len())` of the result.
    ///
    /// `input.len()` must equal `world_size() * output.len()` (pad the flat buffer first).
    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError>;

    /// Concatenates every rank's `input` in rank order into every rank's `output`.
    ///
    /// `output.len()` must equal `world_size() * input.len()`.
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError>;

    /// Copies rank `root`'s `data` into every other rank's `data` (same length everywhere).
    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError>;

    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<(), CommError>;

    /// Reduces one `f64` per rank (squared-norm partial sums, overflow flags) and returns the
    /// result, the same bits on every rank.
    fn all_reduce_scalar(&mut self, value: f64, op: ReduceOp) -> Result<f64, CommError>;

    /// What this rank has sent so far, per operation kind.
    fn traffic(&self) -> &CommTraffic;
}
