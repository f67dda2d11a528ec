//! The step-time cost model: simple, documented, and only as good as its constants.
//!
//! A step is `gradient_accumulation_steps` micro-steps and one optimizer step. Per GPU:
//!
//! - **Compute**: `flops / (peak × efficiency)`, with `flops = tokens × (2·P_mm + 4·L·s·q) ×
//!   (3 + recompute)` — forward `2·P_mm` per token for the matrix multiplies plus `4·L·s·q` for
//!   the attention scores and their use (L layers, sequence s, attention width q), backward twice
//!   that (Transformer Math 101's `6·P·D`, research/peers.md §4.2), and one more forward under
//!   full checkpointing (the attention part only under selective recomputation).
//! - **Collectives** (ring algorithms, `(N−1)/N` of the data crosses each rank's link; NVLink
//!   inside a node, the network across nodes), volumes from deepspeed-facts §4.8 with
//!   `V = e·P`: ZeRO-1 all-reduces the gradients once per step (`2V`), ZeRO-2 once per
//!   micro-step; both then all-gather the updated parameters (`V`, exposed). ZeRO-3 moves `3V`
//!   per micro-step (parameters gathered for forward and for backward, gradients
//!   reduce-scattered). Reductions hide behind the backward pass and ZeRO-3's gathers behind the
//!   whole micro-step (prefetch, `overlap_comm`); only what exceeds that window is added.
//! - **Offload traffic** over the host link of each GPU: per offloaded element, the 16-bit
//!   gradient accumulation round trip of every micro-step after the first and the fp32
//!   gradients at the boundary (deepspeed-facts §4.5-4.6) run on their own stream during
//!   backward and hide behind it like the reductions; the updated 16-bit parameters going back
//!   up after the step are exposed. ZeRO-3 parameter offload adds two 16-bit fetches per
//!   micro-step, prefetched like the gathers. NVMe moves master, states and fp32 gradients in
//!   and out once per step, shared by a node, exposed.
//! - **Optimizer**: on the GPU `32 bytes` of HBM traffic per element; on the CPU a node's ranks
//!   share the measured DeepSpeedCPUAdam rate.
//!
//! | constant | default | source |
//! |---|---|---|
//! | [`CostModel::peak_flops`] | 989.4 TFLOP/s | NVIDIA H100 SXM5 datasheet, dense BF16/FP16 tensor-core peak |
//! | [`CostModel::compute_efficiency`] | 0.40 | ZeRO-Infinity sustained 40 % of peak on 512 V100s (peers.md §4.7) |
//! | [`CostModel::intra_node_bandwidth`] | 450 GB/s | NVLink 4 on H100 SXM5: 900 GB/s total, 450 GB/s each way (datasheet) |
//! | [`CostModel::inter_node_bandwidth`] | 50 GB/s | one 400 Gb/s NDR InfiniBand adapter per GPU (DGX H100 datasheet) |
//! | [`CostModel::host_link_bandwidth`] | 32 GB/s | PCIe 4.0 x16, one direction (PCI-SIG: 16 GT/s x 16 lanes) |
//! | [`CostModel::hbm_bandwidth`] | 3.35 TB/s | H100 SXM5 datasheet |
//! | [`CostModel::cpu_adam_rate`] | 1.344 G params/s per node | DeepSpeedCPUAdam + bf16 copy-back, 2 threads, measured here (research/cpu-anchors.md §3); scale it to a server's memory bandwidth |
//! | [`CostModel::nvme_bandwidth`] | 28 GB/s per node | ZeRO-Infinity, NVMe to GPU on one DGX-2 node (peers.md §4.7) |
//! | [`CostModel::tie_tolerance`] | 5 % | dsplan's choice: predictions closer than this are a tie, and the simpler (earlier) strategy wins; the model ignores ZeRO-3's per-module fetch overheads, which favour the simpler stages |

use serde::Serialize;

