//! [`Cluster`]: the ranks a plan runs on, and [`Hardware`]: the rates the cost model divides by.
//!
//! Every rate is a documented assumption, not a measurement; `dsplan plan` prints them with
//! the predicted step time so a reader can judge it. The defaults describe an 8-GPU H100 SXM
//! node (HGX H100) on a 400 Gb/s-per-GPU InfiniBand fabric:
//!
//! | rate | default | source of the number |
//! |---|---|---|
//! | 16-bit tensor-core peak | 989 TFLOP/s | H100 SXM dense BF16/FP16 datasheet figure |
//! | fp32 peak | 495 TFLOP/s | H100 SXM dense TF32 datasheet figure (PyTorch's TF32 matmuls) |
//! | compute efficiency | 0.5 | fraction of peak a transformer's matmuls reach (typical MFU) |
//! | GPU memory bandwidth | 3.35 TB/s | H100 SXM HBM3 datasheet figure |
//! | intra-node bus bandwidth | 360 GB/s | NVLink 4 (450 GB/s per direction) at 80% NCCL efficiency |
//! | inter-node bus bandwidth | 40 GB/s | 400 Gb/s NDR per GPU (50 GB/s) at 80% |
//! | host↔device | 25 GB/s | PCIe Gen5 x16 (64 GB/s) shared by two GPUs per switch, pinned |
//! | NVMe per node | 12 GB/s | four Gen4 drives striped, shared by the node's GPUs |
//! | CPU Adam per node | 2×10⁹ elements/s | DeepSpeedCPUAdam (AVX-512) on a two-socket host |
//! | collective latency | 20 µs | one NCCL ring step across nodes |

use serde::Serialize;

/// The ranks: how many, and how they sit on nodes. Ranks fill nodes in order (rank r is on
/// node r / gpus_per_node), as DeepSpeed's launcher assigns them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cluster {
    /// Data-parallel world size N.
    pub world_size: u64,
    /// GPUs (ranks) per node.
    pub gpus_per_node: u64,
    /// The rates of the cost model.
    pub hardware: Hardware,
}

impl Cluster {
    /// `world_size` ranks, `gpus_per_node` per node, default [`Hardware`]. Both must be ≥ 1.
    pub fn new(world_size: u64, gpus_per_node: u64) -> Result<Cluster, String> {
        if world_size == 0 {
            return Err("the world size must be at least 1".into());
        }
        if gpus_per_node == 0 {
            return Err("GPUs per node must be at least 1".into());
        }
        Ok(Cluster {
            world_size,
            gpus_per_node: gpus_per_node.min(world_size),
            hardware: Hardware::default(),
        })
    }

    /// Number of nodes (the last one may be partly used).
    pub fn nodes(&self) -> u64 {
        self.world_size.div_ceil(self.gpus_per_node)
    }

    /// Whether every rank shares one node (collectives stay on NVLink).
    pub fn single_node(&self) -> bool {
        self.nodes() == 1
    }

    /// Bus bandwidth of a collective over all ranks: NVLink within a node, the network
    /// otherwise (the slowest link bounds a ring).
    pub fn collective_bandwidth(&self) -> f64 {
        if self.single_node() {
            self.hardware.intra_node_bandwidth
        } else {
            self.hardware.inter_node_bandwidth
        }
    }
}

/// The rates the cost model divides by (see the module table for the defaults' sources).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Hardware {
    /// A name for display.
    pub name: &'static str,
    /// Peak dense 16-bit matmul rate of one GPU, FLOP/s.
    pub peak_flops_16bit: f64,
    /// Peak dense fp32 (TF32) matmul rate of one GPU, FLOP/s.
    pub peak_flops_fp32: f64,
    /// Fraction of peak the model's matmuls reach.
    pub compute_efficiency: f64,
    /// GPU memory bandwidth, bytes/s (memory-bound kernels: the GPU optimizer step).
    pub memory_bandwidth: f64,
    /// GPU memory capacity, bytes (for the "fits" verdict).
    pub memory_capacity: u64,
    /// NCCL bus bandwidth between GPUs of one node, bytes/s.
    pub intra_node_bandwidth: f64,
    /// NCCL bus bandwidth between nodes, per GPU, bytes/s.
    pub inter_node_bandwidth: f64,
    /// Host↔device copy bandwidth per GPU (pinned memory), bytes/s.
    pub host_device_bandwidth: f64,
    /// NVMe read/write bandwidth of one node, bytes/s (shared by its GPUs).
    pub nvme_bandwidth_per_node: f64,
    /// DeepSpeedCPUAdam throughput of one node, parameter elements/s (shared by its GPUs).
    pub cpu_adam_per_node: f64,
    /// Fixed cost of one collective, seconds.
    pub collective_latency: f64,
}

impl Default for Hardware {
    fn default() -> Self {
        Hardware {
            name: "H100 SXM 80GB, NVLink 4, 400 Gb/s IB per GPU",
            peak_flops_16bit: 989e12,
            peak_flops_fp32: 495e12,
            compute_efficiency: 0.5,
            memory_bandwidth: 3.35e12,
            memory_capacity: 80 * (1 << 30),
            intra_node_bandwidth: 360e9,
            inter_node_bandwidth: 40e9,
            host_device_bandwidth: 25e9,
            nvme_bandwidth_per_node: 12e9,
            cpu_adam_per_node: 2e9,
            collective_latency: 20e-6,
        }
    }
}
