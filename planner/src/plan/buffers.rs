//! [`Buffer`]: every allocation the executor makes for a step, with its size, device and
//! lifetime. The memory timeline ([`super::timeline`]) is their sum tick by tick, and
//! `dsplan estimate --config` reads its model-state and buffer rows from the same list
//! ([`super::Plan::memory_rows`]), so estimate and allocator cannot drift apart.
//!
//! Sizes follow deepspeed-facts §1.7 and §4: the flat 16-bit buffer padded to 2·N (stages 1/2),
//! one or two IPG buffers of `reduce_bucket_size` elements (two with `overlap_comm` in stages
//! 1/2, allocated whole even when the model is smaller), `grads_in_partition` (stages 1/2 with
//! contiguous gradients), the fp32 master and optimizer-state partitions, the fp32 gradient
//! partition built at the step, offload staging buffers, stage 3's gathered parameters (one
//! buffer per gathered interval, full padded size), persistent parameters and the NVMe swap
//! pools. Activations come from [`super::activations::activation_sizes`].

use serde::Serialize;

use super::activations::activation_sizes;
use super::buckets::{Buckets, FlushPoint, gradient_order};
use super::dtype::{Device, Dtype};
use super::layout::Layout;
use super::model_graph::{ModelGraph, UnitKind};
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
    /// Stage 3 parameters kept whole on every rank.
    PersistentParameters,
    /// Gradients (whole tensors or this rank's partition).
    Gradients,
    /// The master weights the optimizer updates.
    MasterWeights,
    /// Optimizer states.
    OptimizerStates,
    /// Gradient buckets (IPG) and reduction scratch.
    GradientBuckets,
    /// Stage 3 parameters gathered for a module.
    GatheredParameters,
    /// Scratch of the optimizer step (fp32 gradient partitions).
    StepScratch,
    /// Offload staging and NVMe swap buffers.
    OffloadStaging,
    /// Activations kept for backward.
    Activations,
}

impl BufferKind {
    /// Whether this is model state (DeepSpeed's estimators' scope) rather than a runtime
    /// buffer or activations.
    pub fn is_model_state(self) -> bool {
        matches!(
            self,
            BufferKind::Parameters
                | BufferKind::PersistentParameters
                | BufferKind::Gradients
                | BufferKind::MasterWeights
                | BufferKind::OptimizerStates
        )
    }

    /// Display name.
    pub fn as_str(self) -> &'static str {
        match self {
            BufferKind::Parameters => "parameters",
            BufferKind::PersistentParameters => "persistent parameters",
            BufferKind::Gradients => "gradients",
            BufferKind::MasterWeights => "master weights",
            BufferKind::OptimizerStates => "optimizer states",
            BufferKind::GradientBuckets => "gradient buckets",
            BufferKind::GatheredParameters => "gathered parameters",
            BufferKind::StepScratch => "step scratch",
            BufferKind::OffloadStaging => "offload staging",
            BufferKind::Activations => "activations",
        }
    }
}

/// When a buffer exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "lifetime", rename_all = "kebab-case")]
pub enum Lifetime {
    /// Allocated at start-up, kept for the whole run.
    Persistent,
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
            Lifetime::Persistent => true,
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
struct List {
    buffers: Vec<Buffer>,
}

impl List {
    fn add(
        &mut self,
        name: impl Into<String>,
        kind: BufferKind,
        dtype: Dtype,
        numel: u64,
        device: Device,
        lifetime: Lifetime,
    ) {
        if numel == 0 {
            return;
        }
        self.buffers.push(Buffer {
            name: name.into(),
            kind,
            dtype,
            numel,
            bytes: numel * dtype.bytes(),
            device,
            pinning: None,
            lifetime,
        });
    }

