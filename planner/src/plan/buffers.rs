//! [`Buffer`]: every allocation the executor makes for a step, with its size, device and
//! lifetime. The memory timeline ([`super::timeline`]) is their sum tick by tick, and
//! `dsplan estimate --config` reads its model-state, buffer and activation rows from the same
//! list, so estimate and allocator cannot drift apart.
//!
//! Model states and runtime buffers follow deepspeed-facts §1.7, §4 and §5.4 (per rank, `N`
//! ranks, `P` parameters, `p` this rank's partition):
//!
//! | stage | allocation | size | lifetime |
//! |---|---|---|---|
//! | 0 | parameters, optimizer states | `P` | run |
//! | 0 | gradients | whole, per module | its backward → step |
//! | 0 | fp32 master, fp32 gradients | fp16 and bf16 (`FP16_Optimizer`): `P`, the gradients at the step | |
//! | 0 | flattened all-reduce bucket | the largest 5e8-element bucket formed | epilogue |
//! | 1-2 | flat parameters | `P` padded to `2N` | run |
//! | 1-2 | IPG bucket(s) | `reduce_bucket_size`, two with `overlap_comm` (contiguous gradients) | backward |
//! | 1-2 | module gradients | whole, until copied into the IPG (stage 2, contiguous) or reduced | backward |
//! | 1 | gradients outside the partition | `(N−1)/N` of each reduced bucket (ZeRO-1 frees nothing) | flush → step |
//! | 1-2 | `grads_in_partition` | `p` (contiguous, not offloaded) | first flush → step (stage 2 with accumulation: run) |
//! | 1-2 | averaged gradients | `p` in `grad_accum_dtype` when it differs from the model dtype | epilogue → step |
//! | 1-2 | fp32 master, optimizer states | `p` (host under offload: master pinned, states pageable) | run (states from the first step) |
//! | 1-2 | fp32 gradient partition | `p`: at the step on the GPU, for the run on the host | |
//! | 1-2 + offload | staging buffers, host accumulation | largest tensor on GPU and host; `p` 16-bit on the host with accumulation | run (accumulation from the first step) |
//! | 3 | parameter partitions | `Σ⌈numel/N⌉`, GPU / host / NVMe | run |
//! | 3 | persistent parameters, gathered parameters | whole tensors, by the fetch schedule | run / intervals |
//! | 3 | IPG bucket | `reduce_bucket_size` (contiguous gradients) | run (allocated at init) |
//! | 3 | reduce-scatter staging | each bucket padded per tensor to `N` | its flush |
//! | 3 | gradient partition buffer | `p` in `grad_accum_dtype`, host under optimizer offload | run |
//! | 3 | fp32 master, states, fp32 gradients | per sub-group: GPU, host (pageable master and states) or NVMe | run; GPU fp32 gradients at the step |
//! | 3 + NVMe | swap buffers | `buffer_count × buffer_size` parameters, `buffer_count ×` largest sub-group | run |
//!
//! Optimizer states and accumulation buffers are created lazily in the first step
//! ([`Lifetime::Steady`]): optimizers build their states at their first `step()`.
//! Activations come from [`super::activations`] (sizes from [`crate::memory::activations`]).

use serde::Serialize;

use super::buckets::{Buckets, Collective, FlushPoint, gradient_order};
use super::dtype::{Device, Dtype};
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::offload::Offload;
use super::settings::{GradientStorage, OffloadTarget, Overlap, Pinning, Settings};
use super::shards::Shards;
use super::stage3::Stage3Schedule;
use super::ticks::Ticks;
use crate::config::ZeroStage;

