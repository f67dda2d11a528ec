//! Mixed precision: `fp16` (with its dynamic loss scaler), `bf16`, the legacy `bfloat16`
//! spelling, `torch_autocast`, `data_types` and the communication dtypes.
//!
//! `fp16` and `bf16` are pydantic models in DeepSpeed 0.19.8 (`runtime/precision_config.py`):
//! unknown keys are rejected, so apex's `opt_level` inside `fp16` or loss-scaler keys inside
//! `bf16` fail. `torch_autocast` and `data_types` are plain dictionary lookups
//! (`runtime/constants.py:186-191, 383-391`); dsplan refuses unknown keys in them too, since a
//! typo there silently keeps the default.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::primitives::{AutoOr, DtypeName, Integer, case_insensitive_enum};

/// `fp16`: IEEE half-precision training with loss scaling.
///
/// `loss_scale` 0 selects the dynamic loss scaler: it starts at 2^`initial_scale_power`,
/// halves on overflow (after `hysteresis` overflows) and doubles after `loss_scale_window`
/// clean steps. Note DeepSpeed's default trap: unless one of the five scaler keys is written,
/// the ZeRO optimizers use their own defaults (2^32 initial scale, no hysteresis).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Fp16Config {
    /// Train in fp16. The Hugging Face Trainer fills `"auto"` from `--fp16`.
    pub enabled: AutoOr<bool>,
    /// Cast floating-point inputs of `forward` to fp16.
    pub auto_cast: bool,
    /// 0 for dynamic loss scaling, otherwise the fixed (static) loss scale.
    #[schemars(range(min = 0.0))]
    pub loss_scale: f64,
    /// Dynamic scaling starts at 2^initial_scale_power.
    pub initial_scale_power: Integer,
    /// Clean steps before the dynamic scale doubles; must be positive with dynamic scaling.
    pub loss_scale_window: Integer,
    /// Overflows tolerated before the scale is halved (the "delayed shift").
    pub hysteresis: Integer,
    /// Refill the hysteresis budget on every clean step, not only at window boundaries.
    pub consecutive_hysteresis: bool,
    /// Floor of the dynamic loss scale: an integer (0.19.8 rejects fractions such as 0.5),
    /// positive with dynamic scaling.
    pub min_loss_scale: Integer,
    /// Keep master weights and gradients in fp16 (ZeRO with DeepSpeedCPUAdam only).
    pub fp16_master_weights_and_grads: bool,
}

impl Default for Fp16Config {
    fn default() -> Self {
        Fp16Config {
            enabled: AutoOr::Value(false),
            auto_cast: false,
            loss_scale: 0.0,
            initial_scale_power: Integer(16),
            loss_scale_window: Integer(1000),
            hysteresis: Integer(2),
            consecutive_hysteresis: false,
            min_loss_scale: Integer(1),
            fp16_master_weights_and_grads: false,
        }
    }
}

/// `bf16`: bfloat16 training (no loss scaling needed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct Bf16Config {
    /// Train in bf16. The Hugging Face Trainer fills `"auto"` from `--bf16`.
    pub enabled: AutoOr<bool>,
    /// Add each gradient into the fp32 accumulation buffer during backward instead of after it.
    pub immediate_grad_update: bool,
    /// Detect gradient overflow before the optimizer step and skip the step when found.
    pub check_grad_overflow: bool,
    /// ZeRO 1-3: keep master weights and gradients in bf16.
    pub bf16_master_weights_and_grads: bool,
    /// ZeRO 1-3: keep optimizer states in bf16 (needs `bf16_master_weights_and_grads`).
    pub bf16_optimizer_states: bool,
}

impl Default for Bf16Config {
    fn default() -> Self {
        Bf16Config {
            enabled: AutoOr::Value(false),
            immediate_grad_update: false,
            check_grad_overflow: true,
            bf16_master_weights_and_grads: false,
            bf16_optimizer_states: false,
        }
    }
}

/// `bfloat16`: the old name of `bf16`, read only when `bf16` is absent. Same fields, but the
/// Hugging Face Trainer never fills `"auto"` here (DeepSpeed would silently read it as false).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
#[serde(transparent)]
pub struct LegacyBf16Config(pub Bf16Config);

