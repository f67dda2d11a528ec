//! The cost model: how long each op of the step takes, from the rates in
//! [`super::cluster::Hardware`].
//!
//! - **Compute**: FLOPs / (peak × efficiency), the peak of the model dtype (16-bit tensor cores
//!   or TF32). A module's forward does 2 FLOPs per weight element per token, plus
//!   4 × sequence × attention width per token for the attention core before the output
//!   projection; backward does twice the forward; full checkpointing adds one forward of every
//!   block unit, selective recomputation the attention core again.
//!   Norms and embeddings are counted as free (memory-bound, small).
//! - **Collectives**: latency + ring factor × bytes / bus bandwidth, where the ring factor is
//!   2(N−1)/N for all-reduce and (N−1)/N for reduce-scatter, reduce and all-gather, and the
//!   bandwidth is NVLink within one node and the network beyond.
//! - **Copies**: bytes / host↔device bandwidth; NVMe: bytes / (node NVMe bandwidth / GPUs per
//!   node).
//! - **Optimizer step**: on the GPU, memory-bound: every element reads and writes its master,
//!   fp32 gradient and states; on the host, elements / (node CPU-Adam rate / GPUs per node).

use super::buckets::Collective;
use super::cluster::Cluster;
use super::dtype::Dtype;
use super::model_graph::{FetchUnit, UnitKind};
use super::settings::{Checkpointing, Settings};

/// Seconds and work of an op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Duration in seconds.
    pub seconds: f64,
    /// FLOPs (compute ops).
    pub flops: f64,
}

/// Forward FLOPs of one unit for one micro-step.
pub fn forward_flops(unit: &FetchUnit, settings: &Settings, attention_width: u64) -> f64 {
    let tokens = settings.tokens_per_micro_step() as f64;
    let matmul = 2.0 * unit.matmul_params as f64 * tokens;
    let attention = if unit.kind == UnitKind::AttentionOutput {
        4.0 * settings.batch.sequence_length as f64 * attention_width as f64 * tokens
    } else {
        0.0
    };
    matmul + attention
}

/// Backward FLOPs (with the recomputation that checkpointing adds).
pub fn backward_flops(unit: &FetchUnit, settings: &Settings, attention_width: u64) -> f64 {
    let forward = forward_flops(unit, settings, attention_width);
    let recompute = match (settings.checkpointing, unit.layer) {
        (Checkpointing::Full, Some(_)) => forward,
        (Checkpointing::Selective, Some(_)) if unit.kind == UnitKind::AttentionOutput => {
            4.0 * settings.batch.sequence_length as f64
                * attention_width as f64
                * settings.tokens_per_micro_step() as f64
        }
        _ => 0.0,
    };
    2.0 * forward + recompute
}

/// A compute op of `flops` in `dtype`.
pub fn compute(cluster: &Cluster, dtype: Dtype, flops: f64) -> Cost {
    let hw = &cluster.hardware;
    let peak = match dtype {
        Dtype::Fp32 | Dtype::Fp64 | Dtype::Int64 | Dtype::Int32 | Dtype::Uint32 => {
            hw.peak_flops_fp32
        }
        Dtype::Fp16 | Dtype::Bf16 | Dtype::Uint8 => hw.peak_flops_16bit,
    };
    Cost {
        seconds: flops / (peak * hw.compute_efficiency),
        flops,
    }
}

/// A collective over every rank moving a buffer of `bytes`.
pub fn collective(cluster: &Cluster, collective: Collective, bytes: u64) -> Cost {
    let factor = collective.ring_factor(cluster.world_size);
    let seconds = if factor == 0.0 {
        0.0
    } else {
        cluster.hardware.collective_latency + factor * bytes as f64 / cluster.collective_bandwidth()
    };
    Cost {
        seconds,
        flops: 0.0,
    }
}

/// A host↔device copy.
pub fn host_copy(cluster: &Cluster, bytes: u64) -> Cost {
    Cost {
        seconds: bytes as f64 / cluster.hardware.host_device_bandwidth,
        flops: 0.0,
    }
}

/// An NVMe read or write.
pub fn nvme(cluster: &Cluster, bytes: u64) -> Cost {
    let per_rank = cluster.hardware.nvme_bandwidth_per_node / cluster.gpus_per_node as f64;
    Cost {
        seconds: bytes as f64 / per_rank,
        flops: 0.0,
    }
}

/// The optimizer step over `elements` on the GPU.
pub fn gpu_optimizer(cluster: &Cluster, settings: &Settings, elements: u64) -> Cost {
    let touched = settings.dtypes.master.bytes()
        + 4
        + settings.optimizer.states * settings.dtypes.optimizer_states.bytes()
        + settings.dtypes.params.bytes();
    Cost {
        seconds: (2 * touched * elements) as f64 / cluster.hardware.memory_bandwidth,
        flops: 0.0,
    }
}

/// The optimizer step over `elements` on the host (DeepSpeedCPUAdam).
pub fn cpu_optimizer(cluster: &Cluster, elements: u64) -> Cost {
    let per_rank = cluster.hardware.cpu_adam_per_node / cluster.gpus_per_node as f64;
    Cost {
        seconds: elements as f64 / per_rank,
        flops: 0.0,
    }
}
