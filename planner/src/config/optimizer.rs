//! `optimizer`: which optimizer DeepSpeed builds, and its constructor arguments.
//!
//! DeepSpeed lower-cases `type` when it names one of its own optimizers (`Adam`, `AdamW`,
//! `Adagrad`, `Lamb`, `Lion`, `MuAdam`, `MuAdamW`, `MuSGD`, `Muon`, any letter case); any other
//! name must be an exact `torch.optim` class (`SGD`, `RMSprop`, ...). `params` become keyword
//! arguments of the constructor, so which names are valid depends on `type`
//! ([`crate::config::registry::OPTIMIZERS`] lists them). Note that `"Adam"` performs AdamW
//! (decoupled weight decay) unless `adam_w_mode` is false.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::primitives::AutoOr;

/// `optimizer`: absent means the training script passes its own optimizer (or none).
///
/// DeepSpeed reads `type`, `params` and `legacy_fusion` by name (`runtime/config.py:288-313` in
/// 0.19.8) and ignores any other key; dsplan refuses one, since a misspelt `params` silently
/// trains with the optimizer's default learning rate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerConfig {
    /// The optimizer: a DeepSpeed name (`Adam`, `AdamW`, `Adagrad`, `Lamb`, `Lion`, `MuAdam`,
    /// `MuAdamW`, `MuSGD`, `Muon`; any letter case) or an exact `torch.optim` class name.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("examples" = ["AdamW", "Adam", "Lamb", "Lion", "Adagrad", "Muon", "SGD"]))]
    pub kind: Option<String>,
    /// Keyword arguments for the optimizer's constructor.
    pub params: OptimizerParams,
    /// Use the legacy fused-Adam path of the (non-ZeRO) fp16 optimizer.
    pub legacy_fusion: bool,
}

/// `optimizer.params`: constructor arguments. The four the Hugging Face Trainer fills are
/// typed; so are the switches DeepSpeed itself consumes; anything else is passed through to the
/// constructor (an unknown name fails there with a TypeError).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct OptimizerParams {
    /// Learning rate. The Hugging Face Trainer fills `"auto"` from `--learning_rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr: Option<AutoOr<f64>>,
    /// Adam-style (beta1, beta2). The Hugging Face Trainer fills `"auto"` from
    /// `--adam_beta1`/`--adam_beta2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub betas: Option<AutoOr<[f64; 2]>>,
    /// Term added to the denominator for stability. The Hugging Face Trainer fills `"auto"`
    /// from `--adam_epsilon`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eps: Option<AutoOr<f64>>,
    /// Weight decay (decoupled in AdamW mode, L2 otherwise). The Hugging Face Trainer fills
    /// `"auto"` from `--weight_decay`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<AutoOr<f64>>,
    /// Adam/AdamW/Lamb: apply bias correction to the moment estimates (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias_correction: Option<bool>,
    /// Adam/Muon: decoupled weight decay (AdamW). DeepSpeed's default is true, so type `Adam`
    /// behaves as AdamW unless this is false. Consumed by DeepSpeed, not the constructor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub adam_w_mode: Option<bool>,
    /// Adam/AdamW/Muon: use `torch.optim.Adam(W)` instead of DeepSpeed's fused or CPU Adam.
    /// Consumed by DeepSpeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub torch_adam: Option<bool>,
    /// Adam with CPU offload: keep the CPU optimizer states in fp32 (default true). Consumed
    /// by DeepSpeed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fp32_optimizer_states: Option<bool>,
    /// Every other constructor argument, passed through unchecked.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}
