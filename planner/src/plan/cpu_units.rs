//! The `dsplan-cpu` backend's units and what one forward/backward pass allocates for them.
//!
//! dsplan's CPU model computes a whole *unit* at a time: the embedding (token and position
//! tables), each transformer block, the final norm. Its units are the plan's fetch units
//! grouped ([`cpu_units`]): a fetch unit with a layer number belongs to that block; the fetch
//! units before the first block to the embedding, those after the last to the final norm; a
//! tensor belongs to the unit of the first fetch unit that uses it, and a fetch unit to the unit
//! of its first tensor (GPT-2's tied `lm_head` uses `wte`: it is the embedding's, fetched again
//! for the logits).
//!
//! Per unit the executor allocates, all `f32` in host memory (`W` ranks, `n` the unit's
//! elements):
//!
//! | buffer | size | when |
//! |---|---|---|
//! | gathered parameters | `n` (+ `W` spare elements under stage 3, where each tensor's padding spills over the next) | stage 3, or 16-bit storage (widened copy): while the unit computes, released after each use |
//! | fetch staging | the largest `⌈numel/W⌉` slice among the unit's gathered (non-persistent) tensors | stage 3 with 16-bit storage, or with one of the unit's slices on NVMe: the widened slice sent to each all-gather, during the fetch |
//! | unit gradients | `n` | backward: from the unit's gradient computation to its hand-over to the accumulation buffer or bucket |
//!
//! The order of one micro-step, and the ticks each buffer is placed on (a unit's ticks are its
//! fetch units' trace steps):
//!
//! * forward: the embedding (its fetch units before the first block; staging at the first),
//!   each block (staging at its first tick), then the final norm (from its tick to the head's)
//!   and, when the head is tied, the embedding again for the logits (at the head's tick, with
//!   its staging);
//! * backward: a tied embedding for the logits' backward (at the head's backward tick), its
//!   gradients from there to the end of backward (the position and token tables get theirs
//!   last); an untied embedding (Llama's `lm_head` is then the final norm's) has its gradients
//!   only over its own backward ticks, after every block; the final norm with its gradients;
//!   each block: its staging at its first backward tick, then its gradients over the rest (the
//!   executor fetches before it allocates the gradients, and a block has several ticks).
//!
//! Two of the executor's moments share a tick with a larger one and are left out: the fetch
//! staging of the embedding and of the final norm in backward (their gradients, allocated right
//! after on the same tick, are larger than the slice). Their staging is listed at their forward
//! fetches, with the same size.

use super::buffers::{BufferKind, BufferList, Lifetime, span};
use super::dtype::{Device, Dtype};
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::shards::Shards;
use super::ticks::Ticks;

/// Which of the CPU model's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CpuUnitRole {
    /// Token and position embeddings (and the tied head).
    Embedding,
    /// Transformer block `n`.
    Block(u64),
    /// The final norm.
    FinalNorm,
}

/// One unit of the CPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuUnit {
    /// Which.
    pub role: CpuUnitRole,
    /// Model tensors (indices into [`ModelGraph::tensors`]).
    pub tensors: Vec<usize>,
    /// Fetch units (indices into [`ModelGraph::units`]), in forward order.
    pub fetch_units: Vec<usize>,
    /// Elements of its tensors.
    pub numel: u64,
}

/// The CPU model's units of `model`, in forward order (embedding, blocks, final norm).
pub fn cpu_units(model: &ModelGraph) -> Vec<CpuUnit> {
    let mut seen_block = false;
    let roles: Vec<CpuUnitRole> = model
        .units
        .iter()
        .map(|unit| match unit.layer {
            Some(layer) => {
                seen_block = true;
                CpuUnitRole::Block(layer)
            }
            None if seen_block => CpuUnitRole::FinalNorm,
            None => CpuUnitRole::Embedding,
        })
        .collect();
    let mut units: Vec<CpuUnit> = Vec::new();
    let mut unit_of_tensor: Vec<Option<usize>> = vec![None; model.tensors.len()];
    // Each role's unit, found in constant time (a search per fetch unit was quadratic in the
    // layer count).
    let mut index_of_role: std::collections::HashMap<CpuUnitRole, usize> =
        std::collections::HashMap::new();
    for (f, unit) in model.units.iter().enumerate() {
        let own = *index_of_role.entry(roles[f]).or_insert_with(|| {
            units.push(CpuUnit {
                role: roles[f],
                tensors: Vec::new(),
                fetch_units: Vec::new(),
                numel: 0,
            });
            units.len() - 1
        });
        for &t in &unit.tensors {
            if t < unit_of_tensor.len() && unit_of_tensor[t].is_none() {
                unit_of_tensor[t] = Some(own);
                units[own].tensors.push(t);
                units[own].numel += model.tensors[t].numel;
            }
        }
        let home = unit
            .tensors
            .first()
            .and_then(|&t| unit_of_tensor.get(t).copied().flatten())
            .unwrap_or(own);
        units[home].fetch_units.push(f);
    }
    units.retain(|u| !u.tensors.is_empty());
    units
}

