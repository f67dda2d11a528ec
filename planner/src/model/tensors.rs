//! Parameter counting from a list of named tensors, the way DeepSpeed counts a live model.
//!
//! DeepSpeed's `_all_live` estimators (deepspeed-facts §1.3) take
//! - the total as the sum of `numel` over the model's parameters, each shared storage once;
//! - the *largest layer* as the largest sum of parameters owned directly by one module
//!   (non-recursively), a shared parameter counting in every module that owns it.
//!
//! A module is a tensor-name prefix: `model.layers.0.self_attn.q_proj.weight` and
//! `...q_proj.bias` belong to `model.layers.0.self_attn.q_proj`. Architectures generate such
//! lists ([`super::architecture`]); safetensors headers provide them ([`super::safetensors`]).

use serde::Serialize;
use std::collections::HashMap;

/// Whether a tensor has its own storage or is tied to another one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// Its own storage: counted in the total.
    Owned,
    /// Shares the storage of the named tensor (tied weights): counted in its module's size,
    /// not again in the total.
    SharedWith(String),
}

/// One parameter tensor: its full name, its element count and its storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Full dotted name, e.g. `model.layers.0.mlp.up_proj.weight`.
    pub name: String,
    /// Number of elements.
    pub numel: u64,
    /// Own storage or tied to another tensor.
    pub storage: Storage,
}

impl TensorEntry {
    /// A tensor with its own storage.
    pub fn owned(name: impl Into<String>, numel: u64) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            numel,
            storage: Storage::Owned,
        }
    }

    /// A tensor tied to `target` (same storage).
    pub fn shared(name: impl Into<String>, numel: u64, target: impl Into<String>) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            numel,
            storage: Storage::SharedWith(target.into()),
        }
    }

    /// The module owning this tensor: the name up to its last dot (empty for the root).
    pub fn module(&self) -> &str {
        self.name.rsplit_once('.').map_or("", |(module, _)| module)
    }
}

/// The largest layer in DeepSpeed's sense: one module's directly owned parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LargestLayer {
    /// Parameters owned directly by that module.
    pub params: u64,
    /// The module's name when known (`None` when the user gave only a number).
    pub module: Option<String>,
}

/// Totals of a tensor list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamCount {
    /// Parameters, each shared storage counted once (saturates at `u64::MAX`).
    pub total: u64,
    /// The module owning the most parameters directly (the first such module on ties).
    pub largest_layer: LargestLayer,
    /// Number of tensors with their own storage.
    pub owned_tensors: usize,
}

/// The parameters of the owned tensors (saturating): [`count`]'s `total`, without its
/// per-module sums.
pub fn owned_total(tensors: &[TensorEntry]) -> u64 {
    tensors
        .iter()
        .filter(|tensor| tensor.storage == Storage::Owned)
        .fold(0u64, |total, tensor| total.saturating_add(tensor.numel))
}

/// Counts a tensor list as DeepSpeed counts a live model.
pub fn count(tensors: &[TensorEntry]) -> ParamCount {
    let mut total: u64 = 0;
    let mut owned_tensors = 0;
    let mut modules: Vec<(&str, u64)> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for tensor in tensors {
        if tensor.storage == Storage::Owned {
            total = total.saturating_add(tensor.numel);
            owned_tensors += 1;
        }
        let module = tensor.module();
        // A module's tensors are usually listed together: the last module's slot needs no
        // lookup.
        let slot = match modules.last() {
            Some((last, _)) if *last == module => modules.len() - 1,
            _ => *index.entry(module).or_insert_with(|| {
                modules.push((module, 0));
                modules.len() - 1
            }),
        };
        modules[slot].1 = modules[slot].1.saturating_add(tensor.numel);
    }
    let mut largest = LargestLayer {
        params: 0,
        module: None,
    };
    for (module, params) in modules {
        if params > largest.params {
            largest = LargestLayer {
                params,
                module: Some(module.to_owned()),
            };
        }
    }
    ParamCount {
        total,
        largest_layer: largest,
        owned_tensors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tied_weights_count_once_in_the_total_but_fully_in_their_module() {
        let tensors = [
            TensorEntry::owned("wte.weight", 100),
            TensorEntry::owned("h.0.fc.weight", 60),
            TensorEntry::owned("h.0.fc.bias", 6),
            TensorEntry::shared("lm_head.weight", 100, "wte.weight"),
        ];
        let counted = count(&tensors);
        assert_eq!(counted.total, 166);
        assert_eq!(counted.owned_tensors, 3);
        assert_eq!(
            counted.largest_layer,
            LargestLayer {
                params: 100,
                module: Some("wte".into())
            }
        );
    }

    #[test]
    fn weight_and_bias_of_one_module_add_up() {
        let tensors = [
            TensorEntry::owned("a.weight", 50),
            TensorEntry::owned("b.weight", 40),
            TensorEntry::owned("b.bias", 20),
            TensorEntry::owned("root_scale", 1),
        ];
        let counted = count(&tensors);
        assert_eq!(
            counted.largest_layer,
            LargestLayer {
                params: 60,
                module: Some("b".into())
            }
        );
        assert_eq!(tensors[3].module(), "");
    }
}
