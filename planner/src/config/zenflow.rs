//! `zero_optimization.zenflow`: ZenFlow, which updates only the most important gradient columns
//! on the GPU every step and applies the rest on the CPU asynchronously (a pydantic model in
//! DeepSpeed, `runtime/zenflow/zenflow_config.py`: unknown keys are rejected).
//!
//! ZenFlow has its own `"auto"` values (`select_strategy`, `select_interval`, `update_interval`):
//! they are DeepSpeed's, not the Hugging Face Trainer's, and mean "let ZenFlow decide".

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::primitives::{Integer, NonNegativeInt};

/// How ZenFlow decides when to re-select the important gradient columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ZenflowSelectStrategy {
    /// ZenFlow picks the interval itself.
    #[default]
    Auto,
    /// Re-select every `select_interval` steps.
    Step,
    /// Re-select every `select_interval` epochs.
    Epoch,
}

/// An interval ZenFlow either chooses itself (`"auto"`) or is given as a whole number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ZenflowInterval {
    /// ZenFlow's own choice.
    #[default]
    Auto,
    /// A fixed number of steps (or epochs).
    Every(NonNegativeInt),
}

impl Serialize for ZenflowInterval {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            ZenflowInterval::Auto => serializer.serialize_str("auto"),
            ZenflowInterval::Every(n) => n.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ZenflowInterval {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = serde_json::Value::deserialize(deserializer)?;
        if raw.as_str() == Some("auto") {
            return Ok(ZenflowInterval::Auto);
        }
        NonNegativeInt::deserialize(raw)
            .map(ZenflowInterval::Every)
            .map_err(|e| serde::de::Error::custom(format!("{e} (or \"auto\")")))
    }
}

impl JsonSchema for ZenflowInterval {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "ZenflowInterval".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let count = generator.subschema_for::<NonNegativeInt>();
        json_schema!({ "anyOf": [{ "type": "string", "enum": ["auto"] }, count] })
    }
}

/// ZenFlow settings (`zero_optimization.zenflow`); present means enabled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ZenflowConfig {
    /// Fraction of gradient columns treated as important and updated on the GPU each step.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub topk_ratio: f64,
    /// How the important columns are re-selected.
    pub select_strategy: ZenflowSelectStrategy,
    /// How often the important columns are re-selected.
    pub select_interval: ZenflowInterval,
    /// How often the accumulated unimportant gradients are applied.
    pub update_interval: ZenflowInterval,
    /// Overlap the CPU optimizer step with the next forward and backward.
    pub overlap_step: bool,
    /// Offload the selective optimizer states to the CPU.
    pub offload: bool,
    /// Threshold the `auto` strategy uses to choose `update_interval`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub auto_ratio: f64,
    /// Initial rounds in which all gradients are updated (no selection).
    pub full_warm_up_rounds: Integer,
    /// Fraction of CPU cores reserved for PyTorch threads; the rest run ZenFlow's workers.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub pt_reserved_cores_perc: f64,
    /// Steps per epoch; DeepSpeed fills it at run time and users should not set it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps_per_epoch: Option<NonNegativeInt>,
}

impl Default for ZenflowConfig {
    fn default() -> Self {
        ZenflowConfig {
            topk_ratio: 0.1,
            select_strategy: ZenflowSelectStrategy::Auto,
            select_interval: ZenflowInterval::Auto,
            update_interval: ZenflowInterval::Auto,
            overlap_step: false,
            offload: false,
            auto_ratio: 0.99,
            full_warm_up_rounds: Integer(0),
            pt_reserved_cores_perc: 0.5,
            steps_per_epoch: None,
        }
    }
}
