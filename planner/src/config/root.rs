//! [`DsConfig`]: the whole `ds_config.json`, section by section.
//!
//! DeepSpeed reads the top level with plain dictionary lookups, so it ignores keys it does not
//! know; dsplan's schema still lists every known key (editors flag typos, the validator turns
//! an unrelated key into a warning). Keys of features removed in 0.19.8 (`amp`, `elasticity`,
//! `sparse_attention`, ...) are not fields here: DeepSpeed refuses them, and so does
//! [`crate::config::from_value`].

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::checkpoint::{AioConfig, CheckpointConfig};
use super::expert_parallel::ExpertParallelConfig;
use super::misc::{ActivationCheckpointingConfig, AutotuningConfig};
use super::monitors::{
    CometConfig, CommsLoggerConfig, CsvMonitorConfig, FlopsProfilerConfig, TensorBoardConfig,
    TimersConfig, WandbConfig,
};
use super::optimizer::OptimizerConfig;
use super::parallel::{
    CompileConfig, HybridEngineConfig, TensorParallelConfig, WeightQuantizationConfig,
};
use super::precision::{
    Bf16Config, CommDataType, DataTypesConfig, Fp16Config, GradientAllreduceOp, LegacyBf16Config,
    TorchAutocastConfig,
};
use super::primitives::{AutoOr, NonNegativeInt, PositiveInt, case_insensitive_enum};
use super::scheduler::SchedulerConfig;
use super::zero::{ZeroConfig, ZeroStage};

case_insensitive_enum! {
    /// DeepSpeed's logger level.
    pub enum LogLevel {
        /// Everything.
        Debug => "debug",
        /// Informational messages and above.
        Info => "info",
        /// Warnings and above.
        Warning => "warning",
        /// Errors and above.
        Error => "error",
        /// Critical errors only.
        Critical => "critical",
    }
}

