//! A model family on the device is data and a recipe: its own tensors of the step, read by
//! name from the planner's list (`memory::cuda_layout`), and the ops its forward and backward
//! emit from the one vocabulary (`super::program::Op`). Everything else (the step, the
//! step's phases, the plan's collectives, both interpreters, the trainer) is written once.
//!
//! | family | tensors and recipe |
//! |---|---|
//! | GPT-2 | [`gpt2::Gpt2Tensors`]: learned positions, LayerNorm, GELU MLP, multi-head attention, tied `lm_head` |
//! | Llama, Qwen2, Mistral | [`llama::LlamaTensors`]: RMSNorm, RoPE, SwiGLU MLP, grouped-query attention, q/k/v (and o) biases, tied or untied `lm_head` |
//!
//! A new family (Mistral's sliding window, a mixture of experts) is a new file here: its
//! tensors, a [`Recipe`], and any new op it needs in the vocabulary.

pub mod gpt2;
pub mod llama;

use dsplan_planner::memory::cuda_layout::{self, CudaLayoutShape, CudaRegion, CudaTensor};

use super::mfu::Mfu;
use super::program::{Op, ShapeError};
use super::region::{Region, Tables, TensorRef};
use super::step_tensors::StepTensors;
use crate::model::{BatchShape, ModelConfig, Recompute};
use crate::tensor::TensorTable;
use gpt2::Gpt2Tensors;
use llama::LlamaTensors;

/// What the step asks of a model family.
pub trait Recipe {
    /// The model.
    fn model(&self) -> ModelConfig;

    /// The parameter tensors in flat order (one AdamW segment each).
    fn param_table(&self) -> &TensorTable;

    /// The normalisation epsilon (LayerNorm's or RMSNorm's).
    fn eps(&self) -> f32 {
        self.model().norm_eps()
    }

    /// What the kernels must offer this model beyond the ops' shapes (attention kernels for
    /// its head size in the step's dtype, no sliding window they cannot honour).
    fn check(&self, step: &StepTensors) -> Result<(), ShapeError>;

    /// Tables of f32 values the step reads but never writes, copied to the device once.
    fn constants(&self, _step: &StepTensors) -> Vec<ConstantUpload> {
        Vec::new()
    }

    /// Model FLOPs utilisation on `device` (`None` where the family's FLOPs are not counted
    /// yet).
    fn mfu(&self, seq_len: usize, device: &str) -> Option<Mfu>;

    /// The forward through the classifier (losses and dlogits), over the flat parameters.
    fn forward(&self, step: &StepTensors) -> Vec<Op>;

    /// The backward, accumulating into the flat gradients.
    fn backward(&self, step: &StepTensors) -> Vec<Op>;
}

/// A table of f32 values the step reads but never writes, copied to the device once.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstantUpload {
    /// Where it lives (region `Stats`).
    pub at: TensorRef,
    /// The values.
    pub values: Vec<f32>,
}

/// The run's family and its tensors.
#[derive(Debug, Clone)]
pub enum Family {
    /// GPT-2.
    Gpt2(Gpt2Tensors),
    /// The Llama family.
    Llama(LlamaTensors),
}

impl Family {
    /// The planner's tensors of a step of `model` on `shape` (the list the `dsplan-cuda` plan
    /// counts, which the step allocates).
    pub fn planner_tensors(
        model: &ModelConfig,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Vec<CudaTensor> {
        match model {
            ModelConfig::Gpt2(config) => Gpt2Tensors::planner_tensors(config, shape, recompute),
            ModelConfig::Llama(config) => LlamaTensors::planner_tensors(config, shape, recompute),
        }
    }

    /// The family's tensors of `model`, read from the planner's `tables`.
    pub fn new(model: &ModelConfig, recompute: Recompute, tables: &Tables) -> Self {
        let tables = &Tensors(tables);
        match model {
            ModelConfig::Gpt2(config) => Family::Gpt2(Gpt2Tensors::new(*config, recompute, tables)),
            ModelConfig::Llama(config) => {
                Family::Llama(LlamaTensors::new(*config, recompute, tables))
            }
        }
    }

    /// Its recipe.
    pub fn recipe(&self) -> &dyn Recipe {
        match self {
            Family::Gpt2(tensors) => tensors,
            Family::Llama(tensors) => tensors,
        }
    }
}

/// The planner's sizes of a step of `model` on `shape`, whose parameters are `param_tensors`
/// tensors.
fn layout_shape(model: ModelConfig, shape: BatchShape, param_tensors: usize) -> CudaLayoutShape {
    let arch = model.architecture();
    CudaLayoutShape {
        layers: arch.layers,
        hidden: arch.hidden,
        heads: arch.heads,
        vocab: arch.vocab,
        batch: shape.batch as u64,
        seq_len: shape.seq_len as u64,
        param_tensors: param_tensors as u64,
    }
}

/// The planner's tensors by name, as a family reads its own.
pub struct Tensors<'a>(&'a Tables);

impl Tensors<'_> {
    /// An activation (region `Activations`).
    pub fn activation(&self, name: &str) -> TensorRef {
        self.0.get(Region::Step(CudaRegion::Activations), name)
    }

    /// An f32 statistic (region `Stats`).
    pub fn stat(&self, name: &str) -> TensorRef {
        self.0.get(Region::Step(CudaRegion::Stats), name)
    }

    /// A backward scratch buffer (region `Scratch`).
    pub fn scratch(&self, name: &str) -> TensorRef {
        self.0.get(Region::Step(CudaRegion::Scratch), name)
    }

    /// Layer `l`'s tensors, by the planner's names.
    pub fn block(&self, recompute: Recompute, l: usize) -> BlockTensors<'_> {
        BlockTensors {
            tables: self,
            recompute,
            layer: l,
        }
    }
}

/// One layer's tensors: its own under no recompute, else the working set all layers share,
/// but for `residual3`, which every layer keeps.
pub struct BlockTensors<'a> {
    tables: &'a Tensors<'a>,
    recompute: Recompute,
    layer: usize,
}

impl BlockTensors<'_> {
    /// The planner's name of the layer's tensor `what`.
    fn name(&self, what: &str) -> String {
        let l = self.layer;
        match what {
            "residual3" => format!("h.{l}.residual3"),
            _ => format!(
                "{}.{what}",
                cuda_layout::working_set_prefix(self.recompute, l as u64)
            ),
        }
    }

    /// Its activation `what`.
    pub fn act(&self, what: &str) -> TensorRef {
        self.tables.activation(&self.name(what))
    }

    /// Its f32 statistic `what`.
    pub fn stat(&self, what: &str) -> TensorRef {
        self.tables.stat(&self.name(what))
    }
}
