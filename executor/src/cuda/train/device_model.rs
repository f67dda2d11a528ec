//! [`DeviceModel`]: the device layout of the run's model family, and what the trainer asks of
//! it (the step's ops, its check, the region sizes, the parameter table, the norm epsilon,
//! constant tables to upload once). The trainer is written once; each family is written once
//! here and in its layout and op builders.

use dsplan_kernels::Dtype;

use super::buffers::{DeviceLayout, RegionSizes, TensorRef};
use super::llama::LlamaDeviceLayout;
use super::mfu::Mfu;
use super::program::ShapeError;
use super::step::StepProgram;
use super::world_step::WorldLayout;
use crate::metrics::ByCategory;
use crate::model::{BatchShape, ModelConfig, Recompute};
use crate::tensor::TensorTable;

/// The device layout of one model family.
#[derive(Debug, Clone)]
pub enum DeviceModel {
    /// GPT-2.
    Gpt2(DeviceLayout),
    /// The Llama family.
    Llama(LlamaDeviceLayout),
}

/// A table of f32 values the step reads but never writes, copied to the device once.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstantUpload {
    /// Where it lives (region `Stats`).
    pub at: TensorRef,
    /// The values.
    pub values: Vec<f32>,
}

impl DeviceModel {
    /// The layout of `model` on micro-batches of `shape`, stored in `dtype`, recomputing as
    /// `recompute` says (activation checkpointing).
    pub fn new(model: &ModelConfig, shape: BatchShape, dtype: Dtype, recompute: Recompute) -> Self {
        match model {
            ModelConfig::Gpt2(config) => {
                Self::Gpt2(DeviceLayout::recomputing(*config, shape, dtype, recompute))
            }
            ModelConfig::Llama(config) => Self::Llama(LlamaDeviceLayout::recomputing(
                *config, shape, dtype, recompute,
            )),
        }
    }

    /// The step's op lists.
    pub fn program(&self) -> StepProgram {
        match self {
            Self::Gpt2(layout) => StepProgram::new(layout),
            Self::Llama(layout) => StepProgram::llama(layout),
        }
    }

    /// Checks `program` (built by [`DeviceModel::program`]) against the layout and kernels.
    pub fn check(&self, program: &StepProgram) -> Result<(), ShapeError> {
        match self {
            Self::Gpt2(layout) => program.check(layout),
            Self::Llama(layout) => program.check_llama(layout),
        }
    }

    /// The layout as [`super::world_program`] reads it (its shares of the plan, its passes).
    pub fn world_layout(&self) -> &dyn WorldLayout {
        match self {
            Self::Gpt2(layout) => layout,
            Self::Llama(layout) => layout,
        }
    }

    /// The regions' sizes.
    pub fn sizes(&self) -> &dyn RegionSizes {
        match self {
            Self::Gpt2(layout) => layout,
            Self::Llama(layout) => layout,
        }
    }

    /// The parameter tensors in flat order (one AdamW segment each).
    pub fn param_table(&self) -> &TensorTable {
        match self {
            Self::Gpt2(layout) => layout.params.table(),
            Self::Llama(layout) => layout.params.table(),
        }
    }

    /// The normalisation epsilon (LayerNorm's or RMSNorm's).
    pub fn eps(&self) -> f32 {
        match self {
            Self::Gpt2(layout) => layout.config.layer_norm_epsilon,
            Self::Llama(layout) => layout.config.rms_norm_eps,
        }
    }

    /// Bytes per memory category of every region.
    pub fn bytes_by_category(&self) -> ByCategory {
        match self {
            Self::Gpt2(layout) => layout.bytes_by_category(),
            Self::Llama(layout) => layout.bytes_by_category(),
        }
    }

    /// The tables to copy to the device before the first step: the Llama family's rotation
    /// table (`rope_cos`, `rope_sin`, the CPU model's `Rope::table` for the run's rows).
    pub fn constants(&self) -> Vec<ConstantUpload> {
        match self {
            Self::Gpt2(_) => Vec::new(),
            Self::Llama(layout) => {
                let table = layout
                    .config
                    .rope
                    .table(layout.config.head_dim, layout.shape.seq_len);
                vec![
                    ConstantUpload {
                        at: layout.rope_cos,
                        values: table.cos().to_vec(),
                    },
                    ConstantUpload {
                        at: layout.rope_sin,
                        values: table.sin().to_vec(),
                    },
                ]
            }
        }
    }

    /// Model FLOPs utilisation on `device` (GPT-2's FLOPs count; none for the Llama family
    /// yet).
    pub fn mfu(&self, seq_len: usize, device: &str) -> Option<Mfu> {
        match self {
            Self::Gpt2(layout) => Mfu::of(&layout.config, seq_len, device),
            Self::Llama(_) => None,
        }
    }
}
