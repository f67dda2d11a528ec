//! ZeRO over in-process ranks: stages 0-3 with mixed precision, on the CPU model.
//!
//! Each rank is a thread with its own [`ZeroRank`] (what its stage lets it hold) and
//! [`CpuStep`] (its step operations), talking to the others only through [`crate::comm::Comm`]:
//!
//! * [`partition`]: the execution plan (`planner::plan`) as the engines read it
//!   ([`EnginePlan`]): its flat layout and padding, each rank's share, the gradient buckets,
//!   the stage 3 fetch units and persistent set;
//! * [`precision`]: fp32 / bf16 / fp16 storage and rounding ([`MixedPrecision`], [`DtypeVec`]);
//! * `rank.rs` (the state and the optimizer step), `source.rs` (how the model reaches it),
//!   `average.rs` (the gradient average) and `stage0.rs` .. `stage3.rs`: the stage-specific
//!   collectives, all on the plan's buckets and pieces (stage 0: all-reduce of the accumulated
//!   gradient; stage 1: the same, sharded optimizer and master, params all-gathered after the
//!   step; stage 2: gradients averaged in buckets during backward and kept as a partition;
//!   stage 3: parameters sharded per tensor, gathered per unit before use and released after,
//!   gradients reduce-scattered);
//! * [`swap`]: stage 3 offload to NVMe (ZeRO-Infinity): master weights, Adam states and
//!   parameter slices in files under `nvme_path`, swapped through fixed buffers;
//! * [`clip`]: each stage's norm and clip arithmetic;
//! * `snapshot.rs`: a rank's owned state out and back in, for checkpoints ([`OwnedState`]);
//! * [`engine`]: the rank as the training loop's CPU backend ([`CpuStep`]); the order of a
//!   step and the loss scale, clip, Adam and schedule decisions are the loop's
//!   (`crate::train::StepBackend`).
//!
//! Every buffer is counted in the rank's [`crate::metrics::MemoryLedger`] by category, so the
//! measured peak per rank can be checked against the plan's, which lists exactly these buffers
//! when compiled with the `dsplan-cpu` backend ([`predict`]).

mod average;
pub mod clip;
pub mod engine;
mod error;
pub mod partition;
pub mod precision;
pub mod predict;
mod rank;
mod snapshot;
mod source;
mod stage0;
mod stage1;
mod stage2;
mod stage3;
pub mod swap;

pub use clip::{ClipRule, Scales};
pub use engine::CpuStep;
pub use error::ZeroError;
pub use partition::{EnginePlan, NvmeLayout, PlanMismatch};
pub use precision::{Dtype, DtypeVec, MixedPrecision};
pub use predict::Correspondence;
pub use rank::{GradScaling, RankOptions, ZeroRank};
pub use snapshot::{OwnedState, SnapshotMismatch};