/// What a buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BufferKind {
    /// Model-dtype parameters at rest (whole, flat, or this rank's partitions).
    Parameters,
    /// Gradients kept to the optimizer step (whole tensors, or this rank's partition).
    Gradients,
    /// The gradients the optimizer reads (fp32, or the master dtype): built at the step, or
    /// or kept on the host under offload.
    Fp32Gradients,
    /// The master weights the optimizer updates.
    MasterWeights,
    /// Optimizer states.
    OptimizerStates,
    /// Stage 3 parameters kept whole on every rank.
    PersistentParameters,
    /// Stage 3 parameters gathered for a module (on demand or prefetched).
    GatheredParameters,
    /// A module's whole gradients between its backward and their copy into a bucket or
    /// their reduction.
    ModuleGradients,
    /// Gradient buckets (IPG) and the stage-0 flattened all-reduce bucket.
    GradientBuckets,
    /// Stage 3's padded, interleaved copy of a bucket for its reduce-scatter.
    ReduceScatterStaging,
    /// Scratch of the optimizer step (stage 3's per-sub-group flatten and cast).
    StepScratch,
    /// Offload staging buffers (ZeRO-1/2 CPU offload).
    OffloadStaging,
    /// Pinned swap buffers of NVMe parameter offload.
    ParamSwapBuffers,
    /// Pinned swap buffers of NVMe optimizer offload.
    OptimizerSwapBuffers,
    /// `dsplan-cpu`: `f32` copies the in-process collectives read or write (16-bit fetch
    /// slices, the parameter all-gather's pieces, stage 3's persistent re-gather).
    CollectiveStaging,
    /// Token ids and labels, the embedding dropout mask, the final norm's and the head's
    /// inputs.
    InputActivations,
    /// Activations each transformer layer stores for backward (or its checkpoint).
    LayerActivations,
    /// The running layer's working set and its recomputed activations.
    WorkingActivations,
    /// The logits.
    Logits,
    /// The loss's fp32 buffers (upcast logits, log-softmax and its gradient).
    LossBuffers,
    /// `dsplan-cpu`: the CPU model's one `f32` arena holding every activation of a pass
    /// ([`crate::memory::cpu_arena`]).
    ActivationArena,
}

/// The three families the memory report splits a peak into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BufferClass {
    /// Parameters, gradients, master weights, optimizer states (DeepSpeed's estimators'
    /// scope, fp32 gradients included).
    ModelStates,
    /// Runtime buffers: buckets, gathered and persistent parameters, scratch, staging.
    Buffers,
    /// Activations, logits and loss.
    Activations,
}

impl BufferKind {
    /// The family of this kind.
    pub fn class(self) -> BufferClass {
        match self {
            BufferKind::Parameters
            | BufferKind::Gradients
            | BufferKind::Fp32Gradients
            | BufferKind::MasterWeights
            | BufferKind::OptimizerStates => BufferClass::ModelStates,
            BufferKind::PersistentParameters
            | BufferKind::GatheredParameters
            | BufferKind::ModuleGradients
            | BufferKind::GradientBuckets
            | BufferKind::ReduceScatterStaging
            | BufferKind::StepScratch
            | BufferKind::OffloadStaging
            | BufferKind::ParamSwapBuffers
            | BufferKind::OptimizerSwapBuffers
            | BufferKind::CollectiveStaging => BufferClass::Buffers,
            BufferKind::InputActivations
            | BufferKind::LayerActivations
            | BufferKind::WorkingActivations
            | BufferKind::Logits
            | BufferKind::LossBuffers
            | BufferKind::ActivationArena => BufferClass::Activations,
        }
    }

    /// Whether this is model state (DeepSpeed's estimators' scope).
    pub fn is_model_state(self) -> bool {
        self.class() == BufferClass::ModelStates
    }

    /// Whether this is an activation.
    pub fn is_activation(self) -> bool {
        self.class() == BufferClass::Activations
    }

    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            BufferKind::Parameters => "parameters",
            BufferKind::Gradients => "gradients",
            BufferKind::Fp32Gradients => "fp32 gradients",
            BufferKind::MasterWeights => "master weights",
            BufferKind::OptimizerStates => "optimizer states",
            BufferKind::PersistentParameters => "persistent parameters",
            BufferKind::GatheredParameters => "gathered parameters",
            BufferKind::ModuleGradients => "module gradients",
            BufferKind::GradientBuckets => "gradient buckets",
            BufferKind::ReduceScatterStaging => "reduce-scatter staging",
            BufferKind::StepScratch => "step scratch",
            BufferKind::OffloadStaging => "offload staging",
            BufferKind::ParamSwapBuffers => "param swap buffers",
            BufferKind::OptimizerSwapBuffers => "optimizer swap buffers",
            BufferKind::InputActivations => "input activations",
            BufferKind::LayerActivations => "layer activations",
            BufferKind::WorkingActivations => "working activations",
            BufferKind::Logits => "logits",
            BufferKind::LossBuffers => "loss buffers",
            BufferKind::CollectiveStaging => "collective staging",
            BufferKind::ActivationArena => "activation arena",
        }
    }
}

