//! Training runs: a config, a model, data and a world size in; per-step metrics, the trained
//! fp32 parameters and each rank's measured memory out.
//!
//! * [`settings`]: what the `ds_config.json` asks for ([`TrainSettings`]);
//! * [`model`]: the model `--model` names ([`choose_model`]);
//! * [`TrainSpec`]: the whole run (settings, model and initial parameters, data, steps,
//!   ranks);
//! * [`train`]: starts one thread per rank ([`crate::comm::run_ranks`]), each with its own
//!   [`crate::zero::RankEngine`], reports every step of rank 0 to an observer, and consolidates
//!   the fp32 master weights at the end.

mod error;
pub mod model;
mod run;
pub mod settings;
mod spec;

pub use error::TrainError;
pub use model::{DEFAULT_PRESET, ModelChoiceError, ModelSource, choose_model};
pub use run::{TrainReport, train};
pub use settings::{BatchSizes, OptimizerSettings, SettingsError, TrainSettings};
pub use spec::{DataChoice, StoredShape, TrainSpec, stored_shape};
