//! Assumptions and observations attached to a model specification, as data.

use super::architecture::Architecture;
use serde::Serialize;

/// Something the user should know about how a [`super::ModelSpec`] was obtained.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Note {
    /// `--params` without `--largest-layer`: the largest layer comes from an assumed shape.
    InferredLargestLayer {
        /// The rule, in words.
        rule: &'static str,
        /// The assumed shape.
        shape: Architecture,
        /// Parameters that shape would have in total.
        shape_params: u64,
        /// Its largest module.
        module: String,
        /// The largest layer used (that module's size, capped at the given total).
        largest_layer_params: u64,
    },
    /// A `config.json` key was absent and `transformers`' default was taken.
    ConfigDefault {
        /// The key.
        key: String,
        /// The default used.
        value: String,
    },
    /// The `config.json` next to a checkpoint predicts a different count than its tensors.
    ConfigDisagrees {
        /// Parameters computed from `config.json`.
        config_params: u64,
        /// Parameters found in the safetensors headers (the count used).
        checkpoint_params: u64,
    },
    /// The `config.json` next to a checkpoint could not be used for the architecture.
    ConfigUnused {
        /// Why.
        reason: String,
    },
}

impl Note {
    /// One sentence for human output.
    pub fn message(&self) -> String {
        match self {
            Note::InferredLargestLayer {
                rule,
                shape,
                shape_params,
                module,
                largest_layer_params,
            } => format!(
                "largest layer not given: assumed a {rule}; that is {} layers of width {} ({shape_params} params), whose largest module `{module}` gives {largest_layer_params} params; pass --largest-layer to use the real value",
                shape.layers, shape.hidden
            ),
            Note::ConfigDefault { key, value } => {
                format!("config.json has no `{key}`: used transformers' default {value}")
            }
            Note::ConfigDisagrees {
                config_params,
                checkpoint_params,
            } => format!(
                "config.json describes {config_params} params but the checkpoint holds {checkpoint_params}; the checkpoint's count is used"
            ),
            Note::ConfigUnused { reason } => {
                format!("config.json next to the checkpoint was not used: {reason}")
            }
        }
    }
}

/// `2783959040` -> `2,783,959,040`, for messages meant for people.
pub fn thousands(value: u64) -> String {
    let digits = value.to_string();
    let mut grouped = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(c);
    }
    grouped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(2_783_959_040), "2,783,959,040");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(0), "0");
    }
}
