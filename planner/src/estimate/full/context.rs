//! The inputs every term reads, bundled, with the partition arithmetic they share.

use crate::estimate::Topology;

use super::model_dims::ModelDims;
use super::rows::{Category, Device, PhaseBytes, Row, Term, ceil_div, saturate};
use super::setup::{TrainingSetup, TrainingShape};

/// The model, the setup, the shape and the cluster of one estimate.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The model.
    pub model: &'a ModelDims,
    /// Precision, optimizer, ZeRO.
    pub setup: &'a TrainingSetup,
    /// Sequence, micro-batch, checkpointing, attention.
    pub shape: &'a TrainingShape,
    /// The cluster.
    pub hardware: Topology,
}

impl Context<'_> {
    /// The data-parallel world size.
    pub fn world(&self) -> u128 {
        u128::from(self.hardware.total_gpus())
    }

    /// Ranks (GPUs) per node: host and NVMe rows are per-rank amounts times this.
    pub fn ranks_per_node(&self) -> u64 {
        self.hardware.gpus_per_node()
    }

    /// All parameters.
    pub fn params(&self) -> u128 {
        u128::from(self.model.total_params)
    }

    /// One rank's partition of the parameters, `ceil(P / N)` (DeepSpeed pads to equal parts).
    pub fn partition(&self) -> u128 {
        ceil_div(self.params(), self.world())
    }

    /// A row whose `per_rank` bytes are multiplied by the ranks of a node when `device` is
    /// host memory or NVMe (GPU rows are per GPU already).
    pub fn row(
        &self,
        term: Term,
        category: Category,
        device: Device,
        per_rank: PhaseBytes,
        formula: impl Into<String>,
    ) -> Row {
        let formula = formula.into();
        if device == Device::Gpu {
            return Row::new(term, category, device, per_rank, formula);
        }
        let ranks = self.ranks_per_node();
        let mut per_node = PhaseBytes::default();
        for phase in super::rows::Phase::ALL {
            per_node.set(
                phase,
                saturate(u128::from(per_rank.get(phase)) * u128::from(ranks)),
            );
        }
        let formula = if ranks > 1 {
            format!("({formula}) x {ranks} ranks")
        } else {
            formula
        };
        Row::new(term, category, device, per_node, formula)
    }
}
