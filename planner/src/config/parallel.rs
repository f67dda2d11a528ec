//! Model parallelism and compilation: `tensor_parallel` (AutoTP training), `hybrid_engine`
//! (RLHF train/generate switching), `weight_quantization` and `compile` (DeepCompile).
//!
//! All four are pydantic models in DeepSpeed: unknown keys are rejected. In particular
//! `compile` takes no `backend` or `disable` key (those belong to `engine.compile()`'s
//! arguments).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::primitives::{NonNegativeInt, PositiveInt};

/// The cross-entropy implementation used with a vocabulary-parallel `lm_head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VocabParallelCeBackend {
    /// The PyTorch reference implementation (default).
    #[default]
    Torch,
    /// Liger's fused kernel.
    Liger,
}

/// `tensor_parallel`: automatic tensor parallelism (AutoTP) for training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TensorParallelConfig {
    /// Tensor-parallel degree for AutoTP training; 0 disables.
    pub autotp_size: NonNegativeInt,
    /// Overlap the tensor-parallel all-reduce with computation.
    pub tp_overlap_comm: bool,
    /// Shard the vocabulary of `lm_head`: true requires it, false disables it, absent follows
    /// the Hugging Face tied-embedding plan when supported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vocab_parallel_lm_head: Option<bool>,
    /// Cross-entropy implementation for a vocabulary-parallel `lm_head`.
    pub vocab_parallel_ce_backend: VocabParallelCeBackend,
    /// Inference-style tensor-parallel settings (short name `tp`).
    #[serde(rename = "tensor_parallel", alias = "tp")]
    pub tensor_parallel: TpConfig,
    /// Explicit injection policy: the names of the attention-output and MLP-output linears.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub injection_policy_tuple: Option<Vec<Value>>,
    /// Custom layer partitioning rules (`use_default_specs`, `layer_specs` with `patterns`,
    /// `partition_type`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition_config: Option<Map<String, Value>>,
    /// A built-in partitioning preset: `llama`, `bloom`, `chatglm`, `mixtral`, `deepseek_v2`,
    /// `qwen2`, `phi3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset_model: Option<String>,
    /// Keep loaded checkpoint tensors on the host instead of moving them to the device.
    pub keep_module_on_host: bool,
    /// Inject DeepSpeed's inference kernels (short name `kernel_inject`).
    #[serde(rename = "replace_with_kernel_inject", alias = "kernel_inject")]
    pub replace_with_kernel_inject: bool,
}

impl Default for TensorParallelConfig {
    fn default() -> Self {
        TensorParallelConfig {
            autotp_size: NonNegativeInt(0),
            tp_overlap_comm: false,
            vocab_parallel_lm_head: None,
            vocab_parallel_ce_backend: VocabParallelCeBackend::Torch,
            tensor_parallel: TpConfig::default(),
            injection_policy_tuple: None,
            partition_config: None,
            preset_model: None,
            keep_module_on_host: false,
            replace_with_kernel_inject: false,
        }
    }
}

/// `tensor_parallel.tensor_parallel` (or `.tp`): inference-style tensor-parallel settings.
/// (DeepSpeed's `mpu` and `tp_group` fields take Python objects and cannot come from JSON.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TpConfig {
    /// Number of devices the model is split across.
    pub tp_size: NonNegativeInt,
    /// Granularity of MLP/`lm_head` splits.
    pub tp_grain_size: NonNegativeInt,
}

impl Default for TpConfig {
    fn default() -> Self {
        TpConfig {
            tp_size: NonNegativeInt(1),
            tp_grain_size: NonNegativeInt(1),
        }
    }
}

/// `hybrid_engine`: switch one model between training and fast generation (DeepSpeed-Chat
/// RLHF).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HybridEngineConfig {
    /// Use the hybrid engine.
    pub enabled: bool,
    /// Most tokens generated per call; must be positive.
    pub max_out_tokens: PositiveInt,
    /// Tensor-parallel degree during generation.
    pub inference_tp_size: NonNegativeInt,
    /// Free the inference KV cache after generation.
    pub release_inference_cache: bool,
    /// Keep the gathered inference parameters pinned.
    pub pin_parameters: bool,
    /// Partition size for gathering tensor-parallel weights.
    pub tp_gather_partition_size: NonNegativeInt,
    /// Capture generation in CUDA graphs.
    pub enable_cuda_graph: bool,
}

