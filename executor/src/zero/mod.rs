//! ZeRO over in-process ranks: stages 0-3 with mixed precision, on the CPU model.
//!
//! Each rank is a thread with its own [`ZeroRank`] (what its stage lets it hold) and
//! [`CpuStep`] (its step operations), talking to the others only through [`crate::comm::Comm`]:
//!
//! * [`partition`]: the execution plan (`planner::plan`) as the engines read it
//!   ([`EnginePlan`]): its flat layout and padding, each rank's share, the gradient buckets,
//!   the stage 3 fetch units and persistent set;
//! * [`precision`]: fp32 / bf16 / fp16 storage and rounding ([`MixedPrecision`], [`DtypeVec`]);
//! * `rank.rs`: the rank ([`ZeroRank`]): its stage family's state (`RankState`), the
//!   accumulated gradients, the per-unit buffers (`source.rs`: how the model reaches them) and
//!   the optimizer (`optimizer.rs`: master weights and Adam's moments, in memory or on NVMe);
//! * one state type per stage family behind one interface (`state.rs`), each owning its
//!   buffers and running its collectives on the plan's buckets and pieces: `stage0.rs`
//!   (replicated), `stage12.rs` (the flat partition) and `stage3.rs` (per-tensor shards), sharing
//!   `flat.rs`, `bucket.rs` and `average.rs`; `options.rs` holds [`RankOptions`];
//! * [`swap`]: stage 3 offload to NVMe (ZeRO-Infinity): master weights, Adam states and
//!   parameter slices in files under `nvme_path`, swapped through fixed buffers;
//! * [`clip`]: each stage's norm and clip arithmetic;
//! * `listed.rs`: the run-long host buffers the `dsplan-cpu` plan lists ([`ListedBuffers`]),
//!   which the stages allocate from;
//! * `snapshot.rs`: a rank's owned state out and back in, for checkpoints ([`OwnedState`]);
//! * [`engine`]: the rank as the training loop's CPU backend ([`CpuStep`]); the order of a
//!   step and the loss scale, clip, Adam and schedule decisions are the loop's
//!   (`crate::train::StepBackend`).
//!
//! Every buffer is counted in the rank's [`crate::metrics::MemoryLedger`] by category, so the
//! measured peak per rank can be checked against the plan's, which lists exactly these buffers
//! when compiled with the `dsplan-cpu` backend ([`predict`]).

mod average;
mod bucket;
pub mod clip;
pub mod engine;
mod error;
mod flat;
mod listed;
mod optimizer;
mod options;
pub mod partition;
pub mod precision;
pub mod predict;
mod rank;
mod scaling;
mod snapshot;
mod source;
mod stage0;
mod stage12;
mod stage3;
mod state;
pub mod swap;

pub use clip::{ClipRule, Scales};
pub use engine::CpuStep;
pub use error::ZeroError;
pub use listed::ListedBuffers;
pub use options::RankOptions;
pub use partition::{EnginePlan, NvmeLayout, PlanMismatch};
pub use precision::{Dtype, DtypeVec, MixedPrecision};
pub use predict::Correspondence;
pub use rank::ZeroRank;
pub use scaling::GradScaling;
pub use snapshot::{OwnedState, SnapshotMismatch};