/// A DeepSpeed 0.19.8 `ds_config.json`.
///
/// Every key is optional. The batch keys obey train_batch_size = train_micro_batch_size_per_gpu
/// × gradient_accumulation_steps × data-parallel world size; give any two (or one of the first
/// two) and DeepSpeed derives the rest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct DsConfig {
    /// The JSON Schema this file follows (for editors; DeepSpeed ignores it).
    #[serde(rename = "$schema", skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,

    // ----- batch size -------------------------------------------------------------------
    /// Global batch: samples per optimizer step over all data-parallel ranks. Must be
    /// positive. The Hugging Face Trainer fills `"auto"` with world size ×
    /// per_device_train_batch_size × gradient_accumulation_steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_batch_size: Option<AutoOr<PositiveInt>>,
    /// Samples per GPU per forward/backward (one micro-step). Must be positive. The Hugging
    /// Face Trainer fills `"auto"` from `--per_device_train_batch_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_micro_batch_size_per_gpu: Option<AutoOr<PositiveInt>>,
    /// Micro-steps whose gradients are accumulated before each optimizer step. Must be
    /// positive. The Hugging Face Trainer fills `"auto"` from `--gradient_accumulation_steps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gradient_accumulation_steps: Option<AutoOr<PositiveInt>>,
    /// True: DeepSpeed counts micro-steps and steps the optimizer at the accumulation boundary.
    /// False: the script owns the boundary and every `step()` updates.
    pub managed_gradient_accumulation: bool,

    // ----- optimizer and schedule -----------------------------------------------------------
    /// The optimizer DeepSpeed builds; absent means the script passes its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<OptimizerConfig>,
    /// The learning-rate scheduler DeepSpeed builds; absent means none (or the script's own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerConfig>,
    /// Clip the global gradient L2 norm to this value; 0 turns clipping off. DeepSpeed
    /// 0.19.8's default is 1.0. The Hugging Face Trainer fills `"auto"` from `--max_grad_norm`.
    pub gradient_clipping: AutoOr<f64>,
    /// Allow ZeRO with an optimizer DeepSpeed has not tested (anything but Adam, AdamW,
    /// Adagrad, Lion and DeepSpeed's own CPU/fused versions).
    pub zero_allow_untested_optimizer: bool,
    /// With ZeRO offload, refuse a client optimizer that is not DeepSpeed's CPU optimizer.
    pub zero_force_ds_cpu_optimizer: bool,

    // ----- precision ------------------------------------------------------------------------
    /// fp16 mixed precision and its loss scaler.
    pub fp16: Fp16Config,
    /// bf16 mixed precision.
    pub bf16: Bf16Config,
    /// Old spelling of `bf16`, read only when `bf16` is absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub bfloat16: Option<LegacyBf16Config>,
    /// Run forward under `torch.autocast`.
    pub torch_autocast: TorchAutocastConfig,
    /// Dtypes of gradient accumulation, parameters and buffers.
    pub data_types: DataTypesConfig,
    /// Dtype of gradient reduction. Absent: fp16 when fp16 is on, bf16 when bf16 is on, fp32
    /// otherwise (so bf16 gradients are reduced in bf16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub communication_data_type: Option<CommDataType>,
    /// Dtype of sequence-parallel (Ulysses) communication.
    pub seq_parallel_communication_data_type: CommDataType,
    /// Divide gradients by the world size before the all-reduce instead of after.
    pub prescale_gradients: bool,
    /// Divide gradients by this before the all-reduce and by world size / this after.
    pub gradient_predivide_factor: f64,
    /// Average (`mean`) or add (`sum`) gradients across ranks.
    pub gradient_allreduce_op: GradientAllreduceOp,

    // ----- ZeRO -----------------------------------------------------------------------------
    /// ZeRO: partition optimizer states (stage 1), gradients (2) and parameters (3) across
    /// data-parallel ranks, with optional CPU/NVMe offload. The legacy form `true`/`false`
    /// means stage 1/0.
    #[serde(deserialize_with = "zero_section")]
    #[schemars(schema_with = "zero_section_schema")]
    pub zero_optimization: ZeroConfig,
    /// Deprecated: the all-gather bucket size used only with the legacy
    /// `"zero_optimization": true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub allgather_size: Option<NonNegativeInt>,

    // ----- memory and parallelism -----------------------------------------------------------
    /// DeepSpeed's activation checkpointing API.
    pub activation_checkpointing: ActivationCheckpointingConfig,
    /// Pipeline parallelism (free-form: merged over `stages: "auto"`, `partition: "best"`,
    /// `seed_layers: false`, `activation_checkpoint_interval: 0`, `pipe_partitioned: true`,
    /// `grad_partitioned: true`).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub pipeline: Map<String, Value>,
    /// AutoTP tensor parallelism for training.
    pub tensor_parallel: TensorParallelConfig,
    /// AutoEP expert parallelism.
    #[serde(skip_serializing_if = "ExpertParallelConfig::is_empty")]
    pub expert_parallel: ExpertParallelConfig,
    /// MoE: order the data-parallel groups before the expert-parallel ones.
    pub use_data_before_expert_parallelism: bool,
    /// Sequence-parallel degree; read only to derive the data-parallel world size when
    /// DeepSpeed is given a dict and no mpu (Hugging Face zero.Init).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sequence_parallel_size: Option<NonNegativeInt>,
    /// Switch one model between training and generation (RLHF).
    pub hybrid_engine: HybridEngineConfig,
    /// DeepCompile settings for `engine.compile()`.
    pub compile: CompileConfig,
    /// Weight quantization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_quantization: Option<WeightQuantizationConfig>,

    // ----- data -----------------------------------------------------------------------------
    /// Data efficiency: curriculum learning and random layerwise token dropping (free-form).
    #[serde(skip_serializing_if = "Map::is_empty")]
    pub data_efficiency: Map<String, Value>,
    /// Drop the last incomplete batch of DeepSpeed's data loader.
    pub dataloader_drop_last: bool,

    // ----- checkpoints and I/O --------------------------------------------------------------
    /// Checkpoint validation, writing and universal loading.
    pub checkpoint: CheckpointConfig,
    /// Asynchronous I/O for NVMe offload.
    pub aio: AioConfig,
    /// DataStates asynchronous checkpointing (free-form; enabled unless `false`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub datastates_ckpt: Option<Value>,

    // ----- logging and profiling ------------------------------------------------------------
    /// Print progress every this many optimizer steps; absent means never.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_per_print: Option<NonNegativeInt>,
    /// Log the time of forward, backward and step (also on when the FLOPS profiler is).
    pub wall_clock_breakdown: bool,
    /// Log memory usage at key points.
    pub memory_breakdown: bool,
    /// Print the engine state after initialisation.
    pub dump_state: bool,
    /// Turn Python's automatic cyclic garbage collection off.
    pub disable_python_gc: bool,
    /// DeepSpeed's logger level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_level: Option<LogLevel>,
    /// The FLOPS profiler.
    pub flops_profiler: FlopsProfilerConfig,
    /// Log every collective operation (configured whenever present).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comms_logger: Option<CommsLoggerConfig>,
    /// TensorBoard monitor.
    pub tensorboard: TensorBoardConfig,
    /// Weights & Biases monitor.
    pub wandb: WandbConfig,
    /// CSV monitor.
    pub csv_monitor: CsvMonitorConfig,
    /// Comet monitor.
    pub comet: CometConfig,
    /// Internal timers.
    pub timers: TimersConfig,
    /// The autotuner.
    pub autotuning: AutotuningConfig,

    // ----- rarely used ----------------------------------------------------------------------
    /// Parsed but unused by DeepSpeed.
    pub disable_allgather: bool,
    /// Vocabulary size; DeepSpeed warns when it is not a multiple of 8 (tensor cores).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocabulary_size: Option<NonNegativeInt>,
}

