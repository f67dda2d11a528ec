//! DeepSpeed 0.19.8's defaults that the typed config cannot hold by itself: `"auto"` values
//! DeepSpeed ignores, `overlap_comm` (which depends on the stage) and the optimizer's
//! constructor defaults. Every other default is the typed config's own
//! ([`crate::config::DsConfig`]'s `Default`, the code's values where the docs differ).

use serde_json::Value;

use super::provenance::Provenance;
use crate::config::primitives::AutoOr;
use crate::config::registry::{ALIASES, AUTO_KEYS, KeyAlias};
use crate::config::{DsConfig, ZeroConfig, ZeroStage};
use crate::diagnostics::{Code, Diagnostic};
use crate::json_pointer;

/// Removes the `"auto"` values the Trainer leaves in place (the ZeRO-3 bucket keys below stage
/// 3, `stage3_gather_16bit_weights_on_model_save`) and that DeepSpeed's pydantic sections drop,
/// so DeepSpeed's default applies. Any other leftover `"auto"` was already reported as
/// unresolvable; it is removed too so that validation does not repeat it.
pub(crate) fn drop_leftover_autos(document: &mut Value) -> Vec<(String, Provenance)> {
    let mut dropped = Vec::new();
    for pointer in AUTO_KEYS {
        let parent = crate::json_pointer::parent(pointer);
        let key = crate::json_pointer::last_token(pointer);
        let Some(Value::Object(section)) = document.pointer_mut(parent) else {
            continue;
        };
        if section.get(&key).and_then(Value::as_str) != Some("auto") {
            continue;
        }
        section.remove(&key);
        let note = if key == "stage3_gather_16bit_weights_on_model_save" {
            "\"auto\" in the file: the Trainer leaves it, DeepSpeed ignores it (Accelerate writes false, the same value)"
        } else {
            "\"auto\" in the file: the Trainer fills it only at ZeRO stage 3, and DeepSpeed ignores \"auto\""
        };
        dropped.push((
            pointer.to_string(),
            Provenance::DeepSpeedDefault {
                note: Some(note.to_string()),
            },
        ));
    }
    dropped
}

/// Removes `"auto"` under the short spelling of a key the Trainer fills only under its
/// `stage3_` name (`prefetch_bucket_size`, `param_persistence_threshold`,
/// `gather_16bit_weights_on_model_save`): the Trainer leaves it, and DeepSpeed's pydantic
/// `zero_optimization` drops every `"auto"` (`runtime/config_utils.py:55-56`), so its default
/// applies. Each is a warning naming that default.
pub(crate) fn drop_alias_autos(
    document: &mut Value,
) -> (Vec<(String, Provenance)>, Vec<Diagnostic>) {
    let (mut dropped, mut warnings) = (Vec::new(), Vec::new());
    for (alias, warning) in alias_autos(document) {
        let canonical = format!("{}/{}", alias.parent, alias.canonical);
        if let Some(Value::Object(section)) = document.pointer_mut(alias.parent) {
            section.remove(alias.alias);
        }
        warnings.push(warning);
        dropped.push((
            canonical,
            Provenance::DeepSpeedDefault {
                note: Some(format!(
                    "\"auto\" under `{}`: the Trainer leaves it, DeepSpeed ignores \"auto\"",
                    alias.alias
                )),
            },
        ));
    }
    (dropped, warnings)
}

/// The `"auto"`s under a short name of a key the Trainer fills only under its long name
/// (`prefetch_bucket_size` for `stage3_prefetch_bucket_size`), each with its warning: DeepSpeed
/// drops the `"auto"` and uses its default. `validate` gives the same verdict as `resolve`.
pub(crate) fn alias_autos(document: &Value) -> Vec<(&'static KeyAlias, Diagnostic)> {
    let defaults = serde_json::to_value(ZeroConfig::default()).unwrap_or(Value::Null);
    let mut found = Vec::new();
    for alias in ALIASES {
        let canonical = format!("{}/{}", alias.parent, alias.canonical);
        if !AUTO_KEYS.contains(&canonical.as_str()) {
            continue;
        }
        let Some(Value::Object(section)) = document.pointer(alias.parent) else {
            continue;
        };
        if section.get(alias.alias).and_then(Value::as_str) != Some("auto") {
            continue;
        }
        let default = defaults
            .get(alias.canonical)
            .map_or_else(|| "its default".to_string(), Value::to_string);
        let pointer = json_pointer::child(alias.parent, alias.alias);
        let warning = Diagnostic::warning(
            Code::UnresolvableAuto,
            &pointer,
            format!(
                "`{}` is \"auto\", which the Hugging Face Trainer fills only under the name `{}`: it stays \"auto\", and DeepSpeed then uses its default, {default}",
                alias.alias, alias.canonical
            ),
        )
        .with_help(format!(
            "write `\"{}\": \"auto\"` for the Trainer's value, or a number",
            alias.canonical
        ));
        found.push((alias, warning));
    }
    found
}