/// What the pass buffers depend on.
pub struct PassInputs<'a> {
    /// The model.
    pub model: &'a ModelGraph,
    /// Layout (each tensor's stage-3 slice).
    pub layout: &'a Layout,
    /// Shards (the persistent set).
    pub shards: &'a Shards,
    /// Ticks.
    pub ticks: &'a Ticks,
    /// The CPU units.
    pub units: &'a [CpuUnit],
    /// Ranks.
    pub world: u64,
    /// Whether units are gathered into `f32` copies (stage 3, or 16-bit storage).
    pub gathers: bool,
    /// Stage 3: `W` spare elements per gathered unit.
    pub stage3: bool,
    /// Whether each gathered slice is widened through staging (stage 3 with 16-bit storage).
    pub stages_fetches: bool,
    /// Per model tensor: whether its stage 3 slice lives on NVMe (a unit with such a slice is
    /// gathered through staging whatever the dtype: the slice is read into it first).
    pub nvme_resident: &'a [bool],
    /// Per model tensor: whether it is persistent (stage 3), looked up once per tensor.
    pub persistent: &'a [bool],
}

/// The tick range of a pass over fetch units `fetch` (ascending), as `(first, last)`.
fn forward_ticks(ticks: &Ticks, fetch: &[usize]) -> Option<(usize, usize)> {
    Some((ticks.trace(*fetch.first()?), ticks.trace(*fetch.last()?)))
}

fn backward_ticks(ticks: &Ticks, fetch: &[usize]) -> Option<(usize, usize)> {
    let back = |f: usize| ticks.trace(2 * ticks.units - 1 - f);
    Some((back(*fetch.last()?), back(*fetch.first()?)))
}

impl PassInputs<'_> {
    /// Elements of a gathered unit.
    fn gathered_numel(&self, unit: &CpuUnit) -> u64 {
        unit.numel + if self.stage3 { self.world } else { 0 }
    }

    /// Elements of the unit's fetch staging: its largest gathered slice.
    fn staging_numel(&self, unit: &CpuUnit) -> u64 {
        let slice = |t: usize| self.layout.entry_of(t).map_or(0, |e| e.partition_numel);
        let persistent = |t: usize| self.persistent.get(t).copied().unwrap_or(false);
        let gathered: Vec<usize> = unit
            .fetch_units
            .iter()
            .flat_map(|&f| self.model.units[f].tensors.iter().copied())
            .filter(|&t| unit.tensors.contains(&t) && !persistent(t))
            .collect();
        let swapped = self.stage3
            && gathered
                .iter()
                .any(|&t| self.nvme_resident.get(t).copied().unwrap_or(false));
        if !self.stages_fetches && !swapped {
            return 0;
        }
        gathered.into_iter().map(slice).max().unwrap_or(0)
    }

    fn gathered(&self, list: &mut BufferList, unit: &CpuUnit, what: &str, lifetime: Lifetime) {
        if self.gathers {
            list.add(
                format!("gathered {} (f32, {what})", name(unit)),
                BufferKind::GatheredParameters,
                Dtype::Fp32,
                self.gathered_numel(unit),
                Device::Cpu,
                lifetime,
            );
        }
    }

    fn staging(&self, list: &mut BufferList, unit: &CpuUnit, what: &str, tick: usize) {
        list.add(
            format!("fetch staging of {} (f32, {what})", name(unit)),
            BufferKind::CollectiveStaging,
            Dtype::Fp32,
            self.staging_numel(unit),
            Device::Cpu,
            span(tick, tick),
        );
    }

    fn gradients(&self, list: &mut BufferList, unit: &CpuUnit, lifetime: Lifetime) {
        list.add(
            format!("gradients of {} (f32)", name(unit)),
            BufferKind::ModuleGradients,
            Dtype::Fp32,
            unit.numel,
            Device::Cpu,
            lifetime,
        );
    }
}

fn name(unit: &CpuUnit) -> String {
    match unit.role {
        CpuUnitRole::Embedding => "the embedding".into(),
        CpuUnitRole::Block(n) => format!("block {n}"),
        CpuUnitRole::FinalNorm => "the final norm".into(),
    }
}