use crate::config::{OffloadDevice, ZeroStage};
use crate::estimate::full::states::optimizer_split;
use crate::estimate::full::{Checkpointing, Context};

/// The constants of the cost model (bytes per second, FLOP per second, parameters per second).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostModel {
    /// Peak tensor-core throughput of one GPU in the training precision, FLOP/s.
    pub peak_flops: f64,
    /// Fraction of the peak the model's matrix multiplies sustain.
    pub compute_efficiency: f64,
    /// Achievable collective bandwidth per GPU inside a node, bytes/s.
    pub intra_node_bandwidth: f64,
    /// Achievable collective bandwidth per GPU across nodes, bytes/s.
    pub inter_node_bandwidth: f64,
    /// Host-to-GPU bandwidth of one GPU, each direction, bytes/s.
    pub host_link_bandwidth: f64,
    /// GPU memory bandwidth, bytes/s.
    pub hbm_bandwidth: f64,
    /// CPU Adam throughput of one node, parameters/s.
    pub cpu_adam_rate: f64,
    /// NVMe bandwidth of one node, bytes/s.
    pub nvme_bandwidth: f64,
    /// Relative difference below which two predicted step times are a tie.
    pub tie_tolerance: f64,
}

impl Default for CostModel {
    fn default() -> CostModel {
        CostModel {
            peak_flops: 989.4e12,
            compute_efficiency: 0.40,
            intra_node_bandwidth: 450e9,
            inter_node_bandwidth: 50e9,
            host_link_bandwidth: 32e9,
            hbm_bandwidth: 3.35e12,
            cpu_adam_rate: 1.344e9,
            nvme_bandwidth: 28e9,
            tie_tolerance: 0.05,
        }
    }
}

/// A constant that makes no sense (zero, negative, not finite, or an efficiency above 1).
#[derive(Debug, Clone, PartialEq)]
pub struct BadConstant {
    /// Which constant.
    pub name: &'static str,
    /// Its value.
    pub value: f64,
}

impl std::fmt::Display for BadConstant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the cost-model constant `{}` must be {}, not {}",
            self.name,
            match self.name {
                "compute_efficiency" => "a positive number at most 1",
                "tie_tolerance" => "a fraction from 0 to 1 (0.05: 5 %)",
                _ => "a positive number",
            },
            self.value
        )
    }
}

impl std::error::Error for BadConstant {}

impl CostModel {
    /// Checks every constant.
    pub fn check(&self) -> Result<(), BadConstant> {
        let constants = [
            ("peak_flops", self.peak_flops),
            ("compute_efficiency", self.compute_efficiency),
            ("intra_node_bandwidth", self.intra_node_bandwidth),
            ("inter_node_bandwidth", self.inter_node_bandwidth),
            ("host_link_bandwidth", self.host_link_bandwidth),
            ("hbm_bandwidth", self.hbm_bandwidth),
            ("cpu_adam_rate", self.cpu_adam_rate),
            ("nvme_bandwidth", self.nvme_bandwidth),
        ];
        for (name, value) in constants {
            let bad = !(value.is_finite() && value > 0.0)
                || (name == "compute_efficiency" && value > 1.0);
            if bad {
                return Err(BadConstant { name, value });
            }
        }
        // A tie wider than 100 % makes every candidate tie (and 1e308 printed as `inf %`).
        if !(self.tie_tolerance.is_finite() && (0.0..=1.0).contains(&self.tie_tolerance)) {
            return Err(BadConstant {
                name: "tie_tolerance",
                value: self.tie_tolerance,
            });
        }
        Ok(())
    }
}

/// A predicted step, in seconds, by component.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTime {
    /// Forward, backward and recomputation of every micro-step.
    pub compute: f64,
    /// Collective time not hidden behind compute.
    pub communication: f64,
    /// Host-GPU and NVMe traffic of offloading not hidden behind compute.
    pub offload: f64,
    /// The optimizer step (GPU and CPU parts).
    pub optimizer: f64,
    /// The sum.
    pub total: f64,
}

