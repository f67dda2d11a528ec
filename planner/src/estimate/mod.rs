//! Memory estimates: DeepSpeed's own estimators reproduced exactly, then dsplan's full view.
//!
//! - [`deepspeed`]: `estimate_zero2/zero3_model_states_mem_needs`, byte for byte, and the rows
//!   of their printed tables;
//! - [`deepspeed_print`]: the `_all_cold` tables as DeepSpeed prints them;
//! - [`topology`]: the cluster shape and the buffer factor the estimators take;
//! - [`python_math`]: Python's int/float semantics the estimators depend on.

pub mod deepspeed;
pub mod deepspeed_print;
pub mod full;
pub mod python_math;
pub mod topology;

pub use deepspeed::{
    BytesOverflow, DeepSpeedRow, OffloadDevice, Zero2MemNeeds, Zero3MemNeeds, Zero3Options,
    ZeroInit, estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs,
    zero2_table, zero3_table,
};
pub use deepspeed_print::{EnumSpelling, zero2_all_cold_text, zero3_all_cold_text};
pub use full::{FullEstimate, FullEstimateError, estimate_full, estimate_reading};
pub use topology::{BufferFactor, Topology, TopologyError};
