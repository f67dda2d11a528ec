//! Memory arithmetic shared by the plan ([`crate::plan`]) and the full estimate
//! ([`crate::estimate::full`]), so that the two cannot drift apart:
//!
//! | module | what |
//! |---|---|
//! | [`shape`] | precision, the training shape (sequence, micro-batch, checkpointing, attention) |
//! | [`layer_dims`](mod@layer_dims) | the per-layer dimensions of an architecture the activation formulas read |
//! | [`activations`] | what a transformer layer stores for backward, its working set, the input ends, logits and loss |
//! | [`optimizer`] | state tensors per parameter of the optimizers DeepSpeed builds |
//! | [`cpu_arena`] | the activation arena of dsplan's CPU executor (the `dsplan-cpu` plan backend) |
//! | [`cpu_arena_llama`] | the same for its Llama-family decoder |
//! | [`cuda_layout`] | the activation and scratch buffers of dsplan's CUDA step (the `dsplan-cuda` plan backend) |
//!
//! The plan places these bytes in time (its buffer list and timeline); the estimate reads its
//! rows from the plan.

pub mod activations;
pub mod cpu_arena;
pub mod cpu_arena_llama;
pub mod cuda_layout;
pub mod layer_dims;
pub mod optimizer;
pub mod shape;

pub use activations::{
    InputEnds, LayerBytes, LossBytes, TypedBytes, checkpoint_bytes, cross_attention_bytes,
    input_ends, largest_intermediate, layer_bytes, loss_bytes,
};
pub use cpu_arena::{CpuArenaShape, Recompute, arena_bytes, arena_elements};
pub use cpu_arena_llama::{LlamaArenaShape, llama_arena_elements};
pub use cuda_layout::{
    CudaElement, CudaLayoutShape, CudaRegion, CudaTensor, cuda_tensors, region_elements,
};
pub use layer_dims::{Dropout, LayerDims, Mlp, MlpActivation, NormKind, layer_dims};
pub use optimizer::states_per_param;
pub use shape::{
    AttentionKernel, CheckpointPlacement, Checkpointing, MAX_SHAPE_DIMENSION, Precision,
    TrainingShape,
};
