//! State tensors per parameter of the optimizers DeepSpeed builds (deepspeed-facts §2.5, §6),
//! one rule for the plan and the estimate.

use serde_json::{Map, Value};

/// State tensors per parameter for optimizer `name` (case-insensitive) with `params`, or
/// `None` when dsplan does not know the optimizer.
///
/// Adam, AdamW, LAMB and their 1-bit / fused / CPU / muP variants keep two (`exp_avg`,
/// `exp_avg_sq`); Lion, Adagrad and Muon one; SGD one momentum buffer when `momentum > 0`;
/// RMSprop its `square_avg`, plus a momentum buffer when `momentum > 0` and `grad_avg` when
/// `centered`.
pub fn states_per_param(name: &str, params: &Map<String, Value>) -> Option<u64> {
    let momentum = params
        .get("momentum")
        .and_then(Value::as_f64)
        .is_some_and(|m| m > 0.0);
    let centered = params
        .get("centered")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    match name.to_ascii_lowercase().as_str() {
        "adam" | "adamw" | "fusedadam" | "cpuadam" | "lamb" | "onebitadam" | "zerooneadam"
        | "onebitlamb" | "muadam" | "muadamw" => Some(2),
        "lion" | "adagrad" | "muon" => Some(1),
        "sgd" | "musgd" => Some(u64::from(momentum)),
        "rmsprop" => Some(1 + u64::from(momentum) + u64::from(centered)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn known_optimizers_have_their_state_count() {
        assert_eq!(states_per_param("AdamW", &Map::new()), Some(2));
        assert_eq!(states_per_param("Lion", &Map::new()), Some(1));
        assert_eq!(states_per_param("SGD", &Map::new()), Some(0));
        assert_eq!(
            states_per_param("sgd", &params(json!({"momentum": 0.9}))),
            Some(1)
        );
        assert_eq!(
            states_per_param(
                "RMSprop",
                &params(json!({"momentum": 0.9, "centered": true}))
            ),
            Some(3)
        );
        assert_eq!(states_per_param("Shampoo", &Map::new()), None);
    }
}
