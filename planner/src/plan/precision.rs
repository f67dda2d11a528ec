//! The one precision rule: which of fp16, bf16 and fp32 a config trains in ([`precision`]), and
//! the element type of every state that follows from it ([`dtypes`]).
//!
//! The plan ([`super::decide`]), the full estimate (`estimate::full::config_reading`) and the
//! executor's settings all read the precision here, so they cannot disagree.

use super::dtype::Dtype;
use super::settings::{Dtypes, Precision};
use crate::config::{DsConfig, ZeroStage};

/// fp16 and bf16 are both enabled: DeepSpeed asserts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BothEnabled;

/// The training precision of `config`. `fp16.enabled` and `bf16.enabled` (or the legacy
/// `bfloat16.enabled`; resolution moves it into `bf16`, and validation refuses both spellings
/// together) as concrete values; an `"auto"` still there reads as off.
pub fn precision(config: &DsConfig) -> Result<Precision, BothEnabled> {
    let fp16 = config.fp16.enabled.value().copied().unwrap_or(false);
    let legacy_bf16 = config
        .bfloat16
        .as_ref()
        .and_then(|b| b.0.enabled.value().copied())
        .unwrap_or(false);
    let bf16 = config.bf16.enabled.value().copied().unwrap_or(false) || legacy_bf16;
    match (fp16, bf16) {
        (true, true) => Err(BothEnabled),
        (true, false) => Ok(Precision::Fp16),
        (false, true) => Ok(Precision::Bf16),
        (false, false) => Ok(Precision::Fp32),
    }
}

/// The element types of a run in `precision` at `stage` (deepspeed-facts §4.3, §5.4, §5.5):
/// gradients accumulate in `data_types.grad_accum_dtype`, else the model dtype (DeepSpeed
/// 0.19.8's `get_data_types`, at every stage); `*_master_weights_and_grads`
/// keep a 16-bit master under ZeRO; 16-bit optimizer states need a 16-bit master and
/// `bf16_optimizer_states` (bf16) or `fp32_optimizer_states: false` (fp16).
pub fn dtypes(config: &DsConfig, precision: Precision, stage: ZeroStage) -> Dtypes {
    let model = match precision {
        Precision::Fp32 => Dtype::Fp32,
        Precision::Fp16 => Dtype::Fp16,
        Precision::Bf16 => Dtype::Bf16,
    };
    let zero = stage != ZeroStage::Disabled;
    let grad_accum = config
        .data_types
        .grad_accum_dtype
        .and_then(Dtype::from_name)
        .unwrap_or(model);
    let communication = config
        .communication_data_type
        .map(Dtype::from_comm)
        .unwrap_or(model);
    let bf16 = &config.bf16;
    let master = match precision {
        Precision::Bf16 if zero && bf16.bf16_master_weights_and_grads => Dtype::Bf16,
        Precision::Fp16 if zero && config.fp16.fp16_master_weights_and_grads => Dtype::Fp16,
        _ => Dtype::Fp32,
    };
    let fp32_states = config
        .optimizer
        .as_ref()
        .and_then(|o| o.params.fp32_optimizer_states)
        .unwrap_or(true);
    let optimizer_states = match master {
        Dtype::Bf16 if bf16.bf16_optimizer_states => Dtype::Bf16,
        Dtype::Fp16 if !fp32_states => Dtype::Fp16,
        _ => Dtype::Fp32,
    };
    Dtypes {
        params: model,
        gradients: model,
        grad_accum,
        communication,
        master,
        optimizer_states,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(value: serde_json::Value) -> DsConfig {
        crate::config::from_value(&value).expect("typed")
    }

    #[test]
    fn one_flag_picks_the_precision_and_both_are_refused() {
        assert_eq!(precision(&config(json!({}))), Ok(Precision::Fp32));
        assert_eq!(
            precision(&config(json!({"fp16": {"enabled": true}}))),
            Ok(Precision::Fp16)
        );
        assert_eq!(
            precision(&config(json!({"bfloat16": {"enabled": true}}))),
            Ok(Precision::Bf16)
        );
        assert_eq!(
            precision(&config(
                json!({"fp16": {"enabled": true}, "bf16": {"enabled": true}})
            )),
            Err(BothEnabled)
        );
    }

    #[test]
    fn bf16_accumulates_in_bf16_at_every_stage_and_master_flags_need_zero() {
        let bf16 = config(
            json!({"bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
            "bf16_optimizer_states": true}}),
        );
        let stage0 = dtypes(&bf16, Precision::Bf16, ZeroStage::Disabled);
        assert_eq!(
            (stage0.grad_accum, stage0.master, stage0.optimizer_states),
            (Dtype::Bf16, Dtype::Fp32, Dtype::Fp32)
        );
        let stage2 = dtypes(&bf16, Precision::Bf16, ZeroStage::Gradients);
        assert_eq!(
            (stage2.grad_accum, stage2.master, stage2.optimizer_states),
            (Dtype::Bf16, Dtype::Bf16, Dtype::Bf16)
        );
        let fp16 = config(
            json!({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true},
            "optimizer": {"type": "Adam", "params": {"fp32_optimizer_states": false}}}),
        );
        let stage1 = dtypes(&fp16, Precision::Fp16, ZeroStage::OptimizerStates);
        assert_eq!(
            (stage1.master, stage1.optimizer_states),
            (Dtype::Fp16, Dtype::Fp16)
        );
    }
}