/// When a buffer exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "lifetime", rename_all = "kebab-case")]
pub enum Lifetime {
    /// Allocated at start-up (`deepspeed.initialize()`), kept for the whole run.
    Persistent,
    /// Allocated lazily during the first step (optimizer states, accumulation buffers), kept
    /// for the rest of the run: live at every tick of a step, absent right after start-up.
    Steady,
    /// Live from tick `first` to tick `last`, inclusive.
    Ticks {
        /// First tick.
        first: usize,
        /// Last tick.
        last: usize,
    },
}

impl Lifetime {
    /// Whether the buffer is live at `tick`.
    pub fn live_at(self, tick: usize) -> bool {
        match self {
            Lifetime::Persistent | Lifetime::Steady => true,
            Lifetime::Ticks { first, last } => first <= tick && tick <= last,
        }
    }
}

/// One allocation of one rank (every rank makes the same ones: partitions are equal-sized).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Buffer {
    /// Name.
    pub name: String,
    /// What it holds.
    pub kind: BufferKind,
    /// Element type.
    pub dtype: Dtype,
    /// Elements.
    pub numel: u64,
    /// Bytes.
    pub bytes: u64,
    /// Where.
    pub device: Device,
    /// Host buffers: pinned or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinning: Option<Pinning>,
    /// When.
    #[serde(flatten)]
    pub lifetime: Lifetime,
}

/// Everything [`buffers`] needs.
pub struct BufferInputs<'a> {
    /// The model.
    pub model: &'a ModelGraph,
    /// Settings.
    pub settings: &'a Settings,
    /// Layout.
    pub layout: &'a Layout,
    /// Shards.
    pub shards: &'a Shards,
    /// Buckets.
    pub buckets: &'a Buckets,
    /// Stage 3 schedule.
    pub stage3: Option<&'a Stage3Schedule>,
    /// Offload.
    pub offload: &'a Offload,
    /// Ticks.
    pub ticks: &'a Ticks,
}

/// The list being built.
#[derive(Default)]
pub struct BufferList {
    buffers: Vec<Buffer>,
    /// Whether the last [`Self::add`] added a buffer (it skips empty ones).
    just_added: bool,
    /// Whether buffers keep their names.
    names: Names,
}

/// Whether a [`BufferList`] keeps the names of its buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Names {
    /// Every buffer is named (a plan's list).
    #[default]
    Kept,
    /// Names are left empty: a list only summed (bytes, devices, lifetimes), where formatting
    /// a name per layer would cost more than the sum.
    Dropped,
}

impl BufferList {
    /// An empty list.
    pub fn new() -> Self {
        Self::with_names(Names::Kept)
    }

    /// An empty list that keeps names or not.
    pub fn with_names(names: Names) -> Self {
        Self {
            buffers: Vec::new(),
            just_added: false,
            names,
        }
    }

    /// The buffers added, in order.
    pub fn into_buffers(self) -> Vec<Buffer> {
        self.buffers
    }

