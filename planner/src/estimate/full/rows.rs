//! The vocabulary of the full estimate: phases, devices, categories, terms and rows.
//!
//! A [`Row`] is one named term (for example "16-bit parameters" on the GPU) with its bytes in
//! each [`Phase`] of a training step and the formula that produced them. GPU rows count one GPU;
//! CPU and NVMe rows count one node (all its ranks), as DeepSpeed's "per CPU" column does.

use serde::Serialize;

/// A moment of training whose memory is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// After `deepspeed.initialize()`, including its transient peak (model load, partitioning).
    Init,
    /// The end of a forward pass: every stored activation, the logits and the loss.
    Forward,
    /// The start of a backward pass, where stored activations meet the first gradients.
    Backward,
    /// The optimizer step at the gradient-accumulation boundary.
    Step,
}

impl Phase {
    /// The four phases in the order a step goes through them.
    pub const ALL: [Phase; 4] = [Phase::Init, Phase::Forward, Phase::Backward, Phase::Step];

    /// The phases after initialisation.
    pub const TRAINING: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Step];

    /// The column title in human output.
    pub fn title(self) -> &'static str {
        match self {
            Phase::Init => "init",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Step => "step",
        }
    }
}

/// Where a row's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Device {
    /// GPU memory (bytes per GPU).
    Gpu,
    /// Page-locked host memory (bytes per node).
    CpuPinned,
    /// Ordinary host memory (bytes per node).
    CpuPageable,
    /// NVMe storage (bytes per node).
    Nvme,
}

impl Device {
    /// Whether this is host memory, pinned or not.
    pub fn is_cpu(self) -> bool {
        matches!(self, Device::CpuPinned | Device::CpuPageable)
    }

    /// Host memory, pinned or pageable as asked.
    pub fn host(pinning: Pinning) -> Device {
        match pinning {
            Pinning::Pinned => Device::CpuPinned,
            Pinning::Pageable => Device::CpuPageable,
        }
    }
}

pub use crate::plan::settings::Pinning;

/// The family a term belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    /// Parameters, gradients and optimizer states (what DeepSpeed's estimators count).
    ModelStates,
    /// Communication buckets, gathered parameters, staging and swap buffers.
    Buffers,
    /// Activations, logits and loss buffers.
    Activations,
    /// CUDA context, allocator fragmentation, host process memory, model loading.
    Overhead,
}

/// Every term of the full estimate. The id is stable (JSON `term`); the label is for people.
/// Rows appear in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Term {
    /// The (16-bit, or fp32 without mixed precision) model parameters this rank holds.
    Parameters,
    /// The gradients this rank holds until the step (whole, or its partition).
    Gradients,
    /// The fp32 master copy of the parameters (mixed precision only).
    MasterParameters,
    /// The optimizer's per-parameter states (Adam: momentum and variance).
    OptimizerStates,
    /// fp32 gradients: the flat partition built for the optimizer step, the offload buffer,
    /// or BF16_Optimizer's accumulation buffer.
    Fp32Gradients,
    /// The gradient reduction bucket(s) (`reduce_bucket_size`; stages 1-2 double it with
    /// `overlap_comm`; stage 0's flattened all-reduce bucket).
    ReduceBucket,
    /// ZeRO-3's reduce-scatter staging copy of a bucket.
    ReduceScatterStaging,
    /// ZeRO-3: full parameters gathered for the running modules and prefetched ahead (stages
    /// 1-2 all-gather into the flat parameter buffer itself: no bucket).
    GatheredParameters,
    /// The full gradients of the running module before they are copied into a bucket or
    /// reduced.
    ModuleGradients,
    /// ZeRO-3: small parameters kept whole on every GPU (`stage3_param_persistence_threshold`).
    PersistentParameters,
    /// fp32 temporary of one optimizer sub-group (ZeRO-3 step).
    SubGroupCast,
    /// ZeRO-1/2 offload: device staging buffer (largest parameter, 16-bit).
    OffloadStagingGpu,
    /// ZeRO-1/2 offload: host staging buffer (largest parameter, 16-bit).
    OffloadStagingCpu,
    /// NVMe parameter swapping: pinned buffers (`offload_param.buffer_count x buffer_size`).
    ParamSwapBuffers,
    /// NVMe optimizer swapping: pinned buffers (`offload_optimizer.buffer_count` sub-groups).
    OptimizerSwapBuffers,
    /// Token ids and labels, the embedding dropout mask, the final norm's and the head's inputs.
    EmbeddingActivations,
    /// Activations stored for backward by every transformer layer.
    LayerActivations,
    /// The transient working set of the layer being run (recompute, activation gradients).
    LayerWorkingSet,
    /// The logits in the model dtype (`batch x seq x vocab`).
    Logits,
    /// The loss: fp32 logits and the log-softmax (and their gradients in backward).
    LossBuffers,
    /// The whole 16-bit model on the GPU before ZeRO-3 partitions it (no `zero.Init`).
    UnpartitionedModel,
    /// The model materialised in host memory by every rank before DeepSpeed takes it.
    ModelLoad,
    /// CUDA context, cuBLAS and NCCL workspaces.
    CudaContext,
    /// Caching-allocator fragmentation: a share of the bytes allocated and freed during a step.
    Fragmentation,
    /// Host memory of each training process (interpreter, libraries, CUDA runtime).
    HostProcess,
}