/// `overlap_comm`: absent means true exactly at stage 3.
pub(crate) fn overlap_comm(typed: &mut DsConfig) -> Option<(String, Provenance)> {
    let zero = &mut typed.zero_optimization;
    if zero.overlap_comm.is_some() {
        return None;
    }
    let on = zero.stage == ZeroStage::Weights;
    zero.overlap_comm = Some(on);
    let note = if on {
        "true because the stage is 3"
    } else {
        "false because the stage is below 3"
    };
    Some((
        "/zero_optimization/overlap_comm".to_string(),
        Provenance::DeepSpeedDefault {
            note: Some(note.to_string()),
        },
    ))
}

/// The learning rate DeepSpeed's optimizer `kind` uses when `params.lr` is absent.
pub fn optimizer_default_lr(kind: &str) -> Option<f64> {
    match kind.to_ascii_lowercase().as_str() {
        "adam" | "adamw" | "lamb" | "lion" => Some(1e-3),
        "adagrad" => Some(1e-2),
        _ => None,
    }
}

/// Fills the constructor defaults of DeepSpeed's own optimizers (Adam/AdamW, Lamb, Lion,
/// Adagrad) into `optimizer.params`; torch and other optimizers are left as written.
pub(crate) fn optimizer(typed: &mut DsConfig) -> Vec<(String, Provenance)> {
    let Some(optimizer) = typed.optimizer.as_mut() else {
        return Vec::new();
    };
    let Some(kind) = optimizer.kind.as_deref().map(str::to_ascii_lowercase) else {
        return Vec::new();
    };
    let params = &mut optimizer.params;
    let mut notes = Vec::new();
    let adam_betas = [0.9, 0.999];
    match kind.as_str() {
        "adam" | "adamw" => {
            fill(&mut params.lr, 1e-3);
            fill(&mut params.betas, adam_betas);
            fill(&mut params.eps, 1e-8);
            if params.torch_adam != Some(true) {
                // torch.optim.AdamW's own default weight decay is 0.01; DeepSpeed's kernels' is 0.
                fill(&mut params.weight_decay, 0.0);
            }
            params.bias_correction.get_or_insert(true);
            params.torch_adam.get_or_insert(false);
            if params.adam_w_mode.is_none() {
                params.adam_w_mode = Some(true);
                notes.push((
                    "/optimizer/params/adam_w_mode".to_string(),
                    Provenance::DeepSpeedDefault {
                        note: Some("so type Adam performs AdamW (decoupled weight decay)".into()),
                    },
                ));
            }
        }
        "lamb" => {
            fill(&mut params.lr, 1e-3);
            fill(&mut params.betas, adam_betas);
            fill(&mut params.eps, 1e-8);
            fill(&mut params.weight_decay, 0.0);
            params.bias_correction.get_or_insert(true);
            for (name, value) in [
                ("eps_inside_sqrt", Value::Bool(false)),
                ("max_coeff", Value::from(10.0)),
                ("min_coeff", Value::from(0.01)),
            ] {
                params.other.entry(name).or_insert(value);
            }
        }
        "lion" => {
            fill(&mut params.lr, 1e-3);
            fill(&mut params.betas, adam_betas);
            fill(&mut params.weight_decay, 0.0);
        }
        "adagrad" => {
            fill(&mut params.lr, 1e-2);
            fill(&mut params.eps, 1e-10);
            fill(&mut params.weight_decay, 0.0);
        }
        _ => {}
    }
    notes
}

fn fill<T>(slot: &mut Option<AutoOr<T>>, value: T) {
    if slot.is_none() {
        *slot = Some(AutoOr::Value(value));
    }
}
