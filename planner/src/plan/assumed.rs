//! The model graph of a [`ModelSpec`] for the memory estimate: exactly the spec's parameters,
//! whatever the spec knows of the shape.
//!
//! - **With an architecture** (a preset, a `config.json`): the graph of
//!   [`ModelGraph::from_architecture`], without the LM head's own matrix when the spec excludes
//!   it (`--lm-head exclude`: the head unit stays, owning nothing, so its logits are still
//!   counted).
//! - **From a count alone** (`--params`): the GPT-3-shaped decoder [`crate::model::gpt_shape`]
//!   assumes, with the MLP width chosen so that the parameters come within one MLP column per
//!   layer of the count ([`assumed_architecture`]).
//!
//! Whatever the shape does not place (at most one MLP column per layer, or tensors a
//! `config.json` does not describe) is one flat tensor, `unplaced parameters`, in a unit of its
//! own before the LM head, so that the plan holds exactly the spec's parameter count.

use super::model_graph::{FetchUnit, ModelGraph, ModelGraphError, ParamTensor, UnitKind};
use crate::model::architecture::Architecture;
use crate::model::{LmHead, ModelSpec, gpt_shape};

/// The name of the tensor holding the parameters a shape does not place.
pub const UNPLACED: &str = "unplaced parameters";

/// The GPT-3-shaped decoder assumed for `total_params`: [`gpt_shape::shape`] of the closest
/// depth, with the MLP width `i` that brings `(V + positions)·h + 2h + L·(4h² + 9h + (2h + 1)·i)`
/// to at most `total_params` and within `L·(2h + 1)` of it. Counts too small for one MLP column
/// keep the 4x MLP.
pub fn assumed_architecture(total_params: u64) -> Architecture {
    let mut arch = gpt_shape::shape(gpt_shape::closest_layers(total_params));
    let h = u128::from(arch.hidden);
    let layers = u128::from(arch.layers);
    let positions = u128::from(arch.positions.unwrap_or(0));
    let fixed = (u128::from(arch.vocab) + positions) * h + 2 * h + layers * (4 * h * h + 9 * h);
    let per_column = layers * (2 * h + 1);
    let total = u128::from(total_params);
    if total > fixed {
        let columns = (total - fixed) / per_column;
        if let Ok(columns) = u64::try_from(columns)
            && columns >= 1
        {
            arch.intermediate = columns;
        }
    }
    arch
}

impl ModelGraph {
    /// The graph the memory estimate plans with: exactly `spec.total_params` parameters (see
    /// the module documentation).
    pub fn for_estimate(spec: &ModelSpec) -> Result<ModelGraph, ModelGraphError> {
        let mut graph = match spec.architecture {
            Some(arch) => {
                let mut graph = ModelGraph::from_architecture(&spec.name, &arch)?;
                let excluded = spec
                    .lm_head
                    .is_some_and(|head| head.choice == LmHead::Exclude && head.extra_params > 0);
                if excluded {
                    graph.drop_tensor("lm_head.weight");
                }
                graph
            }
            None => {
                ModelGraph::from_architecture(&spec.name, &assumed_architecture(spec.total_params))?
            }
        };
        let placed = graph.total_params();
        if placed > spec.total_params {
            // A count too small for the smallest assumed shape: one flat tensor.
            return Ok(graph.flattened(spec.total_params));
        }
        graph.add_unplaced(spec.total_params - placed);
        Ok(graph)
    }

    /// Removes the tensor named `name` (its unit stays, owning nothing).
    fn drop_tensor(&mut self, name: &str) {
        let Some(index) = self.tensors.iter().position(|t| t.name == name) else {
            return;
        };
        self.tensors.remove(index);
        for unit in &mut self.units {
            unit.tensors.retain(|&t| t != index);
            for t in &mut unit.tensors {
                if *t > index {
                    *t -= 1;
                }
            }
        }
    }

    /// Appends `numel` unplaced parameters in a unit before the LM head (or last).
    fn add_unplaced(&mut self, numel: u64) {
        if numel == 0 {
            return;
        }
        self.tensors.push(ParamTensor {
            name: UNPLACED.to_owned(),
            shape: vec![numel],
            numel,
        });
        let unit = FetchUnit {
            module: UNPLACED.to_owned(),
            tensors: vec![self.tensors.len() - 1],
            layer: None,
            kind: UnitKind::Norm,
            matmul_params: 0,
        };
        let at = self
            .units
            .iter()
            .position(|u| u.kind == UnitKind::LmHead)
            .unwrap_or(self.units.len());
        self.units.insert(at, unit);
    }

    /// The same architecture with every parameter in one flat tensor of `numel` elements.
    fn flattened(mut self, numel: u64) -> ModelGraph {
        self.tensors.clear();
        self.units.clear();
        self.add_unplaced(numel);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{load, presets};

    #[test]
    fn counts_alone_are_planned_exactly() {
        for total in [
            1_000,
            125_000_000,
            7_500_000_000,
            13_000_000_000,
            70_000_000_000,
        ] {
            let spec = load::from_params(total, None).expect("counts");
            let graph = ModelGraph::for_estimate(&spec).expect("graph");
            assert_eq!(graph.total_params(), total, "{total}");
            let unplaced = graph
                .tensors
                .iter()
                .find(|t| t.name == UNPLACED)
                .map_or(0, |t| t.numel);
            if total >= 125_000_000 {
                let arch = assumed_architecture(total);
                assert!(unplaced < arch.layers * (2 * arch.hidden + 1), "{total}");
            }
        }
    }

    #[test]
    fn an_excluded_head_owns_nothing_but_stays_a_unit() {
        let preset = presets::lookup("llama-2-7b").expect("preset");
        let spec = load::from_preset(preset, LmHead::Exclude).expect("counts");
        let graph = ModelGraph::for_estimate(&spec).expect("graph");
        assert_eq!(graph.total_params(), spec.total_params);
        let head = graph.units.last().expect("units");
        assert_eq!(head.kind, UnitKind::LmHead);
        assert!(head.tensors.is_empty());
        assert!(
            graph
                .units
                .iter()
                .flat_map(|u| &u.tensors)
                .all(|&t| t < graph.tensors.len())
        );
        let with_head = load::from_preset(preset, LmHead::Include).expect("counts");
        assert_eq!(
            ModelGraph::for_estimate(&with_head)
                .expect("graph")
                .total_params(),
            6_738_415_616
        );
    }
}
