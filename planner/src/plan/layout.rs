//! [`Layout`]: where every parameter tensor sits in the flat model-dtype parameter buffer and
//! in the fp32 master buffer, with DeepSpeed's padding for partitioning.
//!
//! - **Stage 0** ([`LayoutScheme::Flat`], alignment 1): tensors back to back in
//!   `model.parameters()` order; every rank holds all of it, the fp32 master and optimizer
//!   states included (fp16 and bf16 both run `FP16_Optimizer`).
//! - **Stages 1 and 2** ([`LayoutScheme::Flat`]): the same, in `round_robin_gradients` order if
//!   set, then zeros appended until the length is a multiple of 2·N (`nccl_start_alignment_factor`
//!   = 2 elements, times the world size), so it splits into N equal partitions of P elements.
//!   A tensor may straddle two partitions. The fp32 master of rank r is its partition
//!   [r·P, (r+1)·P), so `master_offset` is an offset in the concatenation of all ranks' masters.
//! - **Stage 3** ([`LayoutScheme::PerParameter`]): each tensor is partitioned on its own into N
//!   slices of p = ⌈numel/N⌉ (the last zero-padded); every rank's partition buffer holds its
//!   slice of each tensor back to back, so a tensor's `offset` in that buffer is the same on
//!   every rank. The fp32 master (one flat per sub-group, sub-groups contiguous) uses the same
//!   offsets.

use serde::Serialize;

use super::dtype::Dtype;
use super::model_graph::ModelGraph;
use super::settings::{FlatOrder, Settings};
use crate::config::ZeroStage;

/// DeepSpeed's `nccl_start_alignment_factor`: partitions start on 2-element boundaries.
pub const NCCL_START_ALIGNMENT: u64 = 2;

/// How the parameter buffer is cut across ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LayoutScheme {
    /// One flat buffer cut into N equal partitions (stages 0-2).
    Flat,
    /// Every tensor cut into N equal slices (stage 3).
    PerParameter,
}

/// One tensor's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayoutEntry {
    /// Index in [`ModelGraph::tensors`].
    pub tensor: usize,
    /// Name.
    pub name: String,
    /// Shape.
    pub shape: Vec<u64>,
    /// Element type in the parameter buffer.
    pub dtype: Dtype,
    /// Elements.
    pub numel: u64,
    /// Flat: offset in the full flat buffer. Per-parameter: offset in every rank's partition
    /// buffer.
    pub offset: u64,
    /// Per-parameter: elements of one rank's slice, ⌈numel/N⌉. Flat: `numel`.
    pub partition_numel: u64,
    /// Offset in the fp32 master (see the module doc); `None` when the parameters are the
    /// master (stage 0 in fp32).
    pub master_offset: Option<u64>,
}

/// The parameter layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Flat or per-parameter.
    pub scheme: LayoutScheme,
    /// Model dtype of the parameter buffer.
    pub dtype: Dtype,
    /// Master dtype, when a separate master exists.
    pub master_dtype: Option<Dtype>,
    /// Tensors in buffer order.
    pub entries: Vec<LayoutEntry>,
    /// Real elements.
    pub numel: u64,
    /// Elements including padding, over all ranks.
    pub padded_numel: u64,
    /// Flat: the padded length is a multiple of this. Per-parameter: each tensor is padded to a
    /// multiple of this (N).
    pub alignment: u64,
    /// Elements each rank holds of the partitioned buffer (P, or Σp); the whole buffer when
    /// nothing is partitioned.
    pub partition_numel: u64,
}

impl Layout {
    /// The layout for `model` under `settings`.
    pub fn new(model: &ModelGraph, settings: &Settings) -> Layout {
        let world = settings.world_size;
        let dtype = settings.dtypes.params;
        let separate_master = settings.stage != ZeroStage::Disabled || dtype != Dtype::Fp32;
        let master_dtype = separate_master.then_some(settings.dtypes.master);
        let order = tensor_order(model, settings.flat_order, world);
        let per_parameter = settings.stage == ZeroStage::Weights;
        let mut entries = Vec::with_capacity(order.len());
        let mut offset = 0;
        for index in order {
            let tensor = &model.tensors[index];
            let partition_numel = if per_parameter {
                tensor.numel.div_ceil(world)
            } else {
                tensor.numel
            };
            entries.push(LayoutEntry {
                tensor: index,
                name: tensor.name.clone(),
                shape: tensor.shape.clone(),
                dtype,
                numel: tensor.numel,
                offset,
                partition_numel,
                master_offset: separate_master.then_some(offset),
            });
            offset += partition_numel;
        }
        let numel = model.total_params();
        if per_parameter {
            return Layout {
                scheme: LayoutScheme::PerParameter,
                dtype,
                master_dtype,
                entries,
                numel,
                padded_numel: offset * world,
                alignment: world,
                partition_numel: offset,
            };
        }
        let (alignment, partitions) = if settings.partitions_optimizer() {
            (NCCL_START_ALIGNMENT * world, world)
        } else {
            (1, 1)
        };
        let padded_numel = numel.div_ceil(alignment) * alignment;
        Layout {
            scheme: LayoutScheme::Flat,
            dtype,
            master_dtype,
            entries,
            numel,
            padded_numel,
            alignment,
            partition_numel: padded_numel / partitions,
        }
    }

    /// Bytes of one rank's share of the parameter buffer.
    pub fn partition_bytes(&self) -> u64 {
        self.partition_numel * self.dtype.bytes()
    }

    /// The entry of model tensor `tensor`: at its own index when the buffer is in model order
    /// (constant time: callers ask for every tensor), else found by a search.
    pub fn entry_of(&self, tensor: usize) -> Option<&LayoutEntry> {
        self.entries
            .get(tensor)
            .filter(|e| e.tensor == tensor)
            .or_else(|| self.entries.iter().find(|e| e.tensor == tensor))
    }
}

/// Tensor indices in buffer order.
fn tensor_order(model: &ModelGraph, order: FlatOrder, world: u64) -> Vec<usize> {
    let count = model.tensors.len();
    match order {
        FlatOrder::Model => (0..count).collect(),
        FlatOrder::RoundRobin => {
            let lists = usize::try_from(world).unwrap_or(usize::MAX).max(1);
            (0..lists.min(count))
                .flat_map(|list| (list..count).step_by(lists))
                .collect()
        }
    }
}