/// The gathered parameters, fetch staging and unit gradients of one micro-step (see the
/// [module documentation](self)).
pub fn pass_buffers(inputs: &PassInputs<'_>, list: &mut BufferList) {
    let ticks = inputs.ticks;
    let first_block_fetch = inputs
        .units
        .iter()
        .find(|u| matches!(u.role, CpuUnitRole::Block(_)))
        .and_then(|u| u.fetch_units.first().copied())
        .unwrap_or(ticks.units);
    let last_forward = ticks.first_backward().saturating_sub(1);
    // The embedding's fetch units before the blocks (its first use) and after them (the head).
    let embedding = inputs
        .units
        .iter()
        .find(|u| u.role == CpuUnitRole::Embedding);
    let (pre, head): (Vec<usize>, Vec<usize>) = embedding.map_or((Vec::new(), Vec::new()), |e| {
        e.fetch_units.iter().partition(|&&f| f < first_block_fetch)
    });
    let head_forward = forward_ticks(ticks, &head).map_or(last_forward, |(_, last)| last);
    let head_backward = 2 * ticks.units - 1 - head_forward;
    let final_norm = inputs
        .units
        .iter()
        .find(|u| u.role == CpuUnitRole::FinalNorm);

    if let (Some(unit), Some((first, last))) = (embedding, forward_ticks(ticks, &pre)) {
        inputs.gathered(list, unit, "forward", span(first, last));
        inputs.staging(list, unit, "forward", first);
    }
    for unit in inputs
        .units
        .iter()
        .filter(|u| matches!(u.role, CpuUnitRole::Block(_)))
    {
        let Some((first, last)) = forward_ticks(ticks, &unit.fetch_units) else {
            continue;
        };
        inputs.gathered(list, unit, "forward", span(first, last));
        inputs.staging(list, unit, "forward", first);
    }
    if let Some(unit) = final_norm
        && let Some((first, _)) = forward_ticks(ticks, &unit.fetch_units)
    {
        inputs.gathered(list, unit, "forward", span(first, head_forward));
        inputs.staging(list, unit, "forward", first);
    }
    if let Some(unit) = embedding {
        let own_backward = backward_ticks(ticks, &pre);
        let end = own_backward.map_or(ticks.epilogue() - 1, |(_, last)| last);
        if head.is_empty() {
            // Untied: the head is the final norm's; the embedding's gradient is made by the
            // lookup's backward, after every block.
            let from = own_backward.map_or(end, |(first, _)| first);
            inputs.gradients(list, unit, span(from, end));
        } else {
            inputs.gathered(list, unit, "logits", span(head_forward, head_forward));
            inputs.staging(list, unit, "logits", head_forward);
            inputs.gathered(
                list,
                unit,
                "logits' backward",
                span(head_backward, head_backward),
            );
            inputs.gradients(list, unit, span(head_backward, end));
        }
    }
    if let Some(unit) = final_norm
        && let Some((first, last)) = backward_ticks(ticks, &unit.fetch_units)
    {
        inputs.gathered(list, unit, "backward", span(first, last));
        inputs.gradients(list, unit, span(first, last));
    }
    for unit in inputs
        .units
        .iter()
        .filter(|u| matches!(u.role, CpuUnitRole::Block(_)))
    {
        let Some((first, last)) = backward_ticks(ticks, &unit.fetch_units) else {
            continue;
        };
        inputs.gathered(list, unit, "backward", span(first, last));
        inputs.staging(list, unit, "backward", first);
        let from = if last > first { first + 1 } else { first };
        inputs.gradients(list, unit, span(from, last));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, Embeddings, Family};

    fn gpt2(layers: u64) -> ModelGraph {
        let arch = Architecture {
            family: Family::Gpt2,
            layers,
            hidden: 8,
            heads: 2,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 32,
            vocab: 16,
            positions: Some(8),
            embeddings: Embeddings::Tied,
        };
        ModelGraph::from_architecture("gpt2", &arch).expect("graph")
    }

    #[test]
    fn gpt2_groups_into_embedding_blocks_and_final_norm() {
        let model = gpt2(2);
        let units = cpu_units(&model);
        let roles: Vec<CpuUnitRole> = units.iter().map(|u| u.role).collect();
        assert_eq!(
            roles,
            [
                CpuUnitRole::Embedding,
                CpuUnitRole::Block(0),
                CpuUnitRole::Block(1),
                CpuUnitRole::FinalNorm
            ]
        );
        // wte and wpe; the tied head is the embedding's fetch unit too.
        assert_eq!(units[0].tensors, [0, 1]);
        assert_eq!(units[0].numel, 16 * 8 + 8 * 8);
        let head = model.units.len() - 1;
        assert_eq!(units[0].fetch_units, [0, 1, head]);
        assert_eq!(units[1].fetch_units.len(), 6);
        assert_eq!(units[3].tensors.len(), 2);
        let total: u64 = units.iter().map(|u| u.numel).sum();
        assert_eq!(total, model.total_params());
    }
}
