//! dsplan's `full` estimate of a 3D-parallel job: every pipeline stage's peak and after-step
//! memory on one GPU, term by term.
//!
//! What each stage holds at its peak (the moment its first backward starts, when it holds the
//! most micro-batches, see [`super::schedule::in_flight`]):
//! - its **model states** ([`super::states`]): what stays after a step, plus gradients alive
//!   during backward and ZeRO-3's gathered layers;
//! - the **stored activations** of every micro-batch in flight ([`super::activations`]), on
//!   the first stage the embedding's dropout mask and token ids, on the last stage the final
//!   norm, the output layer's input and the cross-entropy's fp32 softmax (`4·T·V/t`, kept for
//!   backward);
//! - the largest **temporary** of that moment: the 16-bit logits next to their fp32 copy
//!   (forward) or the 16-bit logit gradient next to the fp32 one (backward), the 16-bit
//!   gradient of the largest weight without gradient-accumulation fusion, or a layer's
//!   backward working set plus the layers being recomputed.
//!
//! The step itself peaks separately (persistent states plus the step's fp32 temporaries);
//! `peak_bytes` is the larger of the two. `after_step_bytes` is what stays allocated
//! between steps: the model states and, under Megatron-LM with a pipeline, the **retained
//! pipeline inputs** ([`retained_pipeline_inputs`]): every model chunk that receives its input
//! from the previous stage keeps the last one it received, and that tensor's gradient. Both
//! are PyTorch's *allocated* bytes, what Megatron-LM's CI logs
//! (`mem-max-allocated-bytes`, `mem-allocated-bytes`); `reserved_bytes` adds the caching
//! allocator's fragmentation and the CUDA context ([`crate::estimate::full::Margins`]).

use serde::Serialize;

use super::activations::{Tokens, layer_activations, stored_per_chunk};
use super::error::ParallelError;
use super::layout::{DropoutUse, GradientAccumulationFusion, Job, Runtime};
use super::params::stage_params;
use super::schedule::{InFlight, in_flight, layer_ranges};
use super::states::state_bytes;
use crate::estimate::full::Margins;

/// A named part of a stage's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Term {
    /// 16-bit (or fp32) parameters.
    Parameters,
    /// Gradients kept between steps (Megatron's fp32 buffer).
    Gradients,
    /// fp32 master weights.
    MasterParameters,
    /// Adam's moments.
    OptimizerStates,
    /// Gradients alive during backward only, and reduce buckets.
    BackwardGradients,
    /// ZeRO-3's gathered parameters.
    GatheredParameters,
    /// Activations of the transformer layers for every micro-batch in flight.
    LayerActivations,
    /// Embedding dropout masks and token ids of the micro-batches in flight (first stage).
    EmbeddingActivations,
    /// Final norm, output-layer input and the loss's fp32 softmax (last stage).
    OutputActivations,
    /// The largest temporary at the peak.
    PeakTemporary,
    /// Temporaries of the optimizer step.
    StepTemporaries,
    /// The last input each model chunk received from the previous pipeline stage, and its
    /// gradient, still referenced after the step (Megatron-LM).
    RetainedPipelineInputs,
}

impl Term {
    /// A label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Term::Parameters => "parameters",
            Term::Gradients => "gradient buffer",
            Term::MasterParameters => "fp32 master weights",
            Term::OptimizerStates => "optimizer states",
            Term::BackwardGradients => "backward gradients and buckets",
            Term::GatheredParameters => "gathered parameters (ZeRO-3)",
            Term::LayerActivations => "layer activations in flight",
            Term::EmbeddingActivations => "embedding activations",
            Term::OutputActivations => "output layer and loss",
            Term::PeakTemporary => "largest temporary",
            Term::StepTemporaries => "optimizer-step temporaries",
            Term::RetainedPipelineInputs => "retained pipeline inputs",
        }
    }
}

/// What the largest temporary at the peak is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Temporary {
    /// The 16-bit logits (or their gradient) next to the fp32 ones.
    Logits,
    /// The 16-bit gradient of the largest weight (no gradient-accumulation fusion).
    WeightGradient,
    /// A layer's backward working set, with the layers being recomputed.
    LayerBackward,
}

/// One term's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TermBytes {
    /// The term.
    pub term: Term,
    /// Bytes at the stage's peak (0 when it is not part of it).
    pub peak_bytes: u64,
    /// Bytes after a step.
    pub after_step_bytes: u64,
}

/// When a stage peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeakMoment {
    /// With the most micro-batches in flight (first backward).
    Activations,
    /// In the optimizer step.
    Step,
}

