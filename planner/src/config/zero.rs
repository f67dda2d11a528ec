//! `zero_optimization`: the ZeRO (Zero Redundancy Optimizer) settings.
//!
//! ZeRO removes the memory redundancy of data parallelism by partitioning training state across
//! the data-parallel ranks: stage 1 partitions the optimizer states, stage 2 also the gradients,
//! stage 3 also the parameters themselves. Gradients travel in buckets (`reduce_bucket_size`);
//! stage 3 gathers each module's parameters just before use (`stage3_prefetch_bucket_size`,
//! `stage3_max_live_parameters`, ...) and can keep small ones resident
//! (`stage3_param_persistence_threshold`). Offload moves state to the CPU or NVMe.
//!
//! In DeepSpeed this section is a pydantic model (`runtime/zero/config.py`): unknown keys are
//! rejected, every `stage3_*` key also has a short name (`max_live_parameters` for
//! `stage3_max_live_parameters`), and the four deprecated keys still work with a warning.
//! Defaults below are those of DeepSpeed 0.19.8's code (which differ from its docs in places).

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::offload::{OffloadOptimizerConfig, OffloadParamConfig};
use super::primitives::{AutoOr, Integer, NonNegativeInt, PositiveInt};
use super::zenflow::ZenflowConfig;

/// Which training state ZeRO partitions across the data-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum ZeroStage {
    /// 0: ZeRO off, plain data parallelism.
    #[default]
    Disabled = 0,
    /// 1: optimizer states partitioned.
    OptimizerStates = 1,
    /// 2: optimizer states and gradients partitioned.
    Gradients = 2,
    /// 3: optimizer states, gradients and parameters partitioned.
    Weights = 3,
}

impl ZeroStage {
    /// The stage number, 0 to 3.
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The stage with this number.
    pub fn from_number(number: u64) -> Option<Self> {
        match number {
            0 => Some(ZeroStage::Disabled),
            1 => Some(ZeroStage::OptimizerStates),
            2 => Some(ZeroStage::Gradients),
            3 => Some(ZeroStage::Weights),
            _ => None,
        }
    }
}

impl Serialize for ZeroStage {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.number())
    }
}

impl<'de> Deserialize<'de> for ZeroStage {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let number = NonNegativeInt::deserialize(deserializer)?.get();
        ZeroStage::from_number(number).ok_or_else(|| {
            serde::de::Error::custom(format!("ZeRO stage must be 0, 1, 2 or 3, found {number}"))
        })
    }
}

impl JsonSchema for ZeroStage {
    fn schema_name() -> Cow<'static, str> {
        "ZeroStage".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "ZeRO stage: 0 = off (plain data parallelism), 1 = optimizer states partitioned, 2 = also gradients, 3 = also parameters.",
            "type": "integer",
            "enum": [0, 1, 2, 3],
        })
    }
}