impl<'de> Deserialize<'de> for LegacyBf16Config {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = Value::deserialize(deserializer)?;
        if raw.get("enabled").and_then(Value::as_str) == Some("auto") {
            return Err(serde::de::Error::custom(
                "`bfloat16.enabled` cannot be \"auto\": the Hugging Face Trainer only fills `bf16.enabled`",
            ));
        }
        Bf16Config::deserialize(raw)
            .map(LegacyBf16Config)
            .map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for LegacyBf16Config {
    fn schema_name() -> Cow<'static, str> {
        "LegacyBf16Config".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let mut schema = Bf16Config::json_schema(generator);
        if let Some(enabled) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut("enabled"))
        {
            *enabled = json_schema!({
                "description": "Train in bf16.",
                "type": "boolean",
                "default": false,
            })
            .to_value();
        }
        schema.insert(
            "description".into(),
            "Deprecated spelling of `bf16`, read only when `bf16` is absent.".into(),
        );
        schema
    }
}

/// `torch_autocast`: run forward under `torch.autocast` instead of casting the whole model.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TorchAutocastConfig {
    /// Turn torch autocast on.
    pub enabled: bool,
    /// The lower-precision dtype autocast uses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DtypeName>,
    /// Fully qualified module classes safe to run in lower precision (e.g.
    /// `torch.nn.modules.linear.Linear`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lower_precision_safe_modules: Option<Vec<String>>,
}

/// Which buffers `data_types.keep_in_fp32_modules` keeps in fp32 under bf16/fp16 training.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KeepInFp32Modules {
    /// DeepSpeed's own `"auto"`: the model's `_keep_in_fp32_modules_strict` (and
    /// `_keep_in_fp32_modules` under fp16) from transformers.
    #[default]
    Auto,
    /// Modules matching these name patterns (an empty list keeps nothing).
    Patterns(Vec<String>),
}

impl Serialize for KeepInFp32Modules {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            KeepInFp32Modules::Auto => serializer.serialize_str("auto"),
            KeepInFp32Modules::Patterns(patterns) => patterns.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for KeepInFp32Modules {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(text) if text == "auto" => Ok(KeepInFp32Modules::Auto),
            other => Vec::<String>::deserialize(other)
                .map(KeepInFp32Modules::Patterns)
                .map_err(|_| {
                    serde::de::Error::custom(
                        "keep_in_fp32_modules must be \"auto\" or a list of name patterns",
                    )
                }),
        }
    }
}

impl JsonSchema for KeepInFp32Modules {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "KeepInFp32Modules".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                { "type": "string", "enum": ["auto"] },
                { "type": "array", "items": { "type": "string" } },
            ]
        })
    }
}

/// `data_types`: dtypes DeepSpeed uses for particular buffers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataTypesConfig {
    /// Dtype gradients are accumulated in. Absent: the model dtype under ZeRO, fp32 for bf16
    /// without ZeRO.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_accum_dtype: Option<DtypeName>,
    /// Dtype the parameters are cast to; must match the enabled fp16/bf16 mode. Absent: the
    /// mixed-precision dtype.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param_dtype: Option<DtypeName>,
    /// Dtype the buffers are cast to. Absent: as loaded (e.g. fp32 rotary `inv_freq`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buffer_dtype: Option<DtypeName>,
    /// Buffers kept in fp32 under bf16/fp16: DeepSpeed's own `"auto"` (from the transformers
    /// model) or a list of name patterns.
    pub keep_in_fp32_modules: KeepInFp32Modules,
}

case_insensitive_enum! {
    /// A dtype for gradient communication (`communication_data_type`,
    /// `seq_parallel_communication_data_type`).
    pub enum CommDataType {
        /// 32-bit float.
        Fp32 => "fp32",
        /// fp16.
        Fp16 => "fp16",
        /// bf16.
        Bf16 => "bf16",
    }
}

case_insensitive_enum! {
    /// How gradients are combined across data-parallel ranks.
    pub enum GradientAllreduceOp {
        /// The average (DeepSpeed's default).
        Mean => "mean",
        /// The sum (not supported with ZeRO stage 3, ZenFlow or DeepCompile).
        Sum => "sum",
    }
}