    /// Adds `numel` elements of `dtype` (nothing when `numel` is 0). Host buffers start
    /// pageable; [`Self::pinned`] changes that.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        kind: BufferKind,
        dtype: Dtype,
        numel: u64,
        device: Device,
        lifetime: Lifetime,
    ) {
        self.just_added = numel > 0;
        if numel == 0 {
            return;
        }
        let name = match self.names {
            Names::Kept => name.into(),
            Names::Dropped => String::new(),
        };
        self.buffers.push(Buffer {
            name,
            kind,
            dtype,
            numel,
            bytes: numel.saturating_mul(dtype.bytes()),
            device,
            pinning: (device == Device::Cpu).then_some(Pinning::Pageable),
            lifetime,
        });
    }

    /// [`Self::add`], naming the buffer only when it is added and the list keeps names.
    pub fn add_named(
        &mut self,
        name: impl FnOnce() -> String,
        kind: BufferKind,
        dtype: Dtype,
        numel: u64,
        device: Device,
        lifetime: Lifetime,
    ) {
        let name = match self.names {
            Names::Kept if numel > 0 => name(),
            _ => String::new(),
        };
        self.add(name, kind, dtype, numel, device, lifetime);
    }

    /// Marks the buffer just added as `pinning`, when it was added and is in host memory.
    pub fn pinned(&mut self, pinning: Pinning) {
        if let Some(last) = self.buffers.last_mut().filter(|_| self.just_added)
            && last.device == Device::Cpu
        {
            last.pinning = Some(pinning);
        }
    }
}

/// `prefix` then `name`, as `format!("{prefix}{name}")` without the formatter: a name per
/// tensor or unit of a deep model is hundreds of thousands of them.
fn joined(prefix: &str, name: &str) -> String {
    let mut joined = String::with_capacity(prefix.len() + name.len());
    joined.push_str(prefix);
    joined.push_str(name);
    joined
}

/// Every buffer of one step.
pub fn buffers(inputs: &BufferInputs<'_>) -> Vec<Buffer> {
    let mut list = BufferList::new();
    match inputs.settings.stage {
        ZeroStage::Disabled => stage0(inputs, &mut list),
        ZeroStage::OptimizerStates | ZeroStage::Gradients => stage12(inputs, &mut list),
        ZeroStage::Weights => stage3(inputs, &mut list),
    }
    super::activations::activation_buffers(inputs.model, inputs.settings, inputs.ticks, &mut list);
    list.buffers
}

/// `first..=last` in ticks (`last` never before `first`).
pub fn span(first: usize, last: usize) -> Lifetime {
    Lifetime::Ticks {
        first,
        last: last.max(first),
    }
}

/// Whole gradients of each backward step's ready tensors, live from their tick to
/// `end(step)`, of `kind`. Stages 0 and 1 accumulate whole gradients over micro-steps: with
/// accumulation they are live from tick 0 of the boundary micro-step.
fn unit_gradients(
    inputs: &BufferInputs<'_>,
    list: &mut BufferList,
    kind: BufferKind,
    end: impl Fn(usize) -> usize,
) {
    let s = inputs.settings;
    let accumulated =
        s.batch.gradient_accumulation_steps > 1 && s.stage <= ZeroStage::OptimizerStates;
    let mut by_step: Vec<(usize, u64)> = Vec::new();
    for (tensor, step) in gradient_order(inputs.model) {
        let numel = inputs.model.tensors[tensor].numel;
        match by_step.last_mut() {
            Some((last, n)) if *last == step => *n += numel,
            _ => by_step.push((step, numel)),
        }
    }
    for (step, numel) in by_step {
        let tick = inputs.ticks.trace(step);
        let first = if accumulated { 0 } else { tick };
        let unit = crate::plan::stage3::trace_step(inputs.ticks.units, step).0;
        list.add_named(
            || joined("gradients of ", &inputs.model.units[unit].module),
            kind,
            s.dtypes.gradients,
            numel,
            Device::Gpu,
            span(first, end(step)),
        );
    }
}

/// The tick of each bucket's flush.
fn flush_tick(inputs: &BufferInputs<'_>, flush: FlushPoint) -> usize {
    match flush {
        FlushPoint::BackwardStep { step } => inputs.ticks.trace(step),
        FlushPoint::Epilogue => inputs.ticks.epilogue(),
    }
}

