//! `recommend`'s analytic layout search: every tensor, pipeline, virtual-pipeline, sequence
//! and data split of the GPUs, with every ZeRO stage, micro-batch and recomputation, costed by
//! [`super::stages`] (memory of every pipeline stage) and [`super::time`] (step time); the
//! fastest layout whose busiest stage fits wins.
//!
//! The space: `t` a divisor of the GPUs of a node; `p` a divisor of the layers; `v` (chunks
//! per pipeline rank) a divisor of the layers per stage up to 8; Megatron's SP when `t > 1`,
//! Ulysses over `u` GPUs of the node; ZeRO 0-3 within DeepSpeed's rules (ZeRO 0-1 with a
//! pipeline, 0-2 with tensor parallelism); micro-batches dividing the per-replica batch (up to
//! 64); no, selective or full recomputation. Combinations Megatron-LM or DeepSpeed refuse are
//! skipped (they never count as examined).

use serde::Serialize;

use super::checks::check;
use super::error::FlagNames;
use super::layout::{
    Batch, Dropout, GradientAccumulationFusion, Job, Layout, PipelineSchedule, Recompute,
    RecomputeMethod, Runtime, SequenceParallel, Training,
};
use super::shape::TransformerShape;
use super::stages::estimate_stage;
use super::time::{StepTime, step_time};
use crate::config::ZeroStage;
use crate::estimate::full::Margins;
use crate::memory::{AttentionKernel, Precision};
use crate::recommend::CostModel;

/// What to search for.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchRequest {
    /// The model.
    pub shape: TransformerShape,
    /// GPUs in all.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Bytes of one GPU.
    pub gpu_memory: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per step.
    pub global_batch: u64,
    /// Training precision.
    pub precision: Precision,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Dropouts.
    pub dropout: Dropout,
    /// Step-time constants.
    pub cost: CostModel,
    /// Memory margins.
    pub margins: Margins,
}

/// One costed layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Evaluated {
    /// The job.
    pub job: Job,
    /// Reserved bytes of each pipeline stage's peak.
    pub stage_reserved_bytes: Vec<u64>,
    /// Allocated bytes of each pipeline stage's peak.
    pub stage_peak_bytes: Vec<u64>,
    /// The busiest stage's reserved bytes.
    pub reserved_bytes: u64,
    /// The predicted step.
    pub step: StepTime,
    /// Tokens per second of the whole job.
    pub tokens_per_second: f64,
}

/// The search's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SearchOutcome {
    /// Layouts costed (valid combinations).
    pub examined: u64,
    /// Of those, the ones that fit.
    pub fitting: u64,
    /// The fastest that fits.
    pub best: Option<Evaluated>,
    /// The next fastest fitting layouts, fastest first (up to 5).
    pub runners_up: Vec<Evaluated>,
    /// When nothing fits: the layout needing the least memory.
    pub closest: Option<Evaluated>,
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n).filter(|d| n.is_multiple_of(*d)).collect()
}

/// Costs one job (already checked): every stage's memory and the step.
pub fn evaluate(job: Job, padded_vocab: u64, request: &SearchRequest) -> Evaluated {
    let stages: Vec<_> = (0..job.layout.pipeline)
        .map(|rank| estimate_stage(&job, padded_vocab, &request.margins, rank))
        .collect();
    let stage_reserved_bytes: Vec<u64> = stages.iter().map(|s| s.reserved_bytes).collect();
    let stage_peak_bytes: Vec<u64> = stages.iter().map(|s| s.peak_bytes).collect();
    let reserved_bytes = stage_reserved_bytes.iter().copied().max().unwrap_or(0);
    let step = step_time(&job, &request.cost, request.gpus_per_node, padded_vocab);
    let tokens_per_second = (job.batch.global_batch * job.batch.seq_len) as f64 / step.total;
    Evaluated {
        job,
        stage_reserved_bytes,
        stage_peak_bytes,
        reserved_bytes,
        step,
        tokens_per_second,
    }
}