/// One pipeline stage's estimate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageEstimate {
    /// Pipeline rank.
    pub stage: u64,
    /// Its layers, one half-open range per model chunk.
    pub layers: Vec<(u64, u64)>,
    /// Parameters on one GPU of the stage.
    pub params: u64,
    /// Micro-batches it holds at its peak.
    pub in_flight: InFlight,
    /// Peak allocated bytes.
    pub peak_bytes: u64,
    /// Allocated bytes after a step.
    pub after_step_bytes: u64,
    /// Peak plus fragmentation and the CUDA context.
    pub reserved_bytes: u64,
    /// When the peak happens.
    pub peak_moment: PeakMoment,
    /// The largest temporary at the activation peak.
    pub temporary: Temporary,
    /// Every term.
    pub terms: Vec<TermBytes>,
}

/// The estimate of every stage.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FullParallelEstimate {
    /// The vocabulary after padding.
    pub padded_vocab: u64,
    /// Micro-batches per step of each pipeline.
    pub micro_batches: u64,
    /// One entry per pipeline stage.
    pub pipeline_stages: Vec<StageEstimate>,
    /// The stage with the highest reserved peak.
    pub peak_stage: u64,
}

/// Bytes Megatron-LM keeps after a step on pipeline rank `rank` for the inputs its model
/// chunks received from the previous stage: `2·e·s·b·h ÷ t_sp` for each such chunk (every
/// chunk but the first stage's first, which embeds its tokens), 0 without a pipeline.
///
/// At Megatron-LM d98e8a64: `forward_step` hands each micro-batch's received tensor to the
/// chunk (`schedules.py:507`, `set_input_tensor(input_tensor)`), and `TransformerBlock`
/// stores it (`transformer_block.py:463`, `self.input_tensor = input_tensor`), replaced only
/// by the chunk's next forward. `backward_step` retains that leaf's gradient
/// (`schedules.py:561`, `x.retain_grad()`; read at `:591`) to send it back. The schedule drops
/// its own references (`schedules.py:1432`, `input_tensors[model_chunk_id].pop(0)`), but the
/// chunk's reference keeps both tensors of its last micro-batch alive through the optimizer
/// step until the next step's forward. The tensor is `[s ÷ t_sp, b, h]` (also ÷ the
/// context-parallel size, which dsplan does not model) in `config.pipeline_dtype`
/// (`schedules.py:1184-1187`; `p2p_communication.py:335`, `torch.empty(recv_prev_shape,
/// requires_grad=True, dtype=config.pipeline_dtype)`).
///
/// At the activation peak each chunk's reference is already one of the micro-batches in
/// flight (counted with the layer activations) whose backward has not yet run, so the term
/// counts only after the step and in the step's peak. DeepSpeed's PipelineEngine keeps its
/// own buffers and is not counted here.
pub fn retained_pipeline_inputs(job: &Job, rank: u64) -> u64 {
    match job.training.runtime {
        Runtime::MegatronLm { .. } if job.layout.pipeline > 1 => {
            let chunks = job.layout.schedule.chunks();
            let receiving = if rank == 0 {
                chunks.saturating_sub(1)
            } else {
                chunks
            };
            let Tokens {
                tokens,
                sequence_split,
            } = Tokens::of(job);
            let e = job.training.precision.element_bytes();
            receiving * 2 * e * tokens * job.shape.hidden / sequence_split
        }
        Runtime::MegatronLm { .. } | Runtime::DeepSpeed { .. } => 0,
    }
}

