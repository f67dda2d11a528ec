//! The config sections DeepSpeed accepts that `dsplan run` does not act on, each with the
//! reason, so that a run never drops a setting silently: a section that is present (and not
//! switched off with `"enabled": false`) gives one notice line.
//!
//! Sections the executor does act on (batch sizes, optimizer, scheduler, clipping, precision,
//! ZeRO and offload, gradient scaling and communication dtype, printing, activation
//! checkpointing) are not listed; the
//! validator has already refused unknown and removed keys.

use serde_json::Value;

/// A top-level key and why the executor leaves it alone.
struct Ignored {
    key: &'static str,
    why: &'static str,
}

const MONITORING: &str =
    "DeepSpeed's runtime monitoring; dsplan reports its own (--metrics, the summary)";

const IGNORED: &[Ignored] = &[
    Ignored {
        key: "checkpoint",
        why: "checkpoints follow --save-checkpoint and --resume; a checkpoint at another world size or stage is resharded without load_universal",
    },
    Ignored {
        key: "aio",
        why: "NVMe swap files are read and written with synchronous 64 KiB requests",
    },
    Ignored {
        key: "compile",
        why: "the model is compiled Rust; there is no torch.compile",
    },
    Ignored {
        key: "torch_autocast",
        why: "precision follows the fp16/bf16 sections",
    },
    Ignored {
        key: "hybrid_engine",
        why: "there is no inference engine",
    },
    Ignored {
        key: "data_efficiency",
        why: "batches are read in the order --data gives them",
    },
    Ignored {
        key: "dataloader_drop_last",
        why: "batches are read in the order --data gives them",
    },
    Ignored {
        key: "flops_profiler",
        why: MONITORING,
    },
    Ignored {
        key: "comms_logger",
        why: MONITORING,
    },
    Ignored {
        key: "tensorboard",
        why: MONITORING,
    },
    Ignored {
        key: "wandb",
        why: MONITORING,
    },
    Ignored {
        key: "csv_monitor",
        why: MONITORING,
    },
    Ignored {
        key: "memory_breakdown",
        why: MONITORING,
    },
    Ignored {
        key: "dump_state",
        why: MONITORING,
    },
];

/// One notice per listed section present in `raw` and not disabled, in the list's order.
pub(super) fn ignored_section_notices(raw: &Value) -> Vec<String> {
    let Some(root) = raw.as_object() else {
        return Vec::new();
    };
    IGNORED
        .iter()
        .filter(|entry| root.get(entry.key).is_some_and(switched_on))
        .map(|entry| format!("`{}` has no effect on dsplan run: {}", entry.key, entry.why))
        .collect()
}

/// Whether a section's value asks for anything: not `false`, not `null`, not an object with
/// `"enabled": false`.
fn switched_on(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => false,
        Value::Object(map) => map.get("enabled") != Some(&Value::Bool(false)),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn present_sections_are_named_and_disabled_ones_are_not() {
        let raw = json!({
            "activation_checkpointing": {"partition_activations": true},
            "wandb": {"enabled": false},
            "tensorboard": {"enabled": true},
            "memory_breakdown": false,
            "optimizer": {"type": "AdamW"},
        });
        let notices = ignored_section_notices(&raw);
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].starts_with("`tensorboard` has no effect"));
        assert!(ignored_section_notices(&json!({"optimizer": {}})).is_empty());
    }
}
