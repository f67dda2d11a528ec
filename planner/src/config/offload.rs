//! `zero_optimization.offload_param` and `zero_optimization.offload_optimizer`: moving ZeRO
//! state out of GPU memory, to CPU RAM or to NVMe (ZeRO-Offload / ZeRO-Infinity).
//!
//! Both are pydantic models in DeepSpeed (`runtime/zero/offload_config.py`): unknown keys are
//! rejected.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::primitives::NonNegativeInt;

/// Where offloaded state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OffloadDevice {
    /// Not offloaded: the state stays on the GPU.
    #[default]
    None,
    /// CPU memory (pinned when `pin_memory`).
    Cpu,
    /// An NVMe drive at `nvme_path`, through DeepSpeed's async I/O (see the `aio` section).
    Nvme,
}

impl OffloadDevice {
    /// Whether anything leaves the GPU.
    pub fn is_offloaded(self) -> bool {
        self != OffloadDevice::None
    }
}

/// Parameter offload (`offload_param`), ZeRO stage 3 only: the partitioned 16-bit parameters
/// live on the CPU or NVMe and are fetched to the GPU when a module needs them. Stages 1 and 2
/// silently ignore this section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OffloadParamConfig {
    /// Where the parameters go. The docs say the default is `cpu`; the code's default is `none`.
    pub device: OffloadDevice,
    /// Directory on the NVMe drive (required when `device` is `nvme`; DeepSpeed asserts it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_path: Option<String>,
    /// Number of pinned buffers in the NVMe swap pool.
    pub buffer_count: NonNegativeInt,
    /// Elements per swap buffer; every parameter partition must be smaller than this.
    pub buffer_size: NonNegativeInt,
    /// Parameter elements kept in pinned CPU memory when offloading to NVMe.
    pub max_in_cpu: NonNegativeInt,
    /// Use page-locked (pinned) CPU memory: needed for asynchronous, full-bandwidth copies.
    pub pin_memory: bool,
}

impl Default for OffloadParamConfig {
    fn default() -> Self {
        OffloadParamConfig {
            device: OffloadDevice::None,
            nvme_path: None,
            buffer_count: NonNegativeInt(5),
            buffer_size: NonNegativeInt(100_000_000),
            max_in_cpu: NonNegativeInt(1_000_000_000),
            pin_memory: true,
        }
    }
}

/// Optimizer offload (`offload_optimizer`), ZeRO stages 1-3: the fp32 master weights and
/// optimizer states live on the CPU (or NVMe, stage 3) and the optimizer step runs on the CPU
/// (DeepSpeedCPUAdam). Stages 1 and 2 treat `nvme` as `cpu`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct OffloadOptimizerConfig {
    /// Where the optimizer state goes; the optimizer step runs on the CPU whenever this is not
    /// `none`.
    pub device: OffloadDevice,
    /// Directory on the NVMe drive (used when `device` is `nvme`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvme_path: Option<String>,
    /// Number of pinned buffers for NVMe swapping; at least the number of states the optimizer
    /// keeps per parameter (Adam: 4).
    pub buffer_count: NonNegativeInt,
    /// Use page-locked (pinned) CPU memory: needed for asynchronous, full-bandwidth copies.
    pub pin_memory: bool,
    /// Overlap reading the next sub-group from NVMe with the current optimizer step.
    pub pipeline_read: bool,
    /// Overlap writing the previous sub-group to NVMe with the current optimizer step.
    pub pipeline_write: bool,
    /// Initialise the NVMe optimizer swap files directly (faster start-up).
    pub fast_init: bool,
    /// Fraction of the optimizer sub-groups run on the CPU; the rest stay on the GPU. Values
    /// below 1 (partial offload) need ZeRO stage 3.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub ratio: f64,
    /// High-performance CPU offloading for superchips (Grace Hopper/Blackwell), stage 3 only.
    pub super_offload: bool,
    /// Fraction of CPU cores the CPU Adam uses with `super_offload`.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub cpuadam_cores_perc: f64,
}

impl Default for OffloadOptimizerConfig {
    fn default() -> Self {
        OffloadOptimizerConfig {
            device: OffloadDevice::None,
            nvme_path: None,
            buffer_count: NonNegativeInt(4),
            pin_memory: true,
            pipeline_read: false,
            pipeline_write: false,
            fast_init: false,
            ratio: 1.0,
            super_offload: false,
            cpuadam_cores_perc: 0.8,
        }
    }
}
