//! [`TrainReport`]: what a finished run reports, whichever backend ran it.

use crate::checkpoint::SavedCheckpoint;
use crate::comm::CommTraffic;
use crate::metrics::{ByCategory, Category, DeviceRun, MemoryReport, PlanMemory, StepMetrics};
use crate::zero::Correspondence;
use crate::zero::swap::NvmeReport;

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainReport {
    /// Every step, as rank 0 saw it.
    pub steps: Vec<StepMetrics>,
    /// The trained fp32 parameters (the consolidated master weights), flat.
    pub final_params: Vec<f32>,
    /// Each rank's measured memory (on a GPU: what dsplan allocated on the device, per
    /// category).
    pub memory: Vec<MemoryReport>,
    /// The plan's peak per category (the same on every rank; with a plan of the backend that
    /// ran, `dsplan-cpu` or `dsplan-cuda`, the measured peaks equal it): `plan_memory.peak`.
    pub predicted: ByCategory,
    /// The plan's predicted memory per rank, in the same categories.
    pub plan_memory: PlanMemory,
    /// For each category of [`Category::ALL`], how the executor's buffers relate to the
    /// plan's.
    pub correspondence: Vec<(Category, Correspondence)>,
    /// What each rank sent.
    pub traffic: Vec<CommTraffic>,
    /// Optimizer steps applied (skipped ones excluded).
    pub applied_steps: u64,
    /// Wall-clock seconds of the training loop.
    pub seconds: f64,
    /// Tokens trained on (predicted positions over the steps run).
    pub tokens: u64,
    /// Stage 3 offload to NVMe: the plan's bytes there and each rank's measured use (`None`
    /// without NVMe offload).
    pub nvme: Option<NvmeReport>,
    /// The index of the first step run (non-zero when resumed).
    pub first_step: u64,
    /// The checkpoints written, in order.
    pub checkpoints: Vec<SavedCheckpoint>,
    /// The GPU the run trained on (`None`: the CPU).
    pub device: Option<DeviceRun>,
}