impl Term {
    /// A short description for tables.
    pub fn label(self) -> &'static str {
        match self {
            Term::Parameters => "parameters",
            Term::Gradients => "gradients",
            Term::MasterParameters => "fp32 master parameters",
            Term::OptimizerStates => "optimizer states",
            Term::Fp32Gradients => "fp32 gradients",
            Term::ReduceBucket => "reduce bucket(s)",
            Term::ReduceScatterStaging => "reduce-scatter staging",
            Term::GatheredParameters => "gathered parameters",
            Term::ModuleGradients => "module gradients",
            Term::PersistentParameters => "persistent parameters",
            Term::SubGroupCast => "sub-group fp32 cast",
            Term::OffloadStagingGpu => "offload staging (GPU)",
            Term::OffloadStagingCpu => "offload staging (host)",
            Term::ParamSwapBuffers => "param swap buffers",
            Term::OptimizerSwapBuffers => "optimizer swap buffers",
            Term::EmbeddingActivations => "input activations",
            Term::LayerActivations => "layer activations",
            Term::LayerWorkingSet => "layer working set",
            Term::Logits => "logits",
            Term::LossBuffers => "loss buffers",
            Term::UnpartitionedModel => "unpartitioned model",
            Term::ModelLoad => "model load",
            Term::CudaContext => "CUDA context",
            Term::Fragmentation => "fragmentation",
            Term::HostProcess => "host processes",
        }
    }
}

/// Bytes in each phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PhaseBytes {
    /// [`Phase::Init`].
    pub init: u64,
    /// [`Phase::Forward`].
    pub forward: u64,
    /// [`Phase::Backward`].
    pub backward: u64,
    /// [`Phase::Step`].
    pub step: u64,
}

impl PhaseBytes {
    /// `bytes` in every phase (allocated at initialisation and kept).
    pub fn resident(bytes: u64) -> PhaseBytes {
        PhaseBytes::during(&Phase::ALL, bytes)
    }

    /// `bytes` in the listed phases, 0 elsewhere.
    pub fn during(phases: &[Phase], bytes: u64) -> PhaseBytes {
        let mut result = PhaseBytes::default();
        for &phase in phases {
            result.set(phase, bytes);
        }
        result
    }

    /// The bytes in `phase`.
    pub fn get(&self, phase: Phase) -> u64 {
        match phase {
            Phase::Init => self.init,
            Phase::Forward => self.forward,
            Phase::Backward => self.backward,
            Phase::Step => self.step,
        }
    }

    /// Sets the bytes of `phase`.
    pub fn set(&mut self, phase: Phase, bytes: u64) {
        match phase {
            Phase::Init => self.init = bytes,
            Phase::Forward => self.forward = bytes,
            Phase::Backward => self.backward = bytes,
            Phase::Step => self.step = bytes,
        }
    }

    /// Phase-wise sum (saturating).
    pub fn plus(self, other: PhaseBytes) -> PhaseBytes {
        let mut sum = PhaseBytes::default();
        for phase in Phase::ALL {
            sum.set(phase, self.get(phase).saturating_add(other.get(phase)));
        }
        sum
    }

    /// The largest phase and its bytes (the first such phase on ties).
    pub fn peak(&self) -> (Phase, u64) {
        let mut best = (Phase::Init, self.init);
        for phase in Phase::ALL {
            if self.get(phase) > best.1 {
                best = (phase, self.get(phase));
            }
        }
        best
    }

    /// Whether every phase is 0.
    pub fn is_zero(&self) -> bool {
        Phase::ALL.iter().all(|&phase| self.get(phase) == 0)
    }
}

/// One named term of the estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    /// What it is.
    pub term: Term,
    /// Its family.
    pub category: Category,
    /// Where it lives (GPU rows per GPU; host and NVMe rows per node).
    pub device: Device,
    /// Bytes in each phase.
    pub bytes: PhaseBytes,
    /// How the bytes were computed, with the numbers put in.
    pub formula: String,
}

impl Row {
    /// A row.
    pub fn new(
        term: Term,
        category: Category,
        device: Device,
        bytes: PhaseBytes,
        formula: impl Into<String>,
    ) -> Row {
        Row {
            term,
            category,
            device,
            bytes,
            formula: formula.into(),
        }
    }
}

/// `x` as bytes, saturating at `u64::MAX` (inputs are bounded far below that).
pub fn saturate(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// `ceil(a / b)` for `b > 0` (0 when `b` is 0, which the callers exclude).
pub fn ceil_div(a: u128, b: u128) -> u128 {
    if b == 0 { 0 } else { a.div_ceil(b) }
}