/// `zero_optimization`: every ZeRO setting. Absent means stage 0 with these defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ZeroConfig {
    /// What ZeRO partitions: 0 = nothing, 1 = optimizer states, 2 = + gradients,
    /// 3 = + parameters.
    pub stage: ZeroStage,
    /// Copy gradients into one contiguous buffer as they are produced (avoids fragmentation
    /// during backward). Forced on by CPU offload in stages 1 and 2.
    pub contiguous_gradients: bool,
    /// Average gradients with reduce/reduce-scatter rather than all-reduce. (In stages 1 and 2
    /// with `use_multi_rank_bucket_allreduce` the bucket is still all-reduced.)
    pub reduce_scatter: bool,
    /// Elements per gradient bucket reduced at a time (in stages 1/2 a second bucket exists
    /// when `overlap_comm`). Must be positive. The Hugging Face Trainer fills `"auto"` with
    /// hidden_size².
    pub reduce_bucket_size: AutoOr<PositiveInt>,
    /// Stages 1/2: all-reduce a whole bucket and let each rank keep its slices, instead of one
    /// reduce per destination rank.
    pub use_multi_rank_bucket_allreduce: bool,
    /// Gather updated parameters with all-gather (true) or a series of broadcasts (false).
    /// Parsed but no longer changes what the runtime does.
    pub allgather_partitions: bool,
    /// Elements all-gathered at a time when `all_gather_into_tensor` is unavailable; must be
    /// even.
    pub allgather_bucket_size: NonNegativeInt,
    /// Overlap gradient reduction with the backward pass. Absent means true for stage 3 and
    /// false otherwise (the docs say false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlap_comm: Option<bool>,
    /// Stages 1/2: compute and keep the global gradient norm each step. False is allowed only
    /// with stage 1 or 2, gradient clipping off and no caller of `get_global_grad_norm()`.
    pub compute_grad_norm: bool,
    /// Initialise the fp32 master weights from the fp32 copies in a checkpoint (no precision
    /// loss) rather than from the 16-bit model weights.
    pub load_from_fp32_weights: bool,
    /// Legacy elastic checkpointing (stages 1/2). Stage 3 no longer supports it: use universal
    /// checkpoints (`checkpoint.load_universal`).
    #[schemars(extend("deprecated" = true))]
    pub elastic_checkpoint: bool,
    /// Offload the (partitioned) parameters to CPU or NVMe. Stage 3 only; stages 1 and 2 ignore
    /// it silently.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_param: Option<OffloadParamConfig>,
    /// Offload optimizer states and the optimizer step to CPU (or NVMe, stage 3).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offload_optimizer: Option<OffloadOptimizerConfig>,
    /// ZenFlow: update only the important gradient columns on the GPU each step and the rest
    /// asynchronously on the CPU. Present means enabled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zenflow: Option<ZenflowConfig>,
    /// Stage 3: parameter elements per optimizer sub-group (the tile the optimizer step and
    /// NVMe swapping work on). The docs say 1e12; the code's default is 1e9.
    pub sub_group_size: NonNegativeInt,
    /// Deprecated: `true` means `offload_param: {"device": "cpu"}`. Cannot be combined with
    /// `offload_param`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub cpu_offload_param: Option<bool>,
    /// Deprecated and without effect: use `pin_memory` in `offload_param` or
    /// `offload_optimizer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub cpu_offload_use_pin_memory: Option<bool>,
    /// Deprecated: `true` means `offload_optimizer: {"device": "cpu"}`. Cannot be combined
    /// with `offload_optimizer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("deprecated" = true))]
    pub cpu_offload: Option<bool>,
    /// Stage 3: most parameter elements fetched ahead of use. The docs say 5e8; the code's
    /// default is 5e7. The Hugging Face Trainer fills `"auto"` with int(0.9 × hidden_size²).
    #[serde(rename = "stage3_prefetch_bucket_size", alias = "prefetch_bucket_size")]
    pub prefetch_bucket_size: AutoOr<NonNegativeInt>,
    /// Stage 3: parameters with at most this many elements are not partitioned (kept whole on
    /// every rank). The Hugging Face Trainer fills `"auto"` with 10 × hidden_size.
    #[serde(
        rename = "stage3_param_persistence_threshold",
        alias = "param_persistence_threshold"
    )]
    pub param_persistence_threshold: AutoOr<NonNegativeInt>,
    /// Stage 3: cap on the total elements kept whole by `stage3_param_persistence_threshold`.
    /// Absent means unlimited (DeepSpeed's default is sys.maxsize, 9223372036854775807).
    #[serde(
        rename = "stage3_model_persistence_threshold",
        alias = "model_persistence_threshold",
        skip_serializing_if = "Option::is_none",
        deserialize_with = "super::primitives::some_not_null"
    )]
    #[schemars(with = "NonNegativeInt")]
    pub model_persistence_threshold: Option<NonNegativeInt>,
    /// Stage 3: most gathered parameter elements held before releasing; caps prefetching
    /// only, not on-demand fetches.
    #[serde(rename = "stage3_max_live_parameters", alias = "max_live_parameters")]
    pub max_live_parameters: NonNegativeInt,
    /// Stage 3: keep a parameter gathered if it is used again within this many elements.
    #[serde(rename = "stage3_max_reuse_distance", alias = "max_reuse_distance")]
    pub max_reuse_distance: NonNegativeInt,
    /// Stage 3: gather the full 16-bit weights when saving with `save_16bit_model()`.
    /// Hugging Face Accelerate (which the Trainer also goes through) fills `"auto"` with false.
    #[serde(
        rename = "stage3_gather_16bit_weights_on_model_save",
        alias = "gather_16bit_weights_on_model_save"
    )]
    pub gather_16bit_weights_on_model_save: AutoOr<bool>,
    /// Stage 3: modules whose parameter count / (1 + descendants) is below this are fetched as
    /// one unit. 0 disables.
    #[serde(
        rename = "stage3_module_granularity_threshold",
        alias = "module_granularity_threshold"
    )]
    pub module_granularity_threshold: Integer,
    /// Stage 3: fetch a module's parameters with all-reduce instead of all-gather.
    #[serde(
        rename = "stage3_use_all_reduce_for_fetch_params",
        alias = "use_all_reduce_for_fetch_params"
    )]
    pub use_all_reduce_for_fetch_params: bool,
    /// Stage 3: all-gather parameters one at a time instead of in buckets (less copying and
    /// lower peak memory).
    #[serde(rename = "stage3_allgather_sequential", alias = "allgather_sequential")]
    pub allgather_sequential: bool,
    /// Deprecated spelling of `stage3_gather_16bit_weights_on_model_save`.
    #[schemars(extend("deprecated" = true))]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage3_gather_fp16_weights_on_model_save: Option<bool>,
    /// Stage 2: ignore parameters that get no gradient instead of failing.
    pub ignore_unused_parameters: bool,
    /// The pre-0.5.9 ZeRO-1 implementation; `true` is no longer supported.
    pub legacy_stage1: bool,
    /// Stages 1/2 with CPU offload: spread gradient copies over ranks by fine-grained
    /// partitioning.
    pub round_robin_gradients: bool,
    /// Stages 1/2: pad the flat buffers so every parameter starts 16-byte aligned (costs
    /// memory).
    pub parameter_alignment: bool,
    /// ZeRO++ hpZ: ranks in the secondary (intra-node) parameter partition group; 1 disables.
    pub zero_hpz_partition_size: NonNegativeInt,
    /// ZeRO++ qwZ: quantize weights for the all-gather.
    pub zero_quantized_weights: bool,
    /// Store non-trainable weights quantized (useful for LoRA).
    pub zero_quantized_nontrainable_weights: bool,
    /// ZeRO++ qgZ: quantize gradients for the reduction.
    pub zero_quantized_gradients: bool,
    /// Stage 3: memory-efficient linear layer implementation.
    pub memory_efficient_linear: bool,
    /// Stage 3: load checkpoints in pipeline mode.
    pub pipeline_loading_checkpoint: bool,
    /// Stage 3: override `nn.Module.apply` so it sees gathered parameters.
    pub override_module_apply: bool,
    /// Stage 3: log trace-cache warnings (e.g. invalidations).
    pub log_trace_cache_warnings: bool,
    /// Internal sanity checks (debugging).
    pub enable_sanity_checks: bool,
    /// Stage 3 with NVMe offload and Muon: keep Muon's momentum buffer in memory.
    pub save_muon_momentum_buffer_in_memory: bool,
    /// Stage 3: modules treated as leaves (their parameters fetched as one unit, no hooks
    /// inside).
    pub leaf_module: LeafModuleConfig,
}

