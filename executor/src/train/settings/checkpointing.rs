//! `activation_checkpointing`: whether the model recomputes each block's forward in backward,
//! and what each of the section's keys means for a run of dsplan's executor.
//!
//! dsplan owns the model, so the section plays the part of a Megatron-style model calling
//! `deepspeed.checkpointing.configure` and `checkpoint()` around every layer: its presence
//! turns per-layer recomputation on ([`Recompute::EachLayer`]), as does the Hugging Face
//! Trainer's `gradient_checkpointing` ([`super::TrainSettings::with_gradient_checkpointing`]).
//! DeepSpeed 0.19.8's keys (`runtime/activation_checkpointing/checkpointing.py`), as the CPU
//! executor takes them:
//!
//! | key | DeepSpeed | dsplan |
//! |---|---|---|
//! | `partition_activations` | each model-parallel rank keeps `1/mp_size` of a layer input | no tensor parallelism (`mp_size` 1): the partition is the whole input, as in DeepSpeed without an `mpu` |
//! | `cpu_checkpointing` | the saved inputs move to host memory | they are in host memory already (the arena) |
//! | `contiguous_memory_optimization` | the saved inputs go to one preallocated buffer; asserts `partition_activations` and `number_checkpoints` | the arena is that buffer; DeepSpeed's two conditions are checked |
//! | `number_checkpoints` | sizes that buffer | the arena holds one input per block |
//! | `synchronize_checkpoint_boundary` | synchronizes the device around each layer | each CPU layer has finished when it returns |
//! | `profile` | logs each checkpointed layer's forward and backward time | refused: no per-layer timers (`--metrics` has each step's phases) |

use dsplan_planner::config::ActivationCheckpointingConfig;
use serde_json::Value;

use super::SettingsError;
use crate::model::Recompute;

const SECTION: &str = "activation_checkpointing";

/// What the config's `activation_checkpointing` section (in the file DeepSpeed receives,
/// `filled`; typed as `section`) asks of the model, with a notice per key acted on.
pub(super) fn recompute(
    filled: &Value,
    section: &ActivationCheckpointingConfig,
    notices: &mut Vec<String>,
) -> Result<Recompute, SettingsError> {
    let present = filled
        .get(SECTION)
        .is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)));
    if !present {
        return Ok(Recompute::Nothing);
    }
    let pointer = |key: &str| format!("/{SECTION}/{key}");
    if section.profile {
        return Err(SettingsError::new(
            pointer("profile"),
            "dsplan's executor keeps no per-layer timers for checkpointed layers",
        )
        .with_help("remove it or set it to false; --metrics records each step's forward, backward and optimizer times"));
    }
    if section.contiguous_memory_optimization {
        if !section.partition_activations {
            return Err(SettingsError::new(
                pointer("contiguous_memory_optimization"),
                "DeepSpeed refuses contiguous checkpointing without partitioned activations (\"Contiguous Checkpointing is only available with partitioned activations\")",
            )
            .with_help("set partition_activations to true, or remove contiguous_memory_optimization"));
        }
        if section.number_checkpoints.is_none() {
            return Err(SettingsError::new(
                pointer("number_checkpoints"),
                "DeepSpeed refuses contiguous checkpointing without the number of checkpoints (\"Must specify the number of layers with contiguous memory checkpointing\")",
            )
            .with_help("set number_checkpoints to the model's number of layers"));
        }
    }
    notices.push(
        "activation checkpointing (`activation_checkpointing`): forward keeps each block's input; backward recomputes each block's forward before its backward".into(),
    );
    let mut acted = |key: &str, what: &str| notices.push(format!("`{}`: {what}", pointer(key)));
    if section.partition_activations {
        acted(
            "partition_activations",
            "there is no tensor parallelism (model-parallel size 1), so each rank's partition of a block input is the whole input, as in DeepSpeed without an mpu",
        );
    }
    if section.cpu_checkpointing {
        acted(
            "cpu_checkpointing",
            "the block inputs are in host memory already (the CPU executor's activation arena)",
        );
    }
    if section.contiguous_memory_optimization {
        acted(
            "contiguous_memory_optimization",
            "the block inputs are already in one buffer allocated once (the activation arena)",
        );
    }
    if section.number_checkpoints.is_some() {
        acted(
            "number_checkpoints",
            "the arena holds exactly one input per block, whatever the count",
        );
    }
    if section.synchronize_checkpoint_boundary {
        acted(
            "synchronize_checkpoint_boundary",
            "nothing runs asynchronously: each block has finished when the next starts",
        );
    }
    Ok(Recompute::EachLayer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(raw: Value) -> (Result<Recompute, SettingsError>, Vec<String>) {
        let section: ActivationCheckpointingConfig = raw
            .get(SECTION)
            .map(|v| serde_json::from_value(v.clone()).expect("typed"))
            .unwrap_or_default();
        let mut notices = Vec::new();
        (recompute(&raw, &section, &mut notices), notices)
    }

    #[test]
    fn the_section_turns_recomputation_on() {
        assert_eq!(read(json!({})).0, Ok(Recompute::Nothing));
        let (on, notices) = read(json!({SECTION: {}}));
        assert_eq!(on, Ok(Recompute::EachLayer));
        assert_eq!(notices.len(), 1, "{notices:?}");
        let (on, notices) = read(json!({SECTION: {"partition_activations": true,
            "cpu_checkpointing": true, "contiguous_memory_optimization": true,
            "number_checkpoints": 12, "synchronize_checkpoint_boundary": true}}));
        assert_eq!(on, Ok(Recompute::EachLayer));
        assert_eq!(notices.len(), 6, "{notices:?}");
        for key in [
            "partition_activations",
            "cpu_checkpointing",
            "contiguous_memory_optimization",
            "number_checkpoints",
            "synchronize_checkpoint_boundary",
        ] {
            let path = format!("`/{SECTION}/{key}`");
            assert!(notices.iter().any(|n| n.starts_with(&path)), "{key}");
        }
    }

    #[test]
    fn what_deepspeed_refuses_or_dsplan_cannot_do_is_an_error() {
        let (error, _) = read(json!({SECTION: {"profile": true}}));
        assert_eq!(
            error.expect_err("profile").pointer,
            "/activation_checkpointing/profile"
        );
        let (error, _) = read(json!({SECTION: {"contiguous_memory_optimization": true,
            "number_checkpoints": 2}}));
        assert_eq!(
            error.expect_err("needs partitioning").pointer,
            "/activation_checkpointing/contiguous_memory_optimization"
        );
        let (error, _) = read(json!({SECTION: {"contiguous_memory_optimization": true,
            "partition_activations": true}}));
        assert_eq!(
            error.expect_err("needs a count").pointer,
            "/activation_checkpointing/number_checkpoints"
        );
    }
}
