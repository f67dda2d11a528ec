//! [`PlanBackend`]: which runtime's buffers a plan lists. The layout, shards, buckets, fetch
//! units and ticks are the same for all; only the buffer list ([`super::buffers`],
//! [`super::cpu_buffers`] or [`super::cuda_buffers`]) and so the memory timeline differ.

use serde::Serialize;

/// The runtime a plan is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlanBackend {
    /// DeepSpeed on GPUs: the buffers DeepSpeed allocates, in the model dtype, on the GPU and
    /// (under offload) the host ([`super::buffers`]).
    #[default]
    DeepspeedGpu,
    /// dsplan's own CPU executor: every rank a thread of one process, computing in `f32`, all
    /// buffers in host memory ([`super::cpu_buffers`]).
    DsplanCpu,
    /// dsplan's own CUDA executor: one rank's device step allocations, in the model dtype,
    /// all on the GPU ([`super::cuda_buffers`], [`super::cuda_world`]). No offload.
    DsplanCuda,
}

impl PlanBackend {
    /// Whether this is the default, DeepSpeed on GPUs (the plan's settings then leave the
    /// field out, so GPU plans print as they always did).
    pub fn is_deepspeed_gpu(&self) -> bool {
        *self == PlanBackend::DeepspeedGpu
    }

    /// The name the CLI and the plan's JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            PlanBackend::DeepspeedGpu => "deepspeed-gpu",
            PlanBackend::DsplanCpu => "dsplan-cpu",
            PlanBackend::DsplanCuda => "dsplan-cuda",
        }
    }
}
