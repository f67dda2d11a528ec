//! The execution plan: a resolved config and a model compiled into an explicit value.
//!
//! DeepSpeed decides its buffers, buckets and stage-3 fetch order at run time. [`compile`]
//! decides them ahead of time, in the same way, and returns them as a [`Plan`] that can be
//! printed, diffed, snapshot-tested and handed to the executor:
//!
//! | part | module |
//! |---|---|
//! | decided settings and diagnostics (fallbacks, refusals) | [`decide`], [`settings`] |
//! | the engine's behaviour: DeepSpeed's optimizer wrapper, what ranks hold, the norm and clip rule, the gradient average | [`run_policy`] |
//! | the run's loop: optimizer hyperparameters, precision and loss scaling, clipping threshold, LR schedule, NVMe swap directories (what dsplan's executors refuse) | [`training`] |
//! | the precision and the element type of every state (the one rule) | [`precision`] |
//! | tensors with shapes, fetch units in execution order | [`model_graph`] |
//! | offsets in the flat 16-bit and fp32 master buffers | [`layout`] |
//! | per-rank ownership rules, persistent set, sub-groups | [`shards`] |
//! | gradient buckets and their collectives, parameter all-gather | [`buckets`] |
//! | stage-3 fetch / prefetch / release schedule | [`stage3`] |
//! | offload copies | [`offload`], [`transfer`] |
//! | the moments of a step | [`ticks`] |
//! | every allocation, and the memory timeline | [`buffers`], [`activations`] (sizes from [`crate::memory`]), [`timeline`] |
//! | a lower bound of the GPU peak from the activations alone, without the rest of the plan | [`activation_floor`] |
//! | the same for dsplan's CPU executor ([`PlanBackend::DsplanCpu`]) | [`backend`], [`cpu_buffers`], [`cpu_units`] |
//! | the same for dsplan's CUDA executor ([`PlanBackend::DsplanCuda`]) | [`cuda_buffers`], [`cuda_world`], [`stage3_arena`] |
//! | its offload: device shares, host buffers, copies, host pre-flight | [`cuda_offload`] |
//! | what that executor holds on the GPU outside its buffers (context, workspace, modules, NCCL) | [`device_runtime`] |
//! | op graph, cost model, critical path, step time | [`graph`], [`cost`], [`cluster`] |
//! | Chrome trace of a step | [`trace`] |
//!
//! `planner::resolve` (defaults, `"auto"`, the batch triangle) runs before [`compile`]: its
//! output is the `DsConfig` given here; [`decide`] refuses any `"auto"` left. The script's side
//! of a run is a [`Workload`], derived per backend by [`Workload::for_backend`].

pub mod activation_floor;
pub mod activations;
pub mod assumed;
pub mod backend;
pub mod buckets;
pub mod buffers;
pub mod cluster;
pub mod cost;
pub mod cpu_buffers;
pub mod cpu_units;
pub mod cuda_buffers;
pub mod cuda_offload;
pub mod cuda_world;
pub mod decide;
pub mod device_runtime;
pub mod dtype;
pub mod grad_arena;
pub mod graph;
pub mod layout;
pub mod model_graph;
pub mod offload;
pub mod precision;
pub mod run_policy;
pub mod settings;
pub mod shards;
pub mod stage3;
pub mod stage3_arena;
pub mod ticks;
pub mod timeline;
pub mod trace;
pub mod training;
pub mod transfer;

use serde::Serialize;

pub use backend::PlanBackend;
pub use buckets::{Buckets, Collective};
pub use buffers::{Buffer, BufferClass, BufferKind, Lifetime};
pub use cluster::{Cluster, Hardware};
pub use decide::{AllGatherIntoTensor, Workload};
pub use device_runtime::DeviceRuntime;
pub use dtype::{Device, Dtype};
pub use graph::{OpGraph, Stream};
pub use layout::Layout;
pub use model_graph::{ModelGraph, ModelGraphError, UnitOrder};
pub use offload::Offload;
pub use run_policy::{ClipRule, DeepSpeedOptimizer, EngineFamily, GradientAveraging, RunPolicy};
pub use settings::{AttentionKernel, CheckpointPlacement, Checkpointing, Precision, Settings};
pub use shards::Shards;
pub use stage3::Stage3Schedule;
pub use ticks::{Phase, Ticks};
pub use timeline::Timeline;
pub use training::{LossScaling, OptimizerPolicy, Training};