/// Every candidate job of the space (checked), in a fixed order.
pub fn candidates(request: &SearchRequest) -> Vec<Job> {
    let shape = &request.shape;
    let gpus = request.gpus;
    let mut jobs = Vec::new();
    let base_names = FlagNames::dsplan();
    for t in divisors(request.gpus_per_node.min(gpus)) {
        if !shape.heads.is_multiple_of(t) || !shape.ffn_hidden.is_multiple_of(t) {
            continue;
        }
        let mut sequences = vec![SequenceParallel::Off];
        if t > 1 {
            sequences.push(SequenceParallel::Megatron);
        }
        for u in divisors(shape.heads / t) {
            if u > 1 && t * u <= request.gpus_per_node && request.seq_len.is_multiple_of(u) {
                sequences.push(SequenceParallel::Ulysses { degree: u });
            }
        }
        for p in divisors(shape.layers) {
            for &sequence in &sequences {
                let model = t * p * sequence.ulysses_degree();
                if !gpus.is_multiple_of(model) {
                    continue;
                }
                let d = gpus / model;
                if !request.global_batch.is_multiple_of(d) {
                    continue;
                }
                let per_replica = request.global_batch / d;
                let mut schedules = vec![PipelineSchedule::OneForwardOneBackward];
                if p > 1 {
                    for v in divisors(shape.layers / p) {
                        if (2..=8).contains(&v) {
                            schedules.push(PipelineSchedule::Interleaved { virtual_stages: v });
                        }
                    }
                }
                let stages: &[ZeroStage] = match (p > 1, t > 1) {
                    (true, _) => &[ZeroStage::Disabled, ZeroStage::OptimizerStates],
                    (false, true) => &[
                        ZeroStage::Disabled,
                        ZeroStage::OptimizerStates,
                        ZeroStage::Gradients,
                    ],
                    (false, false) => &[
                        ZeroStage::Disabled,
                        ZeroStage::OptimizerStates,
                        ZeroStage::Gradients,
                        ZeroStage::Weights,
                    ],
                };
                for micro_batch in divisors(per_replica).into_iter().filter(|&b| b <= 64) {
                    for &schedule in &schedules {
                        for &zero in stages {
                            for recompute in [
                                Recompute::None,
                                Recompute::Selective,
                                Recompute::Full {
                                    method: RecomputeMethod::Uniform,
                                    layers: 1,
                                },
                            ] {
                                let job = Job {
                                    shape: *shape,
                                    layout: Layout {
                                        tensor: t,
                                        pipeline: p,
                                        schedule,
                                        sequence,
                                        data: d,
                                    },
                                    batch: Batch {
                                        seq_len: request.seq_len,
                                        micro_batch,
                                        global_batch: request.global_batch,
                                    },
                                    training: Training {
                                        precision: request.precision,
                                        runtime: Runtime::DeepSpeed {
                                            zero,
                                            reduce_bucket: 500_000_000,
                                        },
                                        recompute,
                                        attention: request.attention,
                                        dropout: request.dropout,
                                        gradient_fusion: GradientAccumulationFusion::Fused,
                                    },
                                    names: base_names.clone(),
                                };
                                if check(&job).is_ok() {
                                    jobs.push(job);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    jobs
}

/// Searches the space.
pub fn search(request: &SearchRequest) -> SearchOutcome {
    let mut examined = 0;
    let mut fitting: Vec<Evaluated> = Vec::new();
    let mut closest: Option<Evaluated> = None;
    for job in candidates(request) {
        let Ok(padded) = job.shape.padded_vocab(job.layout.tensor, "--model") else {
            continue;
        };
        examined += 1;
        let evaluated = evaluate(job, padded, request);
        if evaluated.reserved_bytes <= request.gpu_memory {
            fitting.push(evaluated);
        } else if closest
            .as_ref()
            .is_none_or(|c| evaluated.reserved_bytes < c.reserved_bytes)
        {
            closest = Some(evaluated);
        }
    }
    let count = fitting.len() as u64;
    fitting.sort_by(|a, b| {
        a.step
            .total
            .total_cmp(&b.step.total)
            .then(a.reserved_bytes.cmp(&b.reserved_bytes))
    });
    let mut fitting = fitting.into_iter();
    let best = fitting.next();
    let runners_up: Vec<Evaluated> = fitting.take(5).collect();
    SearchOutcome {
        examined,
        fitting: count,
        closest: if best.is_none() { closest } else { None },
        best,
        runners_up,
    }
}
