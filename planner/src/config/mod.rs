//! The typed model of DeepSpeed 0.19.8's `ds_config.json` and the JSON Schema generated from it.
//!
//! Each section of the config is a struct in its own file, with DeepSpeed's default for every
//! field (the code's default, where it differs from the docs) and a doc comment that becomes
//! the schema's `description`:
//!
//! | file | sections |
//! |---|---|
//! | [`root`] | [`DsConfig`]: the top level (batch sizes, clipping, communication dtypes, ...) |
//! | [`zero`], [`offload`], [`zenflow`] | `zero_optimization` with `offload_param`, `offload_optimizer`, `zenflow`, `leaf_module` |
//! | [`precision`] | `fp16`, `bf16`, `bfloat16`, `torch_autocast`, `data_types` |
//! | [`optimizer`], [`scheduler`] | `optimizer`, `scheduler` |
//! | [`monitors`] | `tensorboard`, `wandb`, `csv_monitor`, `comet`, `comms_logger`, `flops_profiler`, `timers` |
//! | [`checkpoint`] | `checkpoint`, `aio` |
//! | [`parallel`] | `tensor_parallel`, `hybrid_engine`, `weight_quantization`, `compile` |
//! | [`expert_parallel`] | `expert_parallel` (AutoEP) |
//! | [`misc`] | `activation_checkpointing`, `autotuning` |
//!
//! [`primitives`] holds the shared value types ([`AutoOr`], [`NonNegativeInt`], ...),
//! [`registry`] the data tables (deprecated and removed keys, aliases, optimizers, schedulers,
//! `"auto"` keys), [`schema`](mod@schema) the schema generation and [`from_value`] the typed parse.
//! `pipeline`, `data_efficiency` and `datastates_ckpt` stay free-form: DeepSpeed passes them on
//! to other components (`datastates_ckpt` to the DataStates library, `data_efficiency` to the
//! curriculum and routing samplers), and real configs keep their own script's keys in `pipeline`
//! (`chunks`, `partition_method`, ...), which DeepSpeed ignores; dsplan warns about those
//! ([`crate::validate::rules::keys`]).

pub mod checkpoint;
pub mod expert_parallel;
pub mod misc;
pub mod monitors;
pub mod offload;
pub mod optimizer;
pub mod parallel;
mod parse;
pub mod precision;
pub mod primitives;
pub mod registry;
pub mod root;
pub mod scheduler;
pub mod schema;
pub mod zenflow;
pub mod zero;

pub use checkpoint::{AioConfig, CheckpointConfig, TagValidation};
pub use expert_parallel::ExpertParallelConfig;
pub use misc::{ActivationCheckpointingConfig, AutotuningConfig};
pub use monitors::{
    CometConfig, CommsLoggerConfig, CsvMonitorConfig, FlopsProfilerConfig, TensorBoardConfig,
    TimersConfig, WandbConfig,
};
pub use offload::{OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig};
pub use optimizer::{OptimizerConfig, OptimizerParams};
pub use parallel::{
    CompileConfig, HybridEngineConfig, TensorParallelConfig, WeightQuantizationConfig,
};
pub use parse::{from_value, refused_pointer};
pub use precision::{
    Bf16Config, CommDataType, DataTypesConfig, Fp16Config, GradientAllreduceOp, LegacyBf16Config,
    TorchAutocastConfig,
};
pub use primitives::{AutoOr, DtypeName, Integer, NonNegativeInt};
pub use root::{DsConfig, LogLevel};
pub use scheduler::{LearningRate, SchedulerConfig, SchedulerParams, WarmupType};
pub use schema::{schema, schema_text};
pub use zenflow::ZenflowConfig;
pub use zero::{LeafModuleConfig, ZeroConfig, ZeroStage};

#[cfg(test)]
mod tests;