use crate::config::DsConfig;
use crate::diagnostics::{Code, Diagnostic};

/// What the plan was compiled for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelSummary {
    /// Name.
    pub name: String,
    /// Trainable elements.
    pub total_params: u64,
    /// Parameter tensors.
    pub tensors: usize,
    /// Fetch units.
    pub units: usize,
    /// Whether units follow the real execution order.
    pub unit_order: UnitOrder,
}

/// The explicit execution plan of one training step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// The model.
    pub model: ModelSummary,
    /// The ranks and the cost model's rates.
    pub cluster: Cluster,
    /// Every decided setting.
    pub settings: Settings,
    /// How the engine runs: what the executor does beyond sizes and buckets.
    pub run: RunPolicy,
    /// Parameter layout.
    pub layout: Layout,
    /// Ownership.
    pub shards: Shards,
    /// Gradient buckets and the parameter all-gather.
    pub buckets: Buckets,
    /// Stage 3's fetch schedule.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage3: Option<Stage3Schedule>,
    /// Offload copies.
    pub offload: Offload,
    /// The moments of the step.
    pub ticks: Ticks,
    /// Every allocation of one rank.
    pub buffers: Vec<Buffer>,
    /// Memory over the step.
    pub timeline: Timeline,
    /// What the executor holds on each GPU outside [`Plan::buffers`] (dsplan's CUDA
    /// executor only: DeepSpeed's margins are the full estimate's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_runtime: Option<DeviceRuntime>,
    /// Ops, critical path and step time (`None` when compiled for memory only,
    /// [`compile_memory`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<OpGraph>,
    /// What the run's loop does around the engine: optimizer, loss scaling, clipping
    /// threshold, schedule ([`training::read`]; `None` when the plan was compiled without
    /// them, as for `estimate` and `recommend`, or when dsplan's executors could not run them
    /// and the backend is DeepSpeed's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub training: Option<Training>,
    /// Decisions and warnings.
    pub diagnostics: Vec<Diagnostic>,
    /// The model graph the plan was compiled from: its tensors are what the layout, the
    /// buckets and the stage-3 schedule index, so an executor reads them here (not shown by
    /// `dsplan plan`: it is the input, summarised in [`Plan::model`]).
    #[serde(skip)]
    pub model_graph: ModelGraph,
}

/// One device's peak memory split the way `dsplan estimate` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryRow {
    /// Device.
    pub device: Device,
    /// Model states live at the peak (parameters, gradients, fp32 gradients, master,
    /// optimizer states).
    pub model_states: u64,
    /// Runtime buffers live at the peak (buckets, gathered and persistent parameters, module
    /// gradients, scratch, staging, swap buffers).
    pub buffers: u64,
    /// Activations live at the peak.
    pub activations: u64,
    /// The peak (the sum of the three).
    pub peak: u64,
}

impl Plan {
    /// The plan with the run's [`Training`] (what [`training::read`] made of the same config).
    pub fn with_training(self, training: Training) -> Plan {
        Plan {
            training: Some(training),
            ..self
        }
    }

    /// What one GPU holds at the peak: the plan's buffers and, for dsplan's CUDA executor,
    /// its runtime (what `nvidia-smi` shows).
    pub fn device_total_bytes(&self) -> u64 {
        self.timeline.peak_bytes(Device::Gpu) + self.device_runtime.as_ref().map_or(0, |r| r.bytes)
    }

