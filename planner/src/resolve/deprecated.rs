//! Deprecated spellings rewritten the way DeepSpeed 0.19.8 reads them, so the resolved config
//! holds only current keys:
//!
//! - `zero_optimization.cpu_offload: true` → `offload_optimizer: {"device": "cpu"}`;
//! - `zero_optimization.cpu_offload_param: true` → `offload_param: {"device": "cpu"}`;
//! - `zero_optimization.cpu_offload_use_pin_memory` → dropped (it has no effect);
//! - `zero_optimization.stage3_gather_fp16_weights_on_model_save` →
//!   `stage3_gather_16bit_weights_on_model_save`;
//! - `bfloat16` → `bf16` (read only when `bf16` is absent; ignored otherwise);
//! - the legacy `"zero_optimization": true` (already stage 1 after typing) drops the top-level
//!   `allgather_size` it consumed.
//!
//! Giving an old key together with its replacement is refused earlier, by validation.

use serde_json::Value;

use crate::config::primitives::AutoOr;
use crate::config::{DsConfig, OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig};

/// Rewrites the deprecated keys of `typed`; `raw` is the document as written (to know whether
/// `bf16` itself was given).
pub(crate) fn migrate(typed: &mut DsConfig, raw: &Value) {
    let zero = &mut typed.zero_optimization;
    if zero.cpu_offload.take() == Some(true) && zero.offload_optimizer.is_none() {
        zero.offload_optimizer = Some(OffloadOptimizerConfig {
            device: OffloadDevice::Cpu,
            ..OffloadOptimizerConfig::default()
        });
    }
    if zero.cpu_offload_param.take() == Some(true) && zero.offload_param.is_none() {
        zero.offload_param = Some(OffloadParamConfig {
            device: OffloadDevice::Cpu,
            ..OffloadParamConfig::default()
        });
    }
    zero.cpu_offload_use_pin_memory = None;
    if let Some(gather) = zero.stage3_gather_fp16_weights_on_model_save.take() {
        zero.gather_16bit_weights_on_model_save = AutoOr::Value(gather);
    }
    if let Some(legacy) = typed.bfloat16.take()
        && raw.get("bf16").is_none()
    {
        typed.bf16 = legacy.0;
    }
    typed.allgather_size = None;
}

/// Where in the file a resolved value was written, when a deprecated spelling carried it.
pub(crate) fn old_spelling(raw: &Value, pointer: &str) -> Option<String> {
    let truthy = |p: &str| raw.pointer(p) == Some(&Value::Bool(true));
    if let Some(field) = pointer.strip_prefix("/bf16/")
        && raw.get("bf16").is_none()
    {
        let old = format!("/bfloat16/{field}");
        return raw.pointer(&old).is_some().then_some(old);
    }
    let old = match pointer {
        "/zero_optimization/offload_optimizer/device"
            if truthy("/zero_optimization/cpu_offload") =>
        {
            Some("/zero_optimization/cpu_offload")
        }
        "/zero_optimization/offload_param/device"
            if truthy("/zero_optimization/cpu_offload_param") =>
        {
            Some("/zero_optimization/cpu_offload_param")
        }
        "/zero_optimization/stage3_gather_16bit_weights_on_model_save"
            if raw
                .pointer("/zero_optimization/stage3_gather_fp16_weights_on_model_save")
                .is_some() =>
        {
            Some("/zero_optimization/stage3_gather_fp16_weights_on_model_save")
        }
        "/zero_optimization/stage"
            if raw.get("zero_optimization").is_some_and(Value::is_boolean) =>
        {
            Some("/zero_optimization")
        }
        "/zero_optimization/allgather_bucket_size"
            if raw.get("zero_optimization").is_some_and(Value::is_boolean)
                && raw.get("allgather_size").is_some() =>
        {
            Some("/allgather_size")
        }
        _ => None,
    };
    old.map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_value;
    use serde_json::json;

    #[test]
    fn old_keys_become_current_ones() {
        let raw = json!({
            "zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_param": true,
                "cpu_offload_use_pin_memory": true,
                "stage3_gather_fp16_weights_on_model_save": true},
            "bfloat16": {"enabled": true}
        });
        let mut typed = from_value(&raw).expect("typed");
        migrate(&mut typed, &raw);
        let zero = &typed.zero_optimization;
        assert_eq!(
            zero.offload_optimizer.as_ref().map(|o| o.device),
            Some(OffloadDevice::Cpu)
        );
        assert_eq!(
            zero.offload_param.as_ref().map(|o| o.device),
            Some(OffloadDevice::Cpu)
        );
        assert_eq!(zero.gather_16bit_weights_on_model_save, AutoOr::Value(true));
        assert!(
            zero.cpu_offload.is_none() && zero.stage3_gather_fp16_weights_on_model_save.is_none()
        );
        assert_eq!(typed.bf16.enabled, AutoOr::Value(true));
        assert!(typed.bfloat16.is_none());
        assert_eq!(
            old_spelling(&raw, "/zero_optimization/offload_param/device"),
            Some("/zero_optimization/cpu_offload_param".to_string())
        );
        assert_eq!(
            old_spelling(&raw, "/bf16/enabled"),
            Some("/bfloat16/enabled".to_string())
        );
    }

    #[test]
    fn bfloat16_is_ignored_next_to_bf16() {
        let raw = json!({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}});
        let mut typed = from_value(&raw).expect("typed");
        migrate(&mut typed, &raw);
        assert_eq!(typed.bf16.enabled, AutoOr::Value(false));
    }
}
