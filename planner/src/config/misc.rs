//! `activation_checkpointing` and `autotuning`: two plain dictionary-lookup sections in
//! DeepSpeed. DeepSpeed ignores unknown keys in them; dsplan refuses an unknown key in
//! `activation_checkpointing` (its six keys: `runtime/activation_checkpointing/config.py:77-94`
//! in 0.19.8), `autotuning` (`autotuning/config.py:33-86`) and `autotuning.model_info`
//! (`autotuning/config.py:88-94`, the keys of `MODEL_INFO_KEY_DEFAULT_DICT`), because a
//! misspelt one silently keeps the default (`partition_activation` trains without partitioned
//! activations).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Map;

use super::primitives::{Integer, NonNegativeInt};

/// `activation_checkpointing`: settings of DeepSpeed's activation checkpointing API
/// (`deepspeed.checkpointing`), used by Megatron-style models that call it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ActivationCheckpointingConfig {
    /// Partition the checkpointed activations across model-parallel ranks.
    pub partition_activations: bool,
    /// Copy checkpoints into one pre-allocated buffer (needs `partition_activations` and
    /// `number_checkpoints`).
    pub contiguous_memory_optimization: bool,
    /// Keep the checkpoints in CPU memory.
    pub cpu_checkpointing: bool,
    /// Number of checkpoints per forward (sizes the contiguous buffer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub number_checkpoints: Option<NonNegativeInt>,
    /// Synchronise the device at each checkpoint boundary.
    pub synchronize_checkpoint_boundary: bool,
    /// Time the checkpointing forward and recomputation.
    pub profile: bool,
}

/// What the autotuner optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AutotuningMetric {
    /// Step latency.
    Latency,
    /// Samples per second (default).
    #[default]
    Throughput,
    /// Achieved FLOPS.
    Flops,
}

/// How the autotuner explores the configuration space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TunerType {
    /// Try every point (default).
    #[default]
    Gridsearch,
    /// Random points.
    Random,
    /// A cost model guides the search.
    ModelBased,
}

/// `autotuning`: the autotuner started by `deepspeed --autotuning {tune,run}`, which searches
/// ZeRO stages and micro-batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AutotuningConfig {
    /// Turn the autotuner on.
    pub enabled: bool,
    /// Tune only the micro-batch size for each ZeRO stage (not the other knobs).
    pub fast: bool,
    /// Directory of the results; must not be empty.
    pub results_dir: String,
    /// Directory of the experiments; must not be empty.
    pub exps_dir: String,
    /// Overwrite earlier results.
    pub overwrite: bool,
    /// First step of each profiling run.
    pub start_profile_step: Integer,
    /// Last step of each profiling run.
    pub end_profile_step: Integer,
    /// What to optimise.
    pub metric: AutotuningMetric,
    /// Where the training script writes its metric; absent means the autotuner measures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metric_path: Option<String>,
    /// The search strategy.
    pub tuner_type: TunerType,
    /// Stop after this many experiments without improvement.
    pub tuner_early_stopping: Integer,
    /// Most experiments per tuning space.
    pub tuner_num_trials: Integer,
    /// Maps DeepSpeed keys to the script's command-line flags, e.g.
    /// `{"train_micro_batch_size_per_gpu": "--per_device_train_batch_size"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arg_mappings: Option<Map<String, serde_json::Value>>,
    /// What the autotuner knows of the model; absent means it profiles the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_info: Option<ModelInfoConfig>,
    /// A JSON file holding `model_info`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_info_path: Option<String>,
    /// Model-parallel degree of the experiments.
    pub mp_size: NonNegativeInt,
    /// Largest global batch size to try.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_train_batch_size: Option<NonNegativeInt>,
    /// Smallest global batch size to try.
    pub min_train_batch_size: NonNegativeInt,
    /// Largest micro-batch size per GPU to try.
    pub max_train_micro_batch_size_per_gpu: NonNegativeInt,
    /// Smallest micro-batch size per GPU to try.
    pub min_train_micro_batch_size_per_gpu: NonNegativeInt,
    /// Micro-batch sizes tried per ZeRO stage.
    pub num_tuning_micro_batch_sizes: NonNegativeInt,
}

impl Default for AutotuningConfig {
    fn default() -> Self {
        AutotuningConfig {
            enabled: false,
            fast: true,
            results_dir: "autotuning_results".into(),
            exps_dir: "autotuning_exps".into(),
            overwrite: true,
            start_profile_step: Integer(3),
            end_profile_step: Integer(5),
            metric: AutotuningMetric::Throughput,
            metric_path: None,
            tuner_type: TunerType::Gridsearch,
            tuner_early_stopping: Integer(5),
            tuner_num_trials: Integer(50),
            arg_mappings: None,
            model_info: None,
            model_info_path: None,
            mp_size: NonNegativeInt(1),
            max_train_batch_size: None,
            min_train_batch_size: NonNegativeInt(1),
            max_train_micro_batch_size_per_gpu: NonNegativeInt(1024),
            min_train_micro_batch_size_per_gpu: NonNegativeInt(1),
            num_tuning_micro_batch_sizes: NonNegativeInt(3),
        }
    }
}

/// `autotuning.model_info`: the model facts the autotuner would otherwise profile.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ModelInfoConfig {
    /// Profile the model to fill the other fields.
    pub profile: bool,
    /// Number of parameters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_params: Option<NonNegativeInt>,
    /// Hidden size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden_size: Option<NonNegativeInt>,
    /// Number of layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_layers: Option<NonNegativeInt>,
}