/// The last flush tick of the tensors each backward step makes ready.
fn last_flush_by_step(inputs: &BufferInputs<'_>) -> Vec<usize> {
    let ticks = inputs.ticks;
    let mut at = vec![ticks.epilogue(); inputs.model.tensors.len()];
    for bucket in &inputs.buckets.reduce {
        let tick = flush_tick(inputs, bucket.flush);
        for &t in &bucket.tensors {
            at[t] = tick;
        }
    }
    let mut last = vec![0usize; 2 * ticks.units + 1];
    for (tensor, step) in gradient_order(inputs.model) {
        last[step] = last[step].max(at[tensor]);
    }
    last
}

fn stage0(inputs: &BufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let partition = layout.partition_numel;
    list.add(
        "parameters",
        BufferKind::Parameters,
        s.dtypes.params,
        layout.padded_numel,
        Device::Gpu,
        Lifetime::Persistent,
    );
    let step_end = ticks.last_optimizer();
    unit_gradients(inputs, list, BufferKind::Gradients, |_| step_end);
    let largest_bucket = inputs
        .buckets
        .reduce
        .iter()
        .map(|b| b.numel)
        .max()
        .unwrap_or(0);
    list.add(
        "all-reduce flattened bucket",
        BufferKind::GradientBuckets,
        s.dtypes.communication,
        largest_bucket,
        Device::Gpu,
        span(ticks.epilogue(), ticks.epilogue()),
    );
    if let Some(master) = layout.master_dtype {
        list.add(
            "fp32 master weights",
            BufferKind::MasterWeights,
            master,
            partition,
            Device::Gpu,
            Lifetime::Persistent,
        );
        // No persistent fp32 gradient buffer in bf16 either: without ZeRO, DeepSpeed 0.19.8
        // accumulates in the model dtype unless `data_types.grad_accum_dtype` says otherwise
        // (`get_data_types`; another dtype raises), and bf16 with bf16 accumulation takes its
        // fp16 optimizer wrapper (`DDP_BFLOAT16`): the master and states whole on every rank,
        // the fp32 gradients flattened for the step only (`_do_optimizer_sanity_check`).
        list.add(
            "fp32 gradients for the step",
            BufferKind::Fp32Gradients,
            master,
            layout.numel,
            Device::Gpu,
            span(ticks.first_optimizer(), step_end),
        );
    }
    for state in 0..s.optimizer.states {
        list.add(
            format!("optimizer state {state}"),
            BufferKind::OptimizerStates,
            s.dtypes.optimizer_states,
            partition,
            Device::Gpu,
            Lifetime::Steady,
        );
    }
}

fn host_device(target: &OffloadTarget) -> Device {
    match target {
        OffloadTarget::None => Device::Gpu,
        OffloadTarget::Cpu { .. } | OffloadTarget::Nvme { .. } => Device::Cpu,
    }
}

/// The IPG buffer(s): allocated at the first gradient hook (stages 1-2: DeepSpeed 0.19.8's
/// `setup_buckets`, called from `process_gradients`) or at initialisation (stage 3).
fn ipg(inputs: &BufferInputs<'_>, list: &mut BufferList, count: u64, lifetime: Lifetime) {
    let s = inputs.settings;
    for index in 0..count {
        list.add(
            format!("IPG bucket {index}"),
            BufferKind::GradientBuckets,
            s.dtypes.gradients,
            s.reduce_bucket_size,
            Device::Gpu,
            lifetime,
        );
    }
}

