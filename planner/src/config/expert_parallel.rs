//! `expert_parallel`: AutoEP, DeepSpeed's automatic expert parallelism for MoE models.
//!
//! DeepSpeed 0.19.8 reads the section key by key with `dict.get` and ignores any other key
//! (`module_inject/auto_ep_config.py:42-97`), so a misspelt key silently keeps its default.
//! dsplan lists every key it reads and refuses any other, as in the pydantic sections. The
//! values stay untyped: DeepSpeed checks them itself when AutoEP starts
//! (`validate_autoep_config`), and the planner does not model expert parallelism.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `expert_parallel`: every key `parse_autoep_config` reads.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ExpertParallelConfig {
    /// Turn AutoEP on (default false).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub enabled: Option<Value>,
    /// Expert-parallel degree (default 1).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub autoep_size: Option<Value>,
    /// Tensor-parallel degree inside each expert (default 1).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_tensor_parallel_size: Option<Value>,
    /// Check the folded AutoEP+AutoTP routing (a boolean, default false).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub validate_folding_routing: Option<Value>,
    /// Split the token plan asynchronously (a boolean, default false).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub async_split_plan: Option<Value>,
    /// A model preset naming the MoE layers (absent: detect them).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub preset_model: Option<Value>,
    /// Pattern of the MoE layer module names.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub moe_layer_pattern: Option<Value>,
    /// Pattern of the experts' module names.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_pattern: Option<Value>,
    /// Pattern of the router's module name.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub router_pattern: Option<Value>,
    /// Run the experts as one grouped matrix multiply (default true).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub use_grouped_mm: Option<Value>,
    /// Do not use the Triton grouped matrix multiply (default false).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub disable_triton_grouped_mm: Option<Value>,
    /// Normalise the routing weights (absent: the preset decides).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub route_norm: Option<Value>,
    /// Scale of the routing weights (default 1.0).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub route_scale: Option<Value>,
    /// Where the routing scores are applied (default "auto").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub score_apply: Option<Value>,
    /// How expert outputs are combined (default "auto").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub combine_impl: Option<Value>,
    /// How rows are weighted (default "auto").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub row_weighting_impl: Option<Value>,
    /// Gate and up projections fused or separate (default "separate").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub gate_up_impl: Option<Value>,
    /// The all-to-all backend (default "comm").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub comm_backend: Option<Value>,
    /// Streaming multiprocessors given to communication (default 12).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub comm_num_sm: Option<Value>,
    /// Queue-pair margin of the communication backend (default 4).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub comm_qp_margin: Option<Value>,
    /// Most tokens a rank sends (default 0: no bound).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub comm_max_tokens_per_rank: Option<Value>,
    /// Number of expert groups for group-limited routing.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub num_expert_groups: Option<Value>,
    /// Groups each token may be routed to.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub num_limited_groups: Option<Value>,
    /// Routing score function (default "auto").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub score_func: Option<Value>,
    /// Experts per token (default "auto": the model's).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub top_k: Option<Value>,
    /// Unsupported: any value other than null is refused.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub load_balance_coeff: Option<Value>,
    /// Scale of the routed experts' output (default "auto").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub routed_scaling_factor: Option<Value>,
    /// Name of the experts' first weight.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_w1: Option<Value>,
    /// Name of the experts' second weight.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_w2: Option<Value>,
    /// Name of the experts' third weight (null: fused with w1).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_w3: Option<Value>,
    /// Model attribute holding the number of experts.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub num_experts_attr: Option<Value>,
    /// Model attribute holding top-k.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub top_k_attr: Option<Value>,
    /// Whether the MoE layers have shared experts.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub has_shared_experts: Option<Value>,
    /// Pattern of the shared experts' module names.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub shared_experts_pattern: Option<Value>,
    /// Pattern of the shared experts' gate.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub shared_experts_gate_pattern: Option<Value>,
    /// The experts' activation function.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub expert_activation: Option<Value>,
}

/// A key that is present keeps its value, `null` included (`expert_w3: null` means "fused",
/// which is not the same as leaving it out).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

impl ExpertParallelConfig {
    /// Whether no key is given (the section is then left out of a resolved config).
    pub fn is_empty(&self) -> bool {
        *self == ExpertParallelConfig::default()
    }
}
