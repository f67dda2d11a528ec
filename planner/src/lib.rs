//! dsplan's planner: everything that happens before a single tensor is allocated.
//!
//! The planner is pure: values in, values out; no threads, no devices, no printing. It reads a
//! DeepSpeed config ([`source`]), types it ([`config`]), checks it ([`validate`]), resolves
//! defaults and `"auto"` values, compiles the execution plan ([`plan`]), estimates memory
//! ([`estimate`], reading the plan's buffers; the arithmetic both share is in [`memory`]) for a
//! model ([`model`]), and holds the math the executor shares with it ([`schedule`]:
//! learning-rate schedules and the loss-scale state machine). Every file a user names is read
//! through [`user_file`]: regular files only, bounded, never blocking.

pub mod capped;
pub mod config;
pub mod diagnostics;
pub mod estimate;
pub mod json_pointer;
pub mod memory;
pub mod model;
pub mod parallel;
pub mod plan;
pub mod recommend;
pub mod resolve;
pub mod schedule;
pub mod source;
pub mod user_file;
pub mod validate;

pub use diagnostics::{Code, Diagnostic, Severity};
