//! Math shared by the planner and the executor: learning-rate schedules, the fp16 loss-scale
//! state machine and gradient clipping, exactly as DeepSpeed 0.19.8 computes them, plus a small
//! SVG chart of a schedule and its steps written out in bounded memory ([`rows`]).

pub mod clip;
pub mod error;
pub mod loss_scale;
pub mod lr;
mod params;
pub mod rows;
pub mod svg;

pub use error::{ScheduleError, ScheduleErrorKind, ScheduleWarning};
pub use lr::{BetasSupport, LrSchedule, OptimizerGroups, WarmupType};
pub use params::py_float_repr;