    fn pinned(&mut self, pinning: Pinning) {
        if let Some(last) = self.buffers.last_mut()
            && last.device == Device::Cpu
        {
            last.pinning = Some(pinning);
        }
    }
}

/// Every buffer of one step.
pub fn buffers(inputs: &BufferInputs<'_>) -> Vec<Buffer> {
    let mut list = List {
        buffers: Vec::new(),
    };
    let s = inputs.settings;
    match s.stage {
        ZeroStage::Disabled => stage0(inputs, &mut list),
        ZeroStage::OptimizerStates | ZeroStage::Gradients => stage12(inputs, &mut list),
        ZeroStage::Weights => stage3(inputs, &mut list),
    }
    activations(inputs, &mut list);
    list.buffers
}

fn span(first: usize, last: usize) -> Lifetime {
    Lifetime::Ticks {
        first,
        last: last.max(first),
    }
}

/// Gradients of each backward step's ready tensors, live from their tick to `end(step)`.
/// Stages 0 and 1 accumulate whole gradients over micro-steps: with accumulation they are
/// live from tick 0 of the boundary micro-step.
fn unit_gradients(inputs: &BufferInputs<'_>, list: &mut List, end: impl Fn(usize) -> usize) {
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
        list.add(
            format!("gradients of {}", inputs.model.units[unit].module),
            BufferKind::Gradients,
            s.dtypes.gradients,
            numel,
            Device::Gpu,
            span(first, end(step)),
        );
    }
}

/// The tick at which a tensor's bucket is flushed.
fn flush_ticks(inputs: &BufferInputs<'_>) -> Vec<usize> {
    let mut at = vec![inputs.ticks.epilogue(); inputs.model.tensors.len()];
    for bucket in &inputs.buckets.reduce {
        let tick = match bucket.flush {
            FlushPoint::BackwardStep { step } => inputs.ticks.trace(step),
            FlushPoint::Epilogue => inputs.ticks.epilogue(),
        };
        for &t in &bucket.tensors {
            at[t] = tick;
        }
    }
    at
}

fn stage0(inputs: &BufferInputs<'_>, list: &mut List) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let numel = inputs.layout.numel;
    list.add(
        "parameters",
        BufferKind::Parameters,
        s.dtypes.params,
        numel,
        Device::Gpu,
        Lifetime::Persistent,
    );
    let step_end = ticks.last_optimizer();
    unit_gradients(inputs, list, |_| step_end);
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
    if inputs.layout.master_dtype.is_some() {
        list.add(
            "fp32 master weights",
            BufferKind::MasterWeights,
            s.dtypes.master,
            numel,
            Device::Gpu,
            Lifetime::Persistent,
        );
        list.add(
            "fp32 gradients for the step",
            BufferKind::StepScratch,
            Dtype::Fp32,
            numel,
            Device::Gpu,
            span(ticks.first_optimizer(), step_end),
        );
    }
    for state in 0..s.optimizer.states {
        list.add(
            format!("optimizer state {state}"),
            BufferKind::OptimizerStates,
            s.dtypes.optimizer_states,
            numel,
            Device::Gpu,
            Lifetime::Persistent,
        );
    }
}

fn host_device(target: &OffloadTarget) -> (Device, Option<Pinning>) {
    match target {
        OffloadTarget::None => (Device::Gpu, None),
        OffloadTarget::Cpu { pinning } => (Device::Cpu, Some(*pinning)),
        OffloadTarget::Nvme { .. } => (Device::Nvme, None),
    }
}

fn ipg(inputs: &BufferInputs<'_>, list: &mut List, count: u64) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let first = if s.stage == ZeroStage::OptimizerStates && s.overlap == Overlap::Serialized {
        ticks.epilogue()
    } else {
        ticks.first_backward()
    };
    for index in 0..count {
        list.add(
            format!("IPG bucket {index}"),
            BufferKind::GradientBuckets,
            s.dtypes.gradients,
            s.reduce_bucket_size,
            Device::Gpu,
            span(first, ticks.epilogue()),
        );
    }
}

