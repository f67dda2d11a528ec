//! What a training run measures: per-step metrics ([`StepMetrics`], one JSON object per step
//! in `--metrics` files), per-rank memory ([`MemoryLedger`], [`MemoryReport`]), and the plan's
//! memory prediction in the same categories ([`PlanMemory`]), and what a run on a GPU adds
//! ([`DeviceRun`]).

mod device;
pub mod memory;
pub mod plan;
mod step;

pub use device::DeviceRun;
pub use memory::{
    ByCategory, Category, FixedBuffer, MemoryLedger, MemoryReport, Reservation, Tracked,
};
pub use plan::PlanMemory;
pub use step::{PhaseTimes, StepMetrics};