    /// The peak of each device split into model states, buffers and activations: the rows
    /// `dsplan estimate --config` prints, from the same buffer list the executor allocates.
    pub fn memory_rows(&self) -> Vec<MemoryRow> {
        self.timeline
            .devices
            .iter()
            .map(|device| {
                let mut row = MemoryRow {
                    device: device.device,
                    model_states: 0,
                    buffers: 0,
                    activations: 0,
                    peak: device.peak.bytes,
                };
                for part in &device.peak.breakdown {
                    match part.kind.class() {
                        BufferClass::ModelStates => row.model_states += part.bytes,
                        BufferClass::Buffers => row.buffers += part.bytes,
                        BufferClass::Activations => row.activations += part.bytes,
                    }
                }
                row
            })
            .collect()
    }
}

/// Compiles a resolved config for `model` on `cluster`. `Err` carries every diagnostic when
/// at least one is an error; `Ok` keeps the warnings and notes in [`Plan::diagnostics`].
pub fn compile(
    config: &DsConfig,
    model: &ModelGraph,
    cluster: &Cluster,
    workload: &Workload,
) -> Result<Plan, Vec<Diagnostic>> {
    compile_parts(config, model, cluster, workload, Parts::All)
}

/// [`compile`] without the op graph and its step time ([`Plan::graph`] is `None`): what the
/// memory estimate and `recommend` read, at a fraction of the cost.
pub fn compile_memory(
    config: &DsConfig,
    model: &ModelGraph,
    cluster: &Cluster,
    workload: &Workload,
) -> Result<Plan, Vec<Diagnostic>> {
    compile_parts(config, model, cluster, workload, Parts::Memory)
}

/// Which parts of a plan to compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parts {
    /// Everything.
    All,
    /// Everything but the op graph.
    Memory,
}