impl Default for DsConfig {
    fn default() -> Self {
        DsConfig {
            schema: None,
            train_batch_size: None,
            train_micro_batch_size_per_gpu: None,
            gradient_accumulation_steps: None,
            managed_gradient_accumulation: true,
            optimizer: None,
            scheduler: None,
            gradient_clipping: AutoOr::Value(1.0),
            zero_allow_untested_optimizer: false,
            zero_force_ds_cpu_optimizer: true,
            fp16: Fp16Config::default(),
            bf16: Bf16Config::default(),
            bfloat16: None,
            torch_autocast: TorchAutocastConfig::default(),
            data_types: DataTypesConfig::default(),
            communication_data_type: None,
            seq_parallel_communication_data_type: CommDataType::Fp32,
            prescale_gradients: false,
            gradient_predivide_factor: 1.0,
            gradient_allreduce_op: GradientAllreduceOp::Mean,
            zero_optimization: ZeroConfig::default(),
            allgather_size: None,
            activation_checkpointing: ActivationCheckpointingConfig::default(),
            pipeline: Map::new(),
            tensor_parallel: TensorParallelConfig::default(),
            expert_parallel: ExpertParallelConfig::default(),
            use_data_before_expert_parallelism: false,
            sequence_parallel_size: None,
            hybrid_engine: HybridEngineConfig::default(),
            compile: CompileConfig::default(),
            weight_quantization: None,
            data_efficiency: Map::new(),
            dataloader_drop_last: false,
            checkpoint: CheckpointConfig::default(),
            aio: AioConfig::default(),
            datastates_ckpt: None,
            steps_per_print: None,
            wall_clock_breakdown: false,
            memory_breakdown: false,
            dump_state: false,
            disable_python_gc: false,
            log_level: None,
            flops_profiler: FlopsProfilerConfig::default(),
            comms_logger: None,
            tensorboard: TensorBoardConfig::default(),
            wandb: WandbConfig::default(),
            csv_monitor: CsvMonitorConfig::default(),
            comet: CometConfig::default(),
            timers: TimersConfig::default(),
            autotuning: AutotuningConfig::default(),
            disable_allgather: false,
            vocabulary_size: None,
        }
    }
}

/// The legacy all-gather bucket size DeepSpeed uses with `"zero_optimization": true` when
/// `allgather_size` is absent.
pub const LEGACY_ALLGATHER_SIZE: u64 = 500_000_000;

/// Reads `zero_optimization` as an object, or in the legacy boolean form (true = stage 1).
fn zero_section<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ZeroConfig, D::Error> {
    match Value::deserialize(deserializer)? {
        Value::Bool(enabled) => Ok(ZeroConfig {
            stage: if enabled {
                ZeroStage::OptimizerStates
            } else {
                ZeroStage::Disabled
            },
            ..ZeroConfig::default()
        }),
        other => ZeroConfig::deserialize(other).map_err(serde::de::Error::custom),
    }
}

fn zero_section_schema(generator: &mut SchemaGenerator) -> Schema {
    let object = generator.subschema_for::<ZeroConfig>();
    json_schema!({
        "anyOf": [
            object,
            {
                "description": "Deprecated legacy form: true means ZeRO stage 1 (with `allgather_size`), false stage 0.",
                "type": "boolean",
                "deprecated": true,
            }
        ]
    })
}