/// The predicted step time of the configuration `ctx` describes.
pub fn step_time(ctx: &Context<'_>, cost: &CostModel) -> StepTime {
    let setup = ctx.setup;
    let shape = ctx.shape;
    let dims = &ctx.model.layers;
    let gas = setup.gradient_accumulation_steps.max(1) as f64;
    let world = ctx.world() as f64;
    let ranks_per_node = ctx.ranks_per_node() as f64;
    let e = setup.precision.element_bytes() as f64;
    let params = ctx.params() as f64;
    let partition = ctx.partition() as f64;

    // Compute.
    let s = shape.seq_len as f64;
    let layers = (dims.self_attention_layers + dims.cross_attention_layers) as f64;
    let dense = 2.0 * ctx.model.matmul_params as f64;
    let attention = 4.0 * layers * s * dims.attention_width as f64;
    let per_token = match shape.checkpointing {
        Checkpointing::None => 3.0 * (dense + attention),
        Checkpointing::Selective => 3.0 * (dense + attention) + attention,
        Checkpointing::Full => 4.0 * (dense + attention),
    };
    let tokens = s * shape.micro_batch as f64;
    let micro = tokens * per_token / (cost.peak_flops * cost.compute_efficiency);
    let backward_share = match shape.checkpointing {
        Checkpointing::Full => 0.75,
        _ => 2.0 / 3.0,
    };

    // Collectives.
    let link = if ctx.hardware.nodes() > 1 {
        cost.inter_node_bandwidth
    } else {
        cost.intra_node_bandwidth
    };
    let ring = (world - 1.0) / world;
    let volume = e * params * ring / link;
    let exposed = |busy: f64, window: f64| (busy - window).max(0.0);
    let zero = &setup.zero;
    let (per_micro_exposed, boundary_exposed) = match zero.stage {
        ZeroStage::Disabled => (0.0, exposed(2.0 * volume, backward_share * micro)),
        ZeroStage::OptimizerStates => (0.0, exposed(2.0 * volume, backward_share * micro) + volume),
        ZeroStage::Gradients => (exposed(2.0 * volume, backward_share * micro), volume),
        ZeroStage::Weights => {
            let mut busy = 3.0 * volume;
            if zero.params_offloaded() {
                let fetch = 2.0 * e * partition;
                busy += match zero.offload_param.device {
                    OffloadDevice::Nvme => fetch * ranks_per_node / cost.nvme_bandwidth,
                    _ => fetch / cost.host_link_bandwidth,
                };
            }
            (exposed(busy, micro), 0.0)
        }
    };
    let communication = gas * per_micro_exposed + boundary_exposed;

    // Offload traffic and the optimizer.
    let split = optimizer_split(ctx);
    let off = (split.host + split.nvme) as f64;
    let g = setup.grad_bytes as f64;
    // Gradients: a 16-bit round trip per later micro-step, fp32 down at the boundary, spread
    // over the micro-steps' backward passes.
    let gradient_traffic = off * ((gas - 1.0) * 2.0 * g + 4.0) / cost.host_link_bandwidth;
    let mut offload = exposed(gradient_traffic, gas * backward_share * micro);
    offload += off * e / cost.host_link_bandwidth;
    let state_bytes = 4.0
        + (setup.optimizer.states_per_param * setup.optimizer.state_bytes) as f64
        + setup.optimizer_grad_bytes as f64;
    offload += 2.0 * state_bytes * split.nvme as f64 * ranks_per_node / cost.nvme_bandwidth;
    let optimizer =
        split.gpu as f64 * 32.0 / cost.hbm_bandwidth + off * ranks_per_node / cost.cpu_adam_rate;

    let compute = gas * micro;
    StepTime {
        compute,
        communication,
        offload,
        optimizer,
        total: compute + communication + offload + optimizer,
    }
}