fn compile_parts(
    config: &DsConfig,
    model: &ModelGraph,
    cluster: &Cluster,
    workload: &Workload,
    parts: Parts,
) -> Result<Plan, Vec<Diagnostic>> {
    let (settings, mut diagnostics) = decide::decide(config, model, cluster, workload);
    let Some(settings) = settings else {
        return Err(diagnostics);
    };
    let run = RunPolicy::new(config, &settings);
    match settings.backend {
        PlanBackend::DsplanCpu => {
            cpu_buffers::check_cpu_backend(model, &settings, &mut diagnostics);
        }
        PlanBackend::DsplanCuda => {
            cuda_buffers::check_cuda_backend(model, &settings, &run, &mut diagnostics);
            cuda_offload::check::check_offload(config, &settings, &mut diagnostics);
        }
        PlanBackend::DeepspeedGpu => {}
    }
    if model.unit_order == UnitOrder::ParameterOrder {
        diagnostics.push(Diagnostic::info(
            Code::IneffectiveAtStage,
            "",
            format!(
                "dsplan does not model `{}`'s modules op by op: shapes are flat, execution order and FLOPs are approximations",
                model.architecture.family.model_type()
            ),
        ));
    }
    let layout = Layout::new(model, &settings);
    let shards = Shards::new(&layout, &settings);
    let persistent_entries: Vec<usize> = shards
        .persistent
        .as_ref()
        .map(|p| p.entries.clone())
        .unwrap_or_default();
    let nvme = offload::nvme_resident(&layout, &settings, &persistent_entries, model.tensors.len());
    check_swap_buffers(&layout, &settings, &nvme, &mut diagnostics);
    if diagnostics.iter().any(Diagnostic::is_error) {
        return Err(diagnostics);
    }
    let mut buckets = buckets::buckets(model, &layout, &settings, &run);
    if cuda_world::partitions_gradients(&settings) {
        buckets.gradient_arena = Some(grad_arena::place_gradients(model, &buckets.reduce));
    }
    let stage3 = match (&settings.stage3, &shards.persistent) {
        (Some(s3), Some(persistent)) => {
            let mut schedule = stage3::schedule(model, &layout, persistent, s3, &nvme);
            // One GPU gathers into an arena only when the parameters live on the host.
            if settings.backend == PlanBackend::DsplanCuda
                && (settings.world_size > 1 || settings.offload_param.is_offloaded())
            {
                let tensors: Vec<usize> = persistent
                    .entries
                    .iter()
                    .filter_map(|&e| layout.entries.get(e).map(|e| e.tensor))
                    .collect();
                schedule.arena = Some(stage3_arena::Stage3Arena::place(
                    model,
                    (&schedule.intervals, schedule.steps.len()),
                    &tensors,
                    &stage3_arena::fused_reads(model),
                ));
            }
            Some(schedule)
        }
        _ => None,
    };
    let ticks = Ticks::new(model, shards.sub_groups.len());
    let offload = offload::plan_offload(
        &settings,
        &layout,
        &shards,
        &buckets,
        stage3.as_ref(),
        &ticks,
        nvme,
    );
    let buffers = match settings.backend {
        PlanBackend::DeepspeedGpu => buffers::buffers(&buffers::BufferInputs {
            model,
            settings: &settings,
            layout: &layout,
            shards: &shards,
            buckets: &buckets,
            stage3: stage3.as_ref(),
            offload: &offload,
            ticks: &ticks,
        }),
        PlanBackend::DsplanCpu => cpu_buffers::cpu_buffers(&cpu_buffers::CpuBufferInputs {
            model,
            settings: &settings,
            layout: &layout,
            shards: &shards,
            buckets: &buckets,
            ticks: &ticks,
            nvme_resident: &offload.nvme_resident,
            run: &run,
        }),
        PlanBackend::DsplanCuda => cuda_buffers::cuda_buffers(
            model,
            &settings,
            &cuda_world::CudaShares::new(&settings, &layout, &shards, &buckets, stage3.as_ref()),
            &cuda_offload::host::HostInputs {
                settings: &settings,
                layout: &layout,
                shards: &shards,
                nvme_resident: &offload.nvme_resident,
            },
        ),
    };
    let timeline = Timeline::new(&buffers, &ticks);
    let device_runtime = (settings.backend == PlanBackend::DsplanCuda)
        .then(|| DeviceRuntime::of_rank(settings.world_size));
    let graph = (parts == Parts::All).then(|| {
        graph::op_graph(&graph::GraphInputs {
            model,
            settings: &settings,
            cluster,
            layout: &layout,
            shards: &shards,
            buckets: &buckets,
            stage3: stage3.as_ref(),
        })
    });
    Ok(Plan {
        model: ModelSummary {
            name: model.name.clone(),
            total_params: model.total_params(),
            tensors: model.tensors.len(),
            units: model.units.len(),
            unit_order: model.unit_order,
        },
        cluster: *cluster,
        settings,
        run,
        layout,
        shards,
        buckets,
        stage3,
        offload,
        ticks,
        buffers,
        timeline,
        device_runtime,
        graph,
        training: None,
        diagnostics,
        model_graph: model.clone(),
    })
}

/// NVMe parameter offload: every swapped partition must be smaller than `buffer_size`
/// (DeepSpeed: "More elements N than buffer size M").
fn check_swap_buffers(
    layout: &Layout,
    settings: &Settings,
    nvme: &[bool],
    found: &mut Vec<Diagnostic>,
) {
    let settings::OffloadTarget::Nvme { buffer_size, .. } = settings.offload_param else {
        return;
    };
    let largest = layout
        .entries
        .iter()
        .filter(|e| nvme.get(e.tensor).copied().unwrap_or(false))
        .max_by_key(|e| e.partition_numel);
    if let Some(entry) = largest
        && entry.partition_numel >= buffer_size
    {
        found.push(
                Diagnostic::error(
                    Code::OutOfRange,
                    "/zero_optimization/offload_param/buffer_size",
                    format!(
                        "`{}`'s partition has {} elements, more than the swap buffer_size {buffer_size} (DeepSpeed fails: \"More elements than buffer size\")",
                        entry.name, entry.partition_numel
                    ),
                )
                .with_help(format!("set offload_param.buffer_size above {}", entry.partition_numel)),
            );
    }
}
