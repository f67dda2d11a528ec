//! What a training run measures: per-step metrics ([`StepMetrics`], one JSON object per step
//! in `--metrics` files) and per-rank memory ([`MemoryLedger`], [`MemoryReport`]).

pub mod memory;
mod step;

pub use memory::{
    ByCategory, Category, FixedBuffer, MemoryLedger, MemoryReport, Reservation, Tracked,
};
pub use step::StepMetrics;
