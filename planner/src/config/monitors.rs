//! Observability: the metric monitors (`tensorboard`, `wandb`, `csv_monitor`, `comet`), the
//! communication logger (`comms_logger`), the FLOPS profiler (`flops_profiler`) and the
//! throughput timers (`timers`).
//!
//! The monitors, `comms_logger` and `timers.throughput` are pydantic models in DeepSpeed
//! (unknown keys rejected); `flops_profiler` and `timers` itself are plain dictionary lookups;
//! dsplan still refuses an unknown key in `flops_profiler` (its seven keys:
//! `profiling/config.py:29-46` in 0.19.8), where a typo would silently keep the default.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::primitives::Integer;

/// `tensorboard`: write training metrics as TensorBoard events (needs the `tensorboard`
/// package).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TensorBoardConfig {
    /// Log to TensorBoard.
    pub enabled: bool,
    /// Directory for the event files; empty means under the launch directory.
    pub output_path: String,
    /// Name of this run: a subdirectory of `output_path`.
    pub job_name: String,
}

impl Default for TensorBoardConfig {
    fn default() -> Self {
        TensorBoardConfig {
            enabled: false,
            output_path: String::new(),
            job_name: "DeepSpeedJobName".into(),
        }
    }
}

/// `csv_monitor`: write training metrics to local CSV files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CsvMonitorConfig {
    /// Log to CSV files.
    pub enabled: bool,
    /// Directory for the CSV files; empty means under the launch directory.
    pub output_path: String,
    /// Name of this run: a subdirectory of `output_path`.
    pub job_name: String,
}

impl Default for CsvMonitorConfig {
    fn default() -> Self {
        CsvMonitorConfig {
            enabled: false,
            output_path: String::new(),
            job_name: "DeepSpeedJobName".into(),
        }
    }
}

/// `wandb`: log training metrics to Weights & Biases (needs the `wandb` package).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WandbConfig {
    /// Log to W&B.
    pub enabled: bool,
    /// W&B group that runs are collected under.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// W&B team (entity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// W&B project.
    pub project: String,
}

impl Default for WandbConfig {
    fn default() -> Self {
        WandbConfig {
            enabled: false,
            group: None,
            team: None,
            project: "deepspeed".into(),
        }
    }
}

/// How a Comet experiment is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CometMode {
    /// Continue the experiment named by `experiment_key`.
    Get,
    /// Always create a new experiment.
    Create,
    /// Continue if it exists, create otherwise (Comet's default).
    GetOrCreate,
}

/// `comet`: log training metrics to Comet (needs the `comet_ml` package). Unset fields fall
/// back to Comet's own configuration (`.comet.config`, `COMET_*` variables).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CometConfig {
    /// Log to Comet.
    pub enabled: bool,
    /// Send metrics after every this many samples.
    pub samples_log_interval: Integer,
    /// Comet project name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Comet workspace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// Comet API key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// Name of the experiment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experiment_name: Option<String>,
    /// Key of the experiment: alphanumeric, 32 to 50 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experiment_key: Option<String>,
    /// Log to the Comet server (true) or keep an offline experiment (false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub online: Option<bool>,
    /// How the experiment is started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<CometMode>,
}

impl Default for CometConfig {
    fn default() -> Self {
        CometConfig {
            enabled: false,
            samples_log_interval: Integer(100),
            project: None,
            workspace: None,
            api_key: None,
            experiment_name: None,
            experiment_key: None,
            online: None,
            mode: None,
        }
    }
}

/// `comms_logger`: log every collective DeepSpeed issues (sizes, latency, bandwidth). The
/// logger is configured whenever the section is present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CommsLoggerConfig {
    /// Turn the logger on.
    pub enabled: bool,
    /// Print each operation as it happens.
    pub verbose: bool,
    /// Profile every operation (otherwise only those in `prof_ops`).
    pub prof_all: bool,
    /// Names of the operations to profile when `prof_all` is false (e.g. `all_reduce`).
    pub prof_ops: Vec<String>,
    /// Include the caller of each operation.
    pub debug: bool,
}

impl Default for CommsLoggerConfig {
    fn default() -> Self {
        CommsLoggerConfig {
            enabled: false,
            verbose: false,
            prof_all: true,
            prof_ops: Vec::new(),
            debug: false,
        }
    }
}

/// `flops_profiler`: measure the model's FLOPs, latency and parameters at one step. Enabling
/// it also turns on `wall_clock_breakdown`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FlopsProfilerConfig {
    /// Run the profiler.
    pub enabled: bool,
    /// Fraction of the forward recomputed in backward (activation checkpointing), counted in
    /// the total.
    pub recompute_fwd_factor: f64,
    /// The training step at which to profile.
    pub profile_step: Integer,
    /// Depth of the module tree shown; -1 means all levels.
    pub module_depth: Integer,
    /// How many top modules to list per depth. (The docs' format string says 3; the code's
    /// default is 1.)
    pub top_modules: Integer,
    /// Print the detailed per-module profile.
    pub detailed: bool,
    /// File to write the profile to; absent means stdout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
}

impl Default for FlopsProfilerConfig {
    fn default() -> Self {
        FlopsProfilerConfig {
            enabled: false,
            recompute_fwd_factor: 0.0,
            profile_step: Integer(1),
            module_depth: Integer(-1),
            top_modules: Integer(1),
            detailed: true,
            output_file: None,
        }
    }
}

/// `timers`: DeepSpeed's internal timers.
///
/// DeepSpeed reads only `timers.throughput` (`utils/config.py:27-32` in 0.19.8) and ignores any
/// other key; dsplan refuses one, so that a misspelt `throughput` is not silently dropped.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TimersConfig {
    /// The throughput timer (samples per second in the progress log).
    pub throughput: ThroughputTimerConfig,
}

/// `timers.throughput`: the samples-per-second timer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ThroughputTimerConfig {
    /// Measure throughput.
    pub enabled: bool,
    /// Synchronise the device around measurements: accurate but slower.
    pub synchronized: bool,
}

impl Default for ThroughputTimerConfig {
    fn default() -> Self {
        ThroughputTimerConfig {
            enabled: true,
            synchronized: true,
        }
    }
}