fn stage12(inputs: &BufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let partition = layout.partition_numel;
    let world = s.world_size;
    let step_end = ticks.last_optimizer();
    list.add(
        "flat 16-bit parameters (padded)",
        BufferKind::Parameters,
        s.dtypes.params,
        layout.padded_numel,
        Device::Gpu,
        Lifetime::Persistent,
    );
    let contiguous = s.gradient_storage == GradientStorage::Contiguous;
    let offloaded = s.offload_optimizer.is_offloaded();
    let stage1 = s.stage == ZeroStage::OptimizerStates;
    // Whole gradients: copied into the IPG bucket as they are produced (stage 2, contiguous),
    // or kept until their bucket is reduced.
    if !stage1 && contiguous {
        unit_gradients(inputs, list, BufferKind::ModuleGradients, |step| step);
    } else {
        let last_flush = last_flush_by_step(inputs);
        unit_gradients(inputs, list, BufferKind::Gradients, |step| last_flush[step]);
    }
    // After each flush: ZeRO-1 keeps the gradients of other ranks' partitions to the step;
    // this rank's share goes into grads_in_partition (contiguous), stays as the parameters'
    // gradients (not contiguous), or goes to the host (offload).
    let mut first_flush = ticks.epilogue();
    for bucket in &inputs.buckets.reduce {
        let tick = flush_tick(inputs, bucket.flush);
        first_flush = first_flush.min(tick);
        // The kept share is the bucket's own gradients, already counted up to the flush.
        let kept_from = (tick + 1).min(step_end);
        let own = bucket.numel / world;
        if stage1 {
            list.add(
                format!(
                    "gradients outside this rank's partition, bucket {}",
                    bucket.index
                ),
                BufferKind::Gradients,
                s.dtypes.gradients,
                bucket.numel - own,
                Device::Gpu,
                span(kept_from, step_end),
            );
        }
        if !contiguous && !offloaded {
            list.add(
                format!(
                    "gradients of this rank's partition, bucket {}",
                    bucket.index
                ),
                BufferKind::Gradients,
                s.dtypes.gradients,
                own,
                Device::Gpu,
                span(kept_from, step_end),
            );
        }
    }
    let accumulating = s.batch.gradient_accumulation_steps > 1 && !stage1;
    let kept = if accumulating {
        Lifetime::Steady
    } else {
        span(first_flush, step_end)
    };
    if contiguous {
        let count = if s.overlap == Overlap::Overlapped {
            2
        } else {
            1
        };
        ipg(
            inputs,
            list,
            count,
            span(ticks.first_gradient(), ticks.epilogue()),
        );
        if !offloaded {
            list.add(
                "grads_in_partition",
                BufferKind::Gradients,
                s.dtypes.gradients,
                partition,
                Device::Gpu,
                kept,
            );
            if s.dtypes.grad_accum != s.dtypes.gradients {
                list.add(
                    "averaged gradients (grad_accum_dtype)",
                    BufferKind::Gradients,
                    s.dtypes.grad_accum,
                    partition,
                    Device::Gpu,
                    if accumulating {
                        Lifetime::Steady
                    } else {
                        span(ticks.epilogue(), step_end)
                    },
                );
            }
        }
    }
    let device = host_device(&s.offload_optimizer);
    let pin_memory = s.offload_optimizer.pinning().unwrap_or(Pinning::Pinned);
    list.add(
        "master weight partition",
        BufferKind::MasterWeights,
        s.dtypes.master,
        partition,
        device,
        Lifetime::Persistent,
    );
    // The host master is always pinned; CPU Adam creates its states with zeros_like: pageable.
    list.pinned(Pinning::Pinned);
    for state in 0..s.optimizer.states {
        list.add(
            format!("optimizer state {state} partition"),
            BufferKind::OptimizerStates,
            s.dtypes.optimizer_states,
            partition,
            device,
            Lifetime::Steady,
        );
    }
    if device == Device::Gpu {
        list.add(
            "fp32 gradient partition for the step",
            BufferKind::Fp32Gradients,
            s.dtypes.master,
            partition,
            Device::Gpu,
            span(ticks.first_optimizer(), step_end),
        );
        return;
    }
    list.add(
        "fp32 gradient partition (host)",
        BufferKind::Fp32Gradients,
        s.dtypes.master,
        partition,
        Device::Cpu,
        Lifetime::Persistent,
    );
    list.pinned(pin_memory);
    if s.batch.gradient_accumulation_steps > 1 {
        list.add(
            "gradient accumulation buffer (host)",
            BufferKind::Gradients,
            s.dtypes.params,
            partition,
            Device::Cpu,
            Lifetime::Steady,
        );
        list.pinned(pin_memory);
    }
    let largest = inputs.model.largest_tensor();
    list.add(
        "offload device staging (largest tensor)",
        BufferKind::OffloadStaging,
        s.dtypes.params,
        largest,
        Device::Gpu,
        Lifetime::Persistent,
    );
    list.add(
        "offload host staging (largest tensor)",
        BufferKind::OffloadStaging,
        s.dtypes.params,
        largest,
        Device::Cpu,
        Lifetime::Persistent,
    );
    list.pinned(pin_memory);
}

