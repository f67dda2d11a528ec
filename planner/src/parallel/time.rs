//! Predicted step time of a 3D-parallel job: compute over the pipeline with its bubble, plus
//! the communication that does not hide behind it.
//!
//! | part | model |
//! |---|---|
//! | compute | FLOPs of each stage (`2·T·weights` per matmul pass, `4·b·s²·q` for attention, the output layer on the last stage; backward twice forward; full recompute one forward more, selective the attention again) over `t·u` GPUs at `peak × efficiency`; the slowest stage sets the pace, `m + (p-1)/v` times per step |
//! | tensor parallel | 4 all-reduces of `e·T·h` per layer and micro-batch (6 with full recompute; SP's all-gather + reduce-scatter move the same bytes), `2(t-1)/t` of them over NVLink while `t` fits a node, not overlapped |
//! | Ulysses | 8 all-to-alls of Q, K, V and the output per layer and micro-batch, `(u-1)/u` of them |
//! | pipeline | sending activations and gradients through `p - 1` boundaries while the pipeline fills and drains |
//! | data parallel | reducing the stage's gradients (fp32 under Megatron-LM, 16-bit under DeepSpeed) and gathering updated 16-bit weights, overlapped with the last micro-batch's backward; ZeRO-3 gathers weights every micro-batch |
//! | optimizer | reading and writing the master weights, moments and gradients at HBM bandwidth |
//!
//! The constants are `recommend`'s ([`crate::recommend::CostModel`]); the GPUs of one node
//! hold the innermost groups (tensor, then sequence, then data, then pipeline), Megatron's
//! `tp-cp-ep-dp-pp` order.

use serde::Serialize;

use super::layout::{Job, Recompute, Runtime};
use super::params::stage_params;
use crate::config::ZeroStage;
use crate::recommend::CostModel;

/// A predicted step, seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTime {
    /// Compute of the slowest stage, all micro-batches, bubble excluded.
    pub compute: f64,
    /// The pipeline bubble.
    pub bubble: f64,
    /// Tensor-parallel collectives.
    pub tensor_communication: f64,
    /// Ulysses all-to-alls.
    pub sequence_communication: f64,
    /// Pipeline sends.
    pub pipeline_communication: f64,
    /// Data-parallel gradient and weight traffic that is not hidden.
    pub data_communication: f64,
    /// The optimizer step.
    pub optimizer: f64,
    /// The sum.
    pub total: f64,
}

/// FLOPs of one layer's forward for one micro-batch (whole model width, before any split).
fn layer_forward_flops(job: &Job) -> (f64, f64) {
    let shape = &job.shape;
    let tokens = (job.batch.seq_len * job.batch.micro_batch) as f64;
    let h = shape.hidden as f64;
    let q = shape.query_width() as f64;
    let kv = shape.kv_width() as f64;
    let f = shape.ffn_hidden as f64;
    let gate = shape.mlp.fc1_width_factor() as f64;
    let weights = h * (q + 2.0 * kv) + q * h + h * f * gate + f * h;
    let attention = 4.0 * job.batch.micro_batch as f64 * (job.batch.seq_len as f64).powi(2) * q;
    (2.0 * tokens * weights, attention)
}

/// The bandwidth of a group of `span` consecutive GPUs.
fn bandwidth(cost: &CostModel, span: u64, gpus_per_node: u64) -> f64 {
    if span <= gpus_per_node {
        cost.intra_node_bandwidth
    } else {
        cost.inter_node_bandwidth
    }
}

