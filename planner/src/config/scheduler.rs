//! `scheduler`: the learning-rate schedule DeepSpeed steps once per optimizer step.
//!
//! `type` is one of DeepSpeed's five schedulers (`WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`,
//! `OneCycle`, `LRRangeTest`) or an exact `torch.optim.lr_scheduler` class name; `params` are
//! its constructor's keyword arguments ([`crate::config::registry::SCHEDULERS`] lists them).
//! The parameters of DeepSpeed's own schedulers are typed here; others pass through.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::primitives::{AutoOr, NonNegativeInt, PositiveInt};

/// `scheduler`: absent means no DeepSpeed scheduler (the script may pass its own).
///
/// DeepSpeed reads `type` and `params` by name (`runtime/config.py:325-335` in 0.19.8) and
/// ignores any other key; dsplan refuses one, since a misspelt `params` silently builds the
/// scheduler with its defaults.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// The scheduler class: `WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`, `OneCycle`,
    /// `LRRangeTest` (case-sensitive) or a `torch.optim.lr_scheduler` class.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("examples" = ["WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"]))]
    pub kind: Option<String>,
    /// Keyword arguments for the scheduler's constructor.
    pub params: SchedulerParams,
}

/// A learning rate given once for all parameter groups or once per group.
#[derive(Debug, Clone, PartialEq)]
pub enum LearningRate {
    /// One value for every parameter group.
    Single(f64),
    /// One value per parameter group, in order.
    PerGroup(Vec<f64>),
}

impl Serialize for LearningRate {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            LearningRate::Single(rate) => serializer.serialize_f64(*rate),
            LearningRate::PerGroup(rates) => rates.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for LearningRate {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Number(n) => n
                .as_f64()
                .map(LearningRate::Single)
                .ok_or_else(|| serde::de::Error::custom("learning rate out of range")),
            other @ Value::Array(_) => Vec::<f64>::deserialize(other)
                .map(LearningRate::PerGroup)
                .map_err(serde::de::Error::custom),
            _ => Err(serde::de::Error::custom(
                "expected a learning rate or a list of them (one per parameter group)",
            )),
        }
    }
}

impl JsonSchema for LearningRate {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "LearningRate".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "anyOf": [
                { "type": "number" },
                { "type": "array", "items": { "type": "number" } },
            ]
        })
    }
}

/// The warm-up curve of `WarmupLR`, `WarmupDecayLR` and `WarmupCosineLR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WarmupType {
    /// γ = ln(t+1)/ln(W): fast early rise (DeepSpeed's default).
    #[default]
    Log,
    /// γ = t/W.
    Linear,
}

/// `scheduler.params`: constructor arguments of DeepSpeed's schedulers. Each is optional here
/// (its default belongs to the chosen scheduler, see the registry); names not listed pass
/// through to other schedulers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct SchedulerParams {
    /// WarmupLR/WarmupDecayLR: learning rate at the start of warm-up (absolute, default 0).
    /// The Hugging Face Trainer fills `"auto"` with 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_min_lr: Option<AutoOr<LearningRate>>,
    /// WarmupLR/WarmupDecayLR: learning rate reached after warm-up (absolute; WarmupLR's
    /// default is the optimizer's `lr`, WarmupDecayLR's 0.001). The Hugging Face Trainer fills
    /// `"auto"` from `--learning_rate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_max_lr: Option<AutoOr<LearningRate>>,
    /// Warm-up length in optimizer steps: a positive integer (default 1000). The Hugging Face
    /// Trainer fills `"auto"` from `--warmup_steps`/`--warmup_ratio`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_num_steps: Option<AutoOr<PositiveInt>>,
    /// Warm-up curve: `log` (default) or `linear`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_type: Option<WarmupType>,
    /// WarmupDecayLR/WarmupCosineLR (required): total optimizer steps of the run. The Hugging
    /// Face Trainer fills `"auto"` with the number of training steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_num_steps: Option<AutoOr<NonNegativeInt>>,
    /// WarmupCosineLR: warm-up starts at this fraction of the optimizer's `lr` (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_min_ratio: Option<f64>,
    /// WarmupCosineLR: the cosine decays to this fraction of the optimizer's `lr`
    /// (default 1e-4).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cos_min_ratio: Option<f64>,
    /// OneCycle (required): lower learning-rate bound of the cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_min_lr: Option<f64>,
    /// OneCycle (required): upper learning-rate bound of the cycle.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_max_lr: Option<f64>,
    /// OneCycle: learning-rate decay rate after the cycle (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_lr_rate: Option<f64>,
    /// OneCycle: steps of the rising half of the cycle (default 2000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_first_step_size: Option<NonNegativeInt>,
    /// OneCycle: steps of the falling half (default: same as the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_second_step_size: Option<NonNegativeInt>,
    /// OneCycle: stairs in the first half (default 0; stored, unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_first_stair_count: Option<NonNegativeInt>,
    /// OneCycle: stairs in the second half (stored, unused).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_second_stair_count: Option<NonNegativeInt>,
    /// OneCycle: steps per decay interval after the cycle (default 0: no decay).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_step_size: Option<NonNegativeInt>,
    /// OneCycle: cycle the momentum (beta1) inversely to the learning rate (default true;
    /// beta2 is then forced to 0.99).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_momentum: Option<bool>,
    /// OneCycle: lower momentum bound (default 0.8).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_min_mom: Option<f64>,
    /// OneCycle: upper momentum bound (default 0.9).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle_max_mom: Option<f64>,
    /// OneCycle: momentum growth rate after the cycle (default 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decay_mom_rate: Option<f64>,
    /// LRRangeTest: starting learning rate (default 1e-3; one per group allowed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_range_test_min_lr: Option<LearningRate>,
    /// LRRangeTest: steps per increase interval (default 2000).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_range_test_step_size: Option<NonNegativeInt>,
    /// LRRangeTest: growth per interval (default 1.0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_range_test_step_rate: Option<f64>,
    /// LRRangeTest: grow in stairs rather than continuously (default false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_range_test_staircase: Option<bool>,
    /// Every scheduler: index of the last completed step when resuming (default -1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_batch_iteration: Option<super::primitives::Integer>,
    /// Arguments of other schedulers, passed through unchecked.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}