impl Default for ZeroConfig {
    fn default() -> Self {
        ZeroConfig {
            stage: ZeroStage::Disabled,
            contiguous_gradients: true,
            reduce_scatter: true,
            reduce_bucket_size: AutoOr::Value(PositiveInt::const_new(500_000_000)),
            use_multi_rank_bucket_allreduce: true,
            allgather_partitions: true,
            allgather_bucket_size: NonNegativeInt(500_000_000),
            overlap_comm: None,
            compute_grad_norm: true,
            load_from_fp32_weights: true,
            elastic_checkpoint: false,
            offload_param: None,
            offload_optimizer: None,
            zenflow: None,
            sub_group_size: NonNegativeInt(1_000_000_000),
            cpu_offload_param: None,
            cpu_offload_use_pin_memory: None,
            cpu_offload: None,
            prefetch_bucket_size: AutoOr::Value(NonNegativeInt(50_000_000)),
            param_persistence_threshold: AutoOr::Value(NonNegativeInt(100_000)),
            model_persistence_threshold: None,
            max_live_parameters: NonNegativeInt(1_000_000_000),
            max_reuse_distance: NonNegativeInt(1_000_000_000),
            gather_16bit_weights_on_model_save: AutoOr::Value(false),
            module_granularity_threshold: Integer(0),
            use_all_reduce_for_fetch_params: false,
            allgather_sequential: false,
            stage3_gather_fp16_weights_on_model_save: None,
            ignore_unused_parameters: true,
            legacy_stage1: false,
            round_robin_gradients: false,
            parameter_alignment: false,
            zero_hpz_partition_size: NonNegativeInt(1),
            zero_quantized_weights: false,
            zero_quantized_nontrainable_weights: false,
            zero_quantized_gradients: false,
            memory_efficient_linear: true,
            pipeline_loading_checkpoint: false,
            override_module_apply: true,
            log_trace_cache_warnings: false,
            enable_sanity_checks: false,
            save_muon_momentum_buffer_in_memory: false,
            leaf_module: LeafModuleConfig::default(),
        }
    }
}