fn stage3(inputs: &BufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let world = s.world_size;
    let partition = layout.partition_numel;
    let params = s.dtypes.params;
    stage3_parameters(inputs, list);
    // With one rank a parameter's partition is the whole parameter, and DeepSpeed 0.19.8
    // "gathers" it as a view of its partition (`_no_gather_coalesced`): no whole copies.
    // (DeepSpeed's stage-3 peaks at W = 1 on an H100 and an H200, 2026-11-27, minus the
    // steady state after a step, equal stage 1's to the megabyte.)
    let whole_copies = world > 1;
    if let Some(persistent) = inputs.shards.persistent.as_ref().filter(|_| whole_copies) {
        list.add(
            "persistent parameters (whole)",
            BufferKind::PersistentParameters,
            params,
            persistent.numel,
            Device::Gpu,
            Lifetime::Persistent,
        );
    }
    if let Some(schedule) = inputs.stage3.filter(|_| whole_copies) {
        for interval in &schedule.intervals {
            let tensor = &inputs.model.tensors[interval.tensor];
            list.add_named(
                || joined("gathered ", &tensor.name),
                BufferKind::GatheredParameters,
                params,
                tensor.numel.div_ceil(world) * world,
                Device::Gpu,
                span(ticks.trace(interval.from), ticks.trace(interval.to)),
            );
        }
    }
    if s.gradient_storage == GradientStorage::Contiguous {
        ipg(inputs, list, 1, Lifetime::Persistent);
        unit_gradients(inputs, list, BufferKind::ModuleGradients, |step| step);
    } else {
        let last_flush = last_flush_by_step(inputs);
        unit_gradients(inputs, list, BufferKind::ModuleGradients, |step| {
            last_flush[step]
        });
    }
    for bucket in &inputs.buckets.reduce {
        if bucket.collective == Collective::ReduceScatter {
            let tick = flush_tick(inputs, bucket.flush);
            list.add(
                format!("reduce-scatter staging, bucket {}", bucket.index),
                BufferKind::ReduceScatterStaging,
                s.dtypes.communication,
                bucket.bytes / s.dtypes.communication.bytes(),
                Device::Gpu,
                span(tick, tick),
            );
        }
    }
    let any_host = inputs
        .shards
        .sub_groups
        .iter()
        .any(|g| g.device != Device::Gpu);
    let grad_device = if any_host { Device::Cpu } else { Device::Gpu };
    let pin_memory = s.offload_optimizer.pinning().unwrap_or(Pinning::Pinned);
    list.add(
        "gradient partitions",
        BufferKind::Gradients,
        s.dtypes.grad_accum,
        partition,
        grad_device,
        Lifetime::Persistent,
    );
    list.pinned(pin_memory);
    stage3_optimizer(inputs, list);
}