fn stage12(inputs: &BufferInputs<'_>, list: &mut List) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let partition = layout.partition_numel;
    list.add(
        "flat 16-bit parameters (padded)",
        BufferKind::Parameters,
        s.dtypes.params,
        layout.padded_numel,
        Device::Gpu,
        Lifetime::Persistent,
    );
    let contiguous = s.gradient_storage == GradientStorage::Contiguous;
    let flush = flush_ticks(inputs);
    if s.stage == ZeroStage::OptimizerStates || !contiguous {
        // Whole gradients until their bucket is reduced (ZeRO-1: at the boundary).
        let order = gradient_order(inputs.model);
        let mut last_flush = vec![0usize; 2 * ticks.units + 1];
        for (tensor, step) in &order {
            last_flush[*step] = last_flush[*step].max(flush[*tensor]);
        }
        unit_gradients(inputs, list, |step| last_flush[step]);
    } else {
        unit_gradients(inputs, list, |step| step);
    }
    if contiguous {
        let count = if s.overlap == Overlap::Overlapped {
            2
        } else {
            1
        };
        ipg(inputs, list, count);
        list.add(
            "grads_in_partition",
            BufferKind::Gradients,
            s.dtypes.gradients,
            partition,
            Device::Gpu,
            Lifetime::Persistent,
        );
    }
    let (device, pinning) = host_device(&s.offload_optimizer);
    list.add(
        "master weight partition",
        BufferKind::MasterWeights,
        s.dtypes.master,
        partition,
        device,
        Lifetime::Persistent,
    );
    list.pinned(Pinning::Pinned);
    for state in 0..s.optimizer.states {
        list.add(
            format!("optimizer state {state} partition"),
            BufferKind::OptimizerStates,
            s.dtypes.optimizer_states,
            partition,
            device,
            Lifetime::Persistent,
        );
        list.pinned(Pinning::Pinned);
    }
    if device == Device::Gpu {
        list.add(
            "fp32 gradient partition for the step",
            BufferKind::StepScratch,
            Dtype::Fp32,
            partition,
            Device::Gpu,
            span(ticks.first_optimizer(), ticks.last_optimizer()),
        );
    } else {
        list.add(
            "fp32 gradient partition (host)",
            BufferKind::Gradients,
            Dtype::Fp32,
            partition,
            Device::Cpu,
            Lifetime::Persistent,
        );
        if let Some(pin) = pinning {
            list.pinned(pin);
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
    }
}

fn stage3(inputs: &BufferInputs<'_>, list: &mut List) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let world = s.world_size;
    let partition = layout.partition_numel;
    let params = s.dtypes.params;
    // Parameter partitions: GPU, host, or host up to max_in_cpu and NVMe beyond.
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
                BufferKind::OffloadStaging,
                params,
                buffer_count * buffer_size,
                Device::Cpu,
                Lifetime::Persistent,
            );
            list.pinned(Pinning::Pinned);
        }
    }
    if let Some(persistent) = &inputs.shards.persistent {
        list.add(
            "persistent parameters (whole)",
            BufferKind::PersistentParameters,
            params,
            persistent.numel,
            Device::Gpu,
            Lifetime::Persistent,
        );
    }
    if let Some(schedule) = inputs.stage3 {
        for interval in &schedule.intervals {
            let tensor = &inputs.model.tensors[interval.tensor];
            list.add(
                format!("gathered {}", tensor.name),
                BufferKind::GatheredParameters,
                params,
                tensor.numel.div_ceil(world) * world,
                Device::Gpu,
                span(ticks.trace(interval.from), ticks.trace(interval.to)),
            );
        }
    }
    let contiguous = s.gradient_storage == GradientStorage::Contiguous;
    if contiguous {
        ipg(inputs, list, 1);
        unit_gradients(inputs, list, |step| step);
    } else {
        let flush = flush_ticks(inputs);
        let order = gradient_order(inputs.model);
        let mut last_flush = vec![0usize; 2 * ticks.units + 1];
        for (tensor, step) in &order {
            last_flush[*step] = last_flush[*step].max(flush[*tensor]);
        }
        unit_gradients(inputs, list, |step| last_flush[step]);
    }
    let any_host = inputs
        .shards
        .sub_groups
        .iter()
        .any(|g| g.device != Device::Gpu);
    let grad_device = if any_host { Device::Cpu } else { Device::Gpu };
    list.add(
        "gradient partitions",
        BufferKind::Gradients,
        s.dtypes.grad_accum,
        partition,
        grad_device,
        Lifetime::Persistent,
    );
    let pin = match s.offload_optimizer {
        OffloadTarget::Cpu { pinning } => pinning,
        _ => Pinning::Pinned,
    };
    list.pinned(pin);
    let states = s.optimizer.states;
    let mut largest_gpu_group = 0;
    let mut largest_host_group = 0;
    for group in &inputs.shards.sub_groups {
        let device = group.device;
        let resident = if device == Device::Nvme {
            Device::Nvme
        } else {
            device
        };
        list.add(
            format!("sub-group {} master weights", group.index),
            BufferKind::MasterWeights,
            s.dtypes.master,
            group.partition_numel,
            resident,
            Lifetime::Persistent,
        );
        list.pinned(Pinning::Pinned);
        for state in 0..states {
            list.add(
                format!("sub-group {} optimizer state {state}", group.index),
                BufferKind::OptimizerStates,
                s.dtypes.optimizer_states,
                group.partition_numel,
                resident,
                Lifetime::Persistent,
            );
            list.pinned(Pinning::Pinned);
        }
        if device == Device::Gpu {
            largest_gpu_group = largest_gpu_group.max(group.partition_numel);
            list.add(
                format!(
                    "sub-group {} fp32 gradients (flatten and cast)",
                    group.index
                ),
                BufferKind::StepScratch,
                Dtype::Fp32,
                group.partition_numel,
                Device::Gpu,
                span(ticks.optimizer(group.index), ticks.optimizer(group.index)),
            );
        } else {
            largest_host_group = largest_host_group.max(group.partition_numel);
        }
    }
    let step_span = span(ticks.first_optimizer(), ticks.last_optimizer());
    list.add(
        "fp32 gradient buffer (largest sub-group)",
        BufferKind::StepScratch,
        Dtype::Fp32,
        largest_gpu_group,
        Device::Gpu,
        step_span,
    );
    list.add(
        "fp32 gradient buffer (largest host sub-group)",
        BufferKind::StepScratch,
        Dtype::Fp32,
        largest_host_group,
        Device::Cpu,
        step_span,
    );
    list.pinned(Pinning::Pinned);
    if let OffloadTarget::Nvme { buffer_count, .. } = s.offload_optimizer {
        let largest = inputs
            .shards
            .sub_groups
            .iter()
            .map(|g| g.partition_numel)
            .max()
            .unwrap_or(0);
        list.add(
            "optimizer swap buffers",
            BufferKind::OffloadStaging,
            Dtype::Fp32,
            buffer_count * largest,
            Device::Cpu,
            Lifetime::Persistent,
        );
        list.pinned(Pinning::Pinned);
    }
}