/// Estimates one stage.
pub fn estimate_stage(job: &Job, padded_vocab: u64, margins: &Margins, rank: u64) -> StageEstimate {
    let layout = &job.layout;
    let shape = &job.shape;
    let micro_batches = job.micro_batches();
    let params = stage_params(shape, layout, padded_vocab, rank);
    let states = state_bytes(job, params.total(), params.largest_weight);
    let held = in_flight(layout, micro_batches, rank);
    let chunks = layout.schedule.chunks();
    let per_chunk_layers = shape.layers / (layout.pipeline * chunks).max(1);
    let (stored_per_mb, recompute_extra) = stored_per_chunk(job, per_chunk_layers);
    let layer_bytes = held.total * stored_per_mb;
    let layer = layer_activations(job);
    let e = job.training.precision.element_bytes();
    let Tokens {
        tokens,
        sequence_split,
    } = Tokens::of(job);
    let h = shape.hidden;
    let t = layout.tensor;
    let first = rank == 0;
    let last = rank + 1 == layout.pipeline;
    let embedding = if first {
        let chunk0 = held.per_chunk.first().copied().unwrap_or(0);
        let mask = match job.training.dropout.hidden {
            DropoutUse::Applied => tokens * h / sequence_split,
            DropoutUse::Skipped => 0,
        };
        chunk0 * (mask + 8 * tokens)
    } else {
        0
    };
    let logits_fp32 = 4 * tokens * padded_vocab / t;
    let logits_16 = e * tokens * padded_vocab / t;
    let output = if last {
        let last_chunk = held.per_chunk.last().copied().unwrap_or(0);
        last_chunk * (2 * e * tokens * h / sequence_split + logits_fp32)
    } else {
        0
    };
    let weight_gradient = match job.training.gradient_fusion {
        GradientAccumulationFusion::Unfused => e * params.largest_weight,
        GradientAccumulationFusion::Fused => 0,
    };
    let layer_backward = layer.backward_working + recompute_extra;
    let mut temporaries = vec![
        (Temporary::LayerBackward, layer_backward),
        (Temporary::WeightGradient, weight_gradient),
    ];
    if last {
        temporaries.push((Temporary::Logits, logits_16));
    }
    let (temporary, temporary_bytes) = temporaries
        .into_iter()
        .max_by_key(|&(_, bytes)| bytes)
        .unwrap_or((Temporary::LayerBackward, 0));
    let retained_inputs = retained_pipeline_inputs(job, rank);
    let persistent = states.persistent();
    let activation_peak = persistent
        + states.backward_gradients
        + states.gathered
        + layer_bytes
        + embedding
        + output
        + temporary_bytes;
    let step_peak =
        persistent + states.backward_gradients + states.step_temporaries + retained_inputs;
    let (peak_moment, peak_bytes) = if step_peak > activation_peak {
        (PeakMoment::Step, step_peak)
    } else {
        (PeakMoment::Activations, activation_peak)
    };
    let at_activations = peak_moment == PeakMoment::Activations;
    let only_at = |bytes: u64, moment: bool| if moment { bytes } else { 0 };
    let terms = vec![
        TermBytes {
            term: Term::Parameters,
            peak_bytes: states.parameters,
            after_step_bytes: states.parameters,
        },
        TermBytes {
            term: Term::Gradients,
            peak_bytes: states.persistent_gradients,
            after_step_bytes: states.persistent_gradients,
        },
        TermBytes {
            term: Term::MasterParameters,
            peak_bytes: states.master,
            after_step_bytes: states.master,
        },
        TermBytes {
            term: Term::OptimizerStates,
            peak_bytes: states.optimizer,
            after_step_bytes: states.optimizer,
        },
        TermBytes {
            term: Term::BackwardGradients,
            peak_bytes: states.backward_gradients,
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::GatheredParameters,
            peak_bytes: only_at(states.gathered, at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::LayerActivations,
            peak_bytes: only_at(layer_bytes, at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::EmbeddingActivations,
            peak_bytes: only_at(embedding, at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::OutputActivations,
            peak_bytes: only_at(output, at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::PeakTemporary,
            peak_bytes: only_at(temporary_bytes, at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::StepTemporaries,
            peak_bytes: only_at(states.step_temporaries, !at_activations),
            after_step_bytes: 0,
        },
        TermBytes {
            term: Term::RetainedPipelineInputs,
            peak_bytes: only_at(retained_inputs, !at_activations),
            after_step_bytes: retained_inputs,
        },
    ];
    let dynamic = peak_bytes - persistent;
    let fragmentation = (dynamic as f64 * margins.fragmentation).ceil() as u64;
    StageEstimate {
        stage: rank,
        layers: layer_ranges(layout, shape.layers, rank),
        params: params.total(),
        in_flight: held,
        peak_bytes,
        after_step_bytes: persistent + retained_inputs,
        reserved_bytes: peak_bytes + fragmentation + margins.cuda_context_bytes,
        peak_moment,
        temporary,
        terms,
    }
}

/// Estimates every stage of `job` (checked beforehand with [`super::checks::check`]).
pub fn estimate(job: &Job, margins: &Margins) -> Result<FullParallelEstimate, ParallelError> {
    let padded_vocab = job
        .shape
        .padded_vocab(job.layout.tensor, &job.names.vocab_padding)?;
    let pipeline_stages: Vec<StageEstimate> = (0..job.layout.pipeline)
        .map(|rank| estimate_stage(job, padded_vocab, margins, rank))
        .collect();
    let peak_stage = pipeline_stages
        .iter()
        .max_by_key(|stage| stage.reserved_bytes)
        .map_or(0, |stage| stage.stage);
    Ok(FullParallelEstimate {
        padded_vocab,
        micro_batches: job.micro_batches(),
        pipeline_stages,
        peak_stage,
    })
}
