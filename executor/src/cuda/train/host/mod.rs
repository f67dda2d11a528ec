//! A host interpreter of the CUDA step: a rank's [`StepProgram`] (one GPU's program, or
//! [`super::world_program`]'s at `W > 1`, with the plan's collectives) run op by op on host
//! vectors laid out as the device's buffers, each compute op with its kernel's semantics and
//! each collective through the host `Comm` of `W` thread ranks. It answers, without a GPU,
//! whether the *program* (bucket ranges, averaging, partitions, the norm's and AdamW's views,
//! the clip coefficient, the parameter all-gather, stage 3's arena places and releases)
//! computes the CPU backend's step; the kernels themselves are the GPU checks' job
//! (`cuda::check::kernels`).
//!
//! | module | job |
//! |---|---|
//! | [`buffers`] | [`HostBuffers`]: one vector per region, filled as the device's are |
//! | [`compute`] | the compute ops ([`run_compute`]), each to its kernel's twin |
//! | [`kernels`] | the kernels' semantics on host vectors (products, bias sums, the embedding's buckets, RoPE, the classifier, the norm pass, AdamW) |
//! | [`attention`] | attention forward (log-sum-exp kept) and backward as `attention.cu`, grouped-query too |
//! | [`collectives`] | the communication ops ([`run_comm`]) through the host `Comm` |
//! | [`ordering`] | the two streams' events: every cross-stream access ordered ([`check_ordering`]) |
//! | [`backend`] | [`HostTarget`], the host as a target of the one device step ([`HostStep`]) |
//! | [`run`] | [`train_program_on_host`], the front door (the GPU's `train_cuda_planned`) |
//!
//! A 16-bit model is interpreted with the device's storage: every store into a model-dtype
//! region rounded to nearest even, f32 arithmetic between stores
//! ([`buffers::ModelRounding`]). What it does not cover: the kernels' own arithmetic (the CPU references stand in for them, f64 products for cuBLASLt), and
//! timing: one thread per rank runs the program in list order, so a race between the compute
//! and communication streams cannot change a result here; [`ordering`] checks the program's
//! events instead.

pub mod attention;
pub mod backend;
pub mod buffers;
pub mod collectives;
pub mod compute;
pub mod kernels;
pub mod ordering;
pub mod run;

pub use backend::{HostStep, HostTarget};
pub use buffers::HostBuffers;
pub use collectives::run_comm;
pub use compute::run_compute;
pub use ordering::{OrderingError, check_ordering};
pub use run::{HostRun, run_rank_models_on_host, train_program_on_host};

/// Why the host interpreter could not run an op or a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostError(pub String);

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HostError {}