/// Predicts one step of `job` on nodes of `gpus_per_node` GPUs.
pub fn step_time(job: &Job, cost: &CostModel, gpus_per_node: u64, padded_vocab: u64) -> StepTime {
    let layout = &job.layout;
    let t = layout.tensor;
    let u = layout.sequence.ulysses_degree();
    let p = layout.pipeline;
    let d = layout.data;
    let m = job.micro_batches() as f64;
    let chunks = layout.schedule.chunks() as f64;
    let rate = cost.peak_flops * cost.compute_efficiency * (t * u) as f64;
    let (weights, attention) = layer_forward_flops(job);
    let extra_forward = match job.training.recompute {
        Recompute::None => 0.0,
        Recompute::Selective => attention,
        Recompute::Full { .. } => weights + attention,
    };
    let layer = 3.0 * (weights + attention) + extra_forward;
    let layers = (job.shape.layers / p) as f64;
    let tokens = (job.batch.seq_len * job.batch.micro_batch) as f64;
    let logits = 3.0 * 2.0 * tokens * job.shape.hidden as f64 * padded_vocab as f64;
    // The last stage is the slowest: its layers and the output layer.
    let per_micro_batch = (layers * layer + logits) / rate;
    let compute = m * per_micro_batch;
    let bubble = (p as f64 - 1.0) / chunks * per_micro_batch;

    let e = job.training.precision.element_bytes() as f64;
    let h = job.shape.hidden as f64;
    let collectives = match job.training.recompute {
        Recompute::Full { .. } => 6.0,
        _ => 4.0,
    };
    let tensor_communication = if t > 1 {
        let bytes = e * tokens / u as f64 * h;
        m * layers * collectives * 2.0 * (t - 1) as f64 / t as f64 * bytes
            / bandwidth(cost, t, gpus_per_node)
    } else {
        0.0
    };
    let sequence_communication = if u > 1 {
        let q = job.shape.query_width() as f64;
        let kv = job.shape.kv_width() as f64;
        let bytes = e * tokens / u as f64 * (2.0 * q + 2.0 * kv) / t as f64;
        m * layers * 2.0 * (u - 1) as f64 / u as f64 * bytes / bandwidth(cost, t * u, gpus_per_node)
    } else {
        0.0
    };
    let pipeline_communication = if p > 1 {
        let split = match layout.sequence {
            super::layout::SequenceParallel::Megatron => t,
            _ => 1,
        } * u;
        let bytes = e * tokens * h / split as f64;
        2.0 * (p - 1) as f64 * chunks * bytes / bandwidth(cost, t * u * d * p, gpus_per_node)
    } else {
        0.0
    };
    let params = (0..p)
        .map(|rank| stage_params(&job.shape, layout, padded_vocab, rank).total())
        .max()
        .unwrap_or(0) as f64;
    let shards = layout.sharding_degree();
    let dp_bandwidth = bandwidth(cost, t * u * d, gpus_per_node);
    let ring = if shards > 1 {
        (shards - 1) as f64 / shards as f64
    } else {
        0.0
    };
    let (gradient_bytes, gathers_per_micro_batch) = match job.training.runtime {
        Runtime::MegatronLm { .. } => (4.0, 0.0),
        Runtime::DeepSpeed {
            zero: ZeroStage::Weights,
            ..
        } => (e, 2.0),
        Runtime::DeepSpeed { .. } => (e, 0.0),
    };
    let synchronise = params * (gradient_bytes + e) * ring / dp_bandwidth;
    let per_step_gathers = m * gathers_per_micro_batch * params * e * ring / dp_bandwidth;
    let hidden_behind = per_micro_batch * 2.0 / 3.0;
    let data_communication =
        (synchronise - hidden_behind).max(0.0) + (per_step_gathers - compute).max(0.0);
    let optimizer_bytes = match job.training.runtime {
        Runtime::MegatronLm {
            optimizer: super::layout::OptimizerSharding::Replicated,
        } => params * 2.0 * 16.0,
        Runtime::DeepSpeed {
            zero: ZeroStage::Disabled,
            ..
        } => params * 2.0 * 16.0,
        _ => params * 2.0 * 16.0 / shards as f64,
    };
    let optimizer = optimizer_bytes / cost.hbm_bandwidth;
    let total = compute
        + bubble
        + tensor_communication
        + sequence_communication
        + pipeline_communication
        + data_communication
        + optimizer;
    StepTime {
        compute,
        bubble,
        tensor_communication,
        sequence_communication,
        pipeline_communication,
        data_communication,
        optimizer,
        total,
    }
}