impl ZeroConfig {
    /// `overlap_comm` as DeepSpeed resolves it: the given value, else true exactly for stage 3.
    pub fn overlap_comm_resolved(&self) -> bool {
        self.overlap_comm
            .unwrap_or(self.stage == ZeroStage::Weights)
    }
}

/// The Mixture-of-Experts blocks DeepSpeed treats as ZeRO-3 leaf modules by default.
pub const DEFAULT_LEAF_MODULE_CLASSES: &[&str] = &[
    "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
];

/// `zero_optimization.leaf_module`: modules ZeRO-3 fetches as one unit, chosen by class, by
/// name or by name suffix. Each list may also be given as a single string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LeafModuleConfig {
    /// Fully qualified class names. The default lists the Mixtral, Qwen2-MoE and Qwen3-MoE
    /// sparse MoE blocks.
    pub classes: StringList,
    /// Module names (as in `named_modules()`).
    pub names: StringList,
    /// Module name suffixes.
    pub name_suffixes: StringList,
}

impl Default for LeafModuleConfig {
    fn default() -> Self {
        LeafModuleConfig {
            classes: StringList(
                DEFAULT_LEAF_MODULE_CLASSES
                    .iter()
                    .map(|s| (*s).to_string())
                    .collect(),
            ),
            names: StringList::default(),
            name_suffixes: StringList::default(),
        }
    }
}

/// A list of strings that may also be written as one string (`"x"` means `["x"]`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct StringList(pub Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        match OneOrMany::deserialize(deserializer) {
            Ok(OneOrMany::One(one)) => Ok(StringList(vec![one])),
            Ok(OneOrMany::Many(many)) => Ok(StringList(many)),
            Err(_) => Err(serde::de::Error::custom(
                "expected a string or a list of strings",
            )),
        }
    }
}

impl JsonSchema for StringList {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "StringList".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                { "type": "array", "items": { "type": "string" } },
                { "type": "string" },
            ]
        })
    }
}
