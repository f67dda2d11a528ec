//! The step-time cost model's device constants as command-line flags, shared by `recommend`
//! (which ranks candidates by them) and `estimate --step-time` (which prints the predicted
//! step of one given config). The formulas are `dsplan_planner::recommend::cost`'s.

use clap::Args;
use dsplan_planner::recommend::CostModel;

// The defaults, as `CostModel::default()` holds them (in these flags' units).
const PEAK_TFLOPS: f64 = 989.4;
const COMPUTE_EFFICIENCY: f64 = 0.40;
const INTRA_NODE_GBPS: f64 = 450.0;
const INTER_NODE_GBPS: f64 = 50.0;
const HOST_LINK_GBPS: f64 = 32.0;
const HBM_GBPS: f64 = 3350.0;
const CPU_ADAM_GPARAMS: f64 = 1.344;
const NVME_GBPS: f64 = 28.0;

/// The cost model's constants (defaults: one H100 SXM5 node class; see `dsplan_planner::
/// recommend::cost` for the source of each).
#[derive(Debug, Args)]
pub struct CostArgs {
    /// Peak dense tensor throughput of one GPU in the training precision, TFLOP/s (H100 SXM5:
    /// 989.4; A100: 312; V100: 125).
    #[arg(long, value_name = "T", default_value_t = PEAK_TFLOPS)]
    peak_tflops: f64,

    /// Fraction of that peak the model sustains.
    #[arg(long, value_name = "F", default_value_t = COMPUTE_EFFICIENCY)]
    compute_efficiency: f64,

    /// Collective bandwidth per GPU inside a node, GB/s (NVLink 4: 450).
    #[arg(long, value_name = "GBPS", default_value_t = INTRA_NODE_GBPS)]
    intra_node_gbps: f64,

    /// Collective bandwidth per GPU across nodes, GB/s (400 Gb/s NDR per GPU: 50).
    #[arg(long, value_name = "GBPS", default_value_t = INTER_NODE_GBPS)]
    inter_node_gbps: f64,

    /// Host-GPU bandwidth per GPU and direction, GB/s (PCIe 4.0 x16: 32; 3.0: 16; 5.0: 64).
    #[arg(long, value_name = "GBPS", default_value_t = HOST_LINK_GBPS)]
    host_link_gbps: f64,

    /// GPU memory bandwidth, GB/s (H100 SXM5: 3350).
    #[arg(long, value_name = "GBPS", default_value_t = HBM_GBPS)]
    hbm_gbps: f64,

    /// CPU Adam throughput of one node, billions of parameters per second (measured on a
    /// 2-vCPU machine: 1.344; scale with the host's memory bandwidth).
    #[arg(long, value_name = "G", default_value_t = CPU_ADAM_GPARAMS)]
    cpu_adam_gparams: f64,

    /// NVMe bandwidth of one node, GB/s (ZeRO-Infinity's DGX-2: 28).
    #[arg(long, value_name = "GBPS", default_value_t = NVME_GBPS)]
    nvme_gbps: f64,
}

impl CostArgs {
    /// The cost model of these constants and `tie_tolerance`.
    pub fn cost_model(&self, tie_tolerance: f64) -> CostModel {
        CostModel {
            peak_flops: self.peak_tflops * 1e12,
            compute_efficiency: self.compute_efficiency,
            intra_node_bandwidth: self.intra_node_gbps * 1e9,
            inter_node_bandwidth: self.inter_node_gbps * 1e9,
            host_link_bandwidth: self.host_link_gbps * 1e9,
            hbm_bandwidth: self.hbm_gbps * 1e9,
            cpu_adam_rate: self.cpu_adam_gparams * 1e9,
            nvme_bandwidth: self.nvme_gbps * 1e9,
            tie_tolerance,
        }
    }

    /// Whether every constant is its default (none was changed on the command line).
    pub fn all_default(&self) -> bool {
        [
            (self.peak_tflops, PEAK_TFLOPS),
            (self.compute_efficiency, COMPUTE_EFFICIENCY),
            (self.intra_node_gbps, INTRA_NODE_GBPS),
            (self.inter_node_gbps, INTER_NODE_GBPS),
            (self.host_link_gbps, HOST_LINK_GBPS),
            (self.hbm_gbps, HBM_GBPS),
            (self.cpu_adam_gparams, CPU_ADAM_GPARAMS),
            (self.nvme_gbps, NVME_GBPS),
        ]
        .iter()
        .all(|(given, default)| given.to_bits() == default.to_bits())
    }
}
