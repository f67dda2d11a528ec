//! 3D parallelism: tensor (`t`), pipeline (`p`, 1F1B and interleaved), sequence (Megatron's
//! and DeepSpeed-Ulysses') and data parallelism (`d`) with ZeRO 0-3 or Megatron's distributed
//! optimizer, for `estimate`, `plan` and `recommend`.
//!
//! | module | job |
//! |---|---|
//! | [`shape`], [`layout`] | the model as Megatron describes it; the GPU split, batch and runtime of a [`Job`] |
//! | [`megatron_args`], [`deepspeed_sections`] | a job from `pretrain_gpt.py` flags, or from a `ds_config.json`'s `pipeline`, `tensor_parallel` and `sequence_parallel_size` |
//! | [`checks`], [`error`] | what Megatron-LM and DeepSpeed refuse, naming the flag |
//! | [`calculator`] | Megatron-LM's `report_theoretical_memory`, exactly |
//! | [`params`], [`activations`], [`states`] | parameters of each stage, activation bytes of a layer, model-state bytes |
//! | [`schedule`] | the pipeline schedule: in-flight micro-batches, ticks, bubble |
//! | [`stages`] | dsplan's `full` estimate: each pipeline stage's peak and after-step memory, term by term |
//! | [`time`], [`search`] | the step-time model and `recommend`'s analytic layout search |

pub mod activations;
pub mod calculator;
pub mod checks;
pub mod deepspeed_sections;
pub mod error;
pub mod launch;
pub mod layout;
pub mod megatron_args;
pub mod params;
pub mod schedule;
pub mod search;
pub mod shape;
pub mod stages;
pub mod states;
pub mod time;

pub use error::{FlagNames, ParallelError, ParallelErrors};
pub use layout::{
    Batch, Dropout, DropoutUse, GradientAccumulationFusion, Job, Layout, OptimizerSharding,
    PipelineSchedule, Recompute, RecomputeMethod, Runtime, SequenceParallel, Training,
};
pub use shape::{LinearBias, Mlp, Norm, Positions, TransformerShape, VocabPadding};