fn activations(inputs: &BufferInputs<'_>, list: &mut List) {
    let s = inputs.settings;
    let model = inputs.model;
    let ticks = inputs.ticks;
    let units = ticks.units;
    let sizes = activation_sizes(&model.architecture, &s.batch, s.dtypes.params, s.recompute);
    let backward_tick = |unit: usize| ticks.trace(2 * units - 1 - unit);
    let dtype = s.dtypes.params;
    let elements = |bytes: u64| bytes / dtype.bytes();
    // Blocks: first and last unit of each layer.
    let mut blocks: Vec<(u64, usize, usize)> = Vec::new();
    for (index, unit) in model.units.iter().enumerate() {
        if let Some(layer) = unit.layer {
            match blocks.last_mut() {
                Some((l, _, last)) if *l == layer => *last = index,
                _ => blocks.push((layer, index, index)),
            }
        }
    }
    if let Some(&(_, first_block_unit, _)) = blocks.first() {
        let embedding_first = model
            .units
            .iter()
            .position(|u| u.kind == UnitKind::Embedding)
            .unwrap_or(0);
        list.add(
            "embedding output",
            BufferKind::Activations,
            dtype,
            elements(sizes.embedding),
            Device::Gpu,
            span(
                ticks.trace(embedding_first),
                backward_tick(first_block_unit),
            ),
        );
    }
    for &(layer, first, last) in &blocks {
        list.add(
            format!("block {layer} activations"),
            BufferKind::Activations,
            dtype,
            elements(sizes.per_block_kept),
            Device::Gpu,
            span(ticks.trace(first), backward_tick(first)),
        );
        list.add(
            format!("block {layer} recomputed activations"),
            BufferKind::Activations,
            dtype,
            elements(sizes.per_block_recomputed),
            Device::Gpu,
            span(backward_tick(last), backward_tick(first)),
        );
    }
    if let Some(head) = model.units.iter().position(|u| u.kind == UnitKind::LmHead) {
        list.add(
            "logits and loss input",
            BufferKind::Activations,
            dtype,
            elements(sizes.logits),
            Device::Gpu,
            span(ticks.trace(head), backward_tick(head)),
        );
    }
}