impl Default for HybridEngineConfig {
    fn default() -> Self {
        HybridEngineConfig {
            enabled: false,
            max_out_tokens: PositiveInt::const_new(512),
            inference_tp_size: NonNegativeInt(1),
            release_inference_cache: false,
            pin_parameters: true,
            tp_gather_partition_size: NonNegativeInt(8),
            enable_cuda_graph: false,
        }
    }
}

/// Symmetric or asymmetric quantization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuantizationType {
    /// Zero-point fixed at 0 (default).
    #[default]
    Symmetric,
    /// With a zero-point.
    Asymmetric,
}

/// `weight_quantization`: quantize weights at load or after initialisation (ZeRO-Inference
/// style).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct WeightQuantizationConfig {
    /// Quantize weights.
    pub enabled: bool,
    /// Bits per weight.
    pub num_bits: NonNegativeInt,
    /// Symmetric or asymmetric.
    pub q_type: QuantizationType,
    /// Quantization groups.
    pub q_groups: NonNegativeInt,
    /// Quantize while the weights are initialised (settings passed to the quantizer).
    pub quantized_initialization: Map<String, Value>,
    /// Quantize after initialisation (settings passed to the quantizer).
    pub post_init_quant: Map<String, Value>,
}

impl Default for WeightQuantizationConfig {
    fn default() -> Self {
        WeightQuantizationConfig {
            enabled: true,
            num_bits: NonNegativeInt(8),
            q_type: QuantizationType::Symmetric,
            q_groups: NonNegativeInt(1),
            quantized_initialization: Map::new(),
            post_init_quant: Map::new(),
        }
    }
}

/// A DeepCompile optimisation pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CompilePass {
    /// ZeRO-1 pass.
    Z1,
    /// ZeRO-3 pass.
    Z3,
    /// Automatic sequence parallelism.
    Autosp,
    /// Automatic tensor parallelism.
    Autotp,
}

/// `compile`: DeepCompile, DeepSpeed's graph-level optimisations applied when the script calls
/// `engine.compile()`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CompileConfig {
    /// Turn on DeepCompile.
    pub deepcompile: bool,
    /// Compile the callable parents of AutoEP layers while keeping AutoEP eager.
    pub autoep_non_moe: bool,
    /// Free activations eagerly.
    pub free_activation: bool,
    /// With `free_activation`: activations of at least this many bytes are freed eagerly.
    pub free_activation_threshold: NonNegativeInt,
    /// Move saved activations (≥ 5 MB, fixed shape) to pinned host memory and back before
    /// backward; exclusive with `offload_parameters` and `offload_opt_states`.
    pub offload_activation: bool,
    /// Pin the host buffers of activation offload.
    pub offload_activation_pin_memory: bool,
    /// Offload fp32 master weights and Adam moments to host memory during forward/backward;
    /// designed for gradient_accumulation_steps = 1.
    pub offload_opt_states: bool,
    /// Double buffering.
    pub double_buffer: bool,
    /// Symmetric memory.
    pub symmetric_memory: bool,
    /// Dump the graphs.
    pub debug_log: bool,
    /// Offload parameters.
    pub offload_parameters: bool,
    /// Synchronise before each reduce.
    pub sync_before_reduce: bool,
    /// Synchronise after each reduce.
    pub sync_after_reduce: bool,
    /// Synchronise before each all-gather.
    pub sync_before_allgather: bool,
    /// Synchronise after each all-gather.
    pub sync_after_allgather: bool,
    /// Keep real values of integer input tensors instead of dummies.
    pub keep_int_input_tensors: bool,
    /// Keep real values of all input tensors instead of dummies.
    pub keep_all_input_tensors: bool,
    /// The optimisation passes to compose; absent means DeepCompile's choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes: Option<Vec<CompilePass>>,
}

impl Default for CompileConfig {
    fn default() -> Self {
        CompileConfig {
            deepcompile: false,
            autoep_non_moe: false,
            free_activation: false,
            free_activation_threshold: NonNegativeInt(10 * 1024 * 1024),
            offload_activation: false,
            offload_activation_pin_memory: true,
            offload_opt_states: false,
            double_buffer: true,
            symmetric_memory: false,
            debug_log: false,
            offload_parameters: false,
            sync_before_reduce: false,
            sync_after_reduce: false,
            sync_before_allgather: false,
            sync_after_allgather: false,
            keep_int_input_tensors: true,
            keep_all_input_tensors: false,
            passes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_rejects_torch_compile_arguments() {
        let bad = serde_json::json!({"disable": false, "backend": "inductor"});
        assert!(serde_json::from_value::<CompileConfig>(bad).is_err());
    }
}