/// Stage 3 parameter partitions: GPU, host, or host up to `max_in_cpu` and NVMe beyond.
fn stage3_parameters(inputs: &BufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let layout = inputs.layout;
    let params = s.dtypes.params;
    let partition = layout.partition_numel;
    let nvme_numel: u64 = layout
        .entries
        .iter()
        .filter(|e| {
            inputs
                .offload
                .nvme_resident
                .get(e.tensor)
                .copied()
                .unwrap_or(false)
        })
        .map(|e| e.partition_numel)
        .sum();
    match &s.offload_param {
        OffloadTarget::None => list.add(
            "parameter partitions",
            BufferKind::Parameters,
            params,
            partition,
            Device::Gpu,
            Lifetime::Persistent,
        ),
        OffloadTarget::Cpu { pinning } => {
            list.add(
                "parameter partitions (host)",
                BufferKind::Parameters,
                params,
                partition,
                Device::Cpu,
                Lifetime::Persistent,
            );
            list.pinned(*pinning);
        }
        OffloadTarget::Nvme {
            buffer_count,
            buffer_size,
            ..
        } => {
            list.add(
                "parameter partitions (host, up to max_in_cpu)",
                BufferKind::Parameters,
                params,
                partition - nvme_numel,
                Device::Cpu,
                Lifetime::Persistent,
            );
            list.pinned(Pinning::Pinned);
            list.add(
                "parameter partitions (NVMe)",
                BufferKind::Parameters,
                params,
                nvme_numel,
                Device::Nvme,
                Lifetime::Persistent,
            );
            list.add(
                "parameter swap buffers",
                BufferKind::ParamSwapBuffers,
                params,
                buffer_count * buffer_size,
                Device::Cpu,
                Lifetime::Persistent,
            );
            list.pinned(Pinning::Pinned);
        }
    }
}

/// Stage 3 master weights, optimizer states and fp32 gradients, sub-group by sub-group. On the
/// host the master is a plain `.float()` copy and CPU Adam's states come from `zeros_like`
/// (pageable); the host fp32 gradients are pinned with `pin_memory`.
fn stage3_optimizer(inputs: &BufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let master = s.dtypes.master;
    let pin_memory = s.offload_optimizer.pinning().unwrap_or(Pinning::Pinned);
    let mut largest_gpu_group = 0;
    let mut largest_nvme_group = 0;
    for group in &inputs.shards.sub_groups {
        let device = group.device;
        let numel = group.partition_numel;
        list.add(
            format!("sub-group {} master weights", group.index),
            BufferKind::MasterWeights,
            master,
            numel,
            device,
            Lifetime::Persistent,
        );
        for state in 0..s.optimizer.states {
            list.add(
                format!("sub-group {} optimizer state {state}", group.index),
                BufferKind::OptimizerStates,
                s.dtypes.optimizer_states,
                numel,
                device,
                // Swapped states are written to NVMe at start-up; others appear at the step.
                if device == Device::Nvme {
                    Lifetime::Persistent
                } else {
                    Lifetime::Steady
                },
            );
        }
        match device {
            Device::Gpu => {
                largest_gpu_group = largest_gpu_group.max(numel);
                let tick = ticks.optimizer(group.index);
                list.add(
                    format!(
                        "sub-group {} fp32 gradients (flatten and cast)",
                        group.index
                    ),
                    BufferKind::StepScratch,
                    master,
                    numel,
                    Device::Gpu,
                    span(tick, tick),
                );
            }
            Device::Cpu => {
                list.add(
                    format!("sub-group {} fp32 gradients (host)", group.index),
                    BufferKind::Fp32Gradients,
                    master,
                    numel,
                    Device::Cpu,
                    Lifetime::Persistent,
                );
                list.pinned(pin_memory);
            }
            Device::Nvme => {
                largest_nvme_group = largest_nvme_group.max(numel);
                list.add(
                    format!("sub-group {} fp32 gradients (NVMe)", group.index),
                    BufferKind::Fp32Gradients,
                    master,
                    numel,
                    Device::Nvme,
                    Lifetime::Persistent,
                );
            }
        }
    }
    list.add(
        "fp32 gradient buffer (largest sub-group)",
        BufferKind::Fp32Gradients,
        master,
        largest_gpu_group,
        Device::Gpu,
        span(ticks.first_optimizer(), ticks.last_optimizer()),
    );
    if let OffloadTarget::Nvme { buffer_count, .. } = s.offload_optimizer {
        list.add(
            "optimizer swap buffers",
            BufferKind::OptimizerSwapBuffers,
            Dtype::Fp32,
            buffer_count * largest_nvme_group,
            Device::Cpu,
            Lifetime::Persistent,
        );
        list.pinned(Pinning::Pinned);
    }
}
