//! dsplan's full memory estimate: every term of a training step, per GPU and per node, per
//! phase.
//!
//! DeepSpeed's estimators ([`super::deepspeed`]) count parameters, gradients and optimizer
//! states only. The full estimate adds what users meet on top of them (research/peers.md §5:
//! "the estimate said 0.5 GB, I see 14 GB"): communication buckets, ZeRO-3's gathered and
//! persistent parameters, step temporaries, activations with and without checkpointing, the
//! logits and loss buffers, offload staging and swap buffers, CUDA context, fragmentation and
//! the initialisation transients. Every term is a named [`Row`] with its formula; each row
//! has its bytes in the four [`Phase`]s (init, forward, backward, step).
//!
//! The model states, buffers and activations are not computed here: the estimate compiles the
//! execution plan ([`crate::plan::compile`]) and reads them from its buffer list and timeline
//! ([`plan_rows`]), the list the executor allocates. Only what the plan does not model is
//! added here:
//!
//! | module | terms |
//! |---|---|
//! | [`config_reading`] | a `ds_config.json`, resolved ([`crate::resolve`]), and the [`TrainingSetup`] it describes |
//! | [`plan_config`], [`plan_rows`] | the plan's workload, a setup's config; the plan's buffers as rows |
//! | [`overhead`] | CUDA context, fragmentation, host processes, model load, unpartitioned model |
//! | [`states`] | where the optimizer's elements live (for the cost model), the ZeRO paper's model states |
//!
//! Each phase's total is the plan's peak of that phase plus the margins.

pub mod config_reading;
pub mod context;
pub mod model_dims;
pub mod overhead;
pub mod plan_config;
pub mod plan_rows;
pub mod rows;
pub mod setup;
pub mod states;

pub use config_reading::{ConfigReading, Overrides, SetupError, read_config};
pub use context::Context;
pub use model_dims::{ModelDims, ShapeOrigin};
pub use overhead::{BadMargin, Margins};
pub use rows::{Category, Device, Phase, PhaseBytes, Pinning, Row, Term};
pub use setup::{
    AttentionKernel, CheckpointPlacement, Checkpointing, MAX_SHAPE_DIMENSION, OffloadOptimizer,
    OffloadParam, OptimizerModel, Precision, TrainingSetup, TrainingShape, ZeroSetup,
};

use crate::config::{DsConfig, OffloadDevice, ZeroStage};
use crate::diagnostics::{Diagnostic, Severity};
use crate::model::{LmHead, ModelSpec};
use crate::plan::{self, Cluster, ModelGraph, Plan};
use serde::Serialize;
use std::fmt;

use super::deepspeed::{
    self, DeepSpeedRow, Zero3Options, estimate_zero2_model_states_mem_needs,
    estimate_zero3_model_states_mem_needs,
};
use super::topology::{BufferFactor, Topology};

/// Totals of each phase, by device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Per GPU.
    pub gpu: PhaseBytes,
    /// Host memory per node, pinned and pageable.
    pub cpu: PhaseBytes,
    /// The pinned part of `cpu`.
    pub cpu_pinned: PhaseBytes,
    /// NVMe per node.
    pub nvme: PhaseBytes,
}

/// The largest phase of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Peak {
    /// Which phase.
    pub phase: Phase,
    /// Its bytes.
    pub bytes: u64,
}

/// The peaks of every device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Peaks {
    /// Per GPU.
    pub gpu: Peak,
    /// Host memory per node.
    pub cpu: Peak,
    /// NVMe per node.
    pub nvme: Peak,
}

/// dsplan's full estimate of one configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FullEstimate {
    /// The model as the estimate read it.
    pub model: ModelDims,
    /// The cluster.
    pub hardware: Topology,
    /// The training shape.
    pub shape: TrainingShape,
    /// Precision, optimizer, ZeRO and offload.
    pub setup: TrainingSetup,
    /// The runtime margins.
    pub margins: Margins,
    /// Every term.
    pub rows: Vec<Row>,
    /// Phase totals.
    pub totals: Totals,
    /// Peaks.
    pub peaks: Peaks,
    /// DeepSpeed's estimator for the same stage and offload (stages 2-3; buffer factor 1.5),
    /// to reconcile the two.
    pub deepspeed: Option<DeepSpeedRow>,
    /// Assumptions made on the way.
    pub notes: Vec<String>,
}

/// Why a full estimate could not be made.
#[derive(Debug, Clone, PartialEq)]
pub enum FullEstimateError {
    /// The sequence length or micro-batch is 0 or above [`MAX_SHAPE_DIMENSION`].
    BadShape {
        /// `sequence length` or `micro-batch`.
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// A margin is out of range.
    Margin(BadMargin),
    /// The model cannot be planned (its architecture is invalid).
    Model(String),
    /// The config is refused by the planner, as DeepSpeed would refuse it: its errors.
    Refused(Vec<Diagnostic>),
}

impl fmt::Display for FullEstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FullEstimateError::BadShape { what, value } => write!(
                f,
                "the {what} must be between 1 and {MAX_SHAPE_DIMENSION}, not {value}"
            ),
            FullEstimateError::Margin(error) => error.fmt(f),
            FullEstimateError::Model(message) => write!(f, "{message}"),
            FullEstimateError::Refused(diagnostics) => {
                write!(f, "the plan refuses this config: {}", errors(diagnostics))
            }
        }
    }
}

/// The errors among `diagnostics`, each with its JSON pointer, on one line.
fn errors(diagnostics: &[Diagnostic]) -> String {
    let errors: Vec<String> = diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| {
            if d.pointer.is_empty() {
                d.message.clone()
            } else {
                format!("{} ({})", d.message, d.pointer)
            }
        })
        .collect();
    errors.join("; ")
}

impl std::error::Error for FullEstimateError {}

/// The full estimate of training `model` on `hardware` with `setup` and `shape` (a setup built
/// in code: its config is written out by [`plan_config::setup_document`]).
pub fn estimate_full(
    model: &ModelSpec,
    hardware: Topology,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    margins: &Margins,
) -> Result<FullEstimate, FullEstimateError> {
    let document = plan_config::setup_document(setup, shape, hardware.total_gpus());
    let config = crate::config::from_value(&document).map_err(|message| {
        FullEstimateError::Refused(vec![Diagnostic::error(
            crate::diagnostics::Code::WrongType,
            "",
            message,
        )])
    })?;
    estimate_config(
        &Prepared::of(model),
        hardware,
        setup,
        shape,
        margins,
        &config,
    )
}

/// A model's plan graph and dimensions, derived once and shared by the estimates of many
/// configs of the same model (as `recommend` makes them): both are a pass over every tensor,
/// and a deep model has hundreds of thousands.
#[derive(Debug)]
pub struct Prepared<'a> {
    /// The model.
    pub model: &'a ModelSpec,
    /// Its plan graph, or why it has none (reported by each estimate, as when unshared).
    pub graph: Result<ModelGraph, FullEstimateError>,
    /// Its dimensions.
    pub dims: ModelDims,
}

impl<'a> Prepared<'a> {
    /// The graph and dimensions of `model`.
    pub fn of(model: &'a ModelSpec) -> Prepared<'a> {
        Prepared {
            model,
            graph: ModelGraph::for_estimate(model).map_err(|e| FullEstimateError::Model(e.0)),
            dims: ModelDims::from_spec(model),
        }
    }
}

/// The full estimate of the config `reading` was read from (its notes are added).
pub fn estimate_reading(
    model: &ModelSpec,
    hardware: Topology,
    reading: &ConfigReading,
    shape: &TrainingShape,
    margins: &Margins,
) -> Result<FullEstimate, FullEstimateError> {
    estimate_prepared(&Prepared::of(model), hardware, reading, shape, margins)
}

/// [`estimate_reading`] of a [`Prepared`] model: the same estimate, without deriving the
/// model's graph and dimensions again.
pub fn estimate_prepared(
    prepared: &Prepared<'_>,
    hardware: Topology,
    reading: &ConfigReading,
    shape: &TrainingShape,
    margins: &Margins,
) -> Result<FullEstimate, FullEstimateError> {
    let mut estimate = estimate_config(
        prepared,
        hardware,
        &reading.setup,
        shape,
        margins,
        &reading.config,
    )?;
    estimate.notes.extend(reading.notes.iter().cloned());
    Ok(estimate)
}

/// Compiles the memory plan (no op graph) of the resolved `config` for `model`, with the
/// setup's `zero.Init` and the shape's sequence and activations.
pub fn compile_plan(
    model: &ModelSpec,
    hardware: Topology,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    config: &DsConfig,
) -> Result<Plan, FullEstimateError> {
    let graph = ModelGraph::for_estimate(model).map_err(|e| FullEstimateError::Model(e.0))?;
    compile_graph(&graph, hardware, setup, shape, config)
}

/// [`compile_plan`] of a [`Prepared`] model.
pub fn compile_prepared(
    prepared: &Prepared<'_>,
    hardware: Topology,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    config: &DsConfig,
) -> Result<Plan, FullEstimateError> {
    let graph = prepared.graph.as_ref().map_err(Clone::clone)?;
    compile_graph(graph, hardware, setup, shape, config)
}

/// [`compile_plan`] of a model's graph.
fn compile_graph(
    graph: &ModelGraph,
    hardware: Topology,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    config: &DsConfig,
) -> Result<Plan, FullEstimateError> {
    let cluster = Cluster::new(hardware.total_gpus(), hardware.gpus_per_node())
        .map_err(FullEstimateError::Model)?;
    plan::compile_memory(
        config,
        graph,
        &cluster,
        &plan_config::workload(config, setup, shape),
    )
    .map_err(FullEstimateError::Refused)
}

fn estimate_config(
    prepared: &Prepared<'_>,
    hardware: Topology,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    margins: &Margins,
    config: &DsConfig,
) -> Result<FullEstimate, FullEstimateError> {
    for (what, value) in [
        ("sequence length", shape.seq_len),
        ("micro-batch", shape.micro_batch),
    ] {
        if value == 0 || value > MAX_SHAPE_DIMENSION {
            return Err(FullEstimateError::BadShape { what, value });
        }
    }
    margins.check().map_err(FullEstimateError::Margin)?;
    let model = prepared.model;
    let plan = compile_prepared(prepared, hardware, setup, shape, config)?;
    let dims = prepared.dims.clone();
    let ctx = Context {
        model: &dims,
        setup,
        shape,
        hardware,
    };
    let mut rows = plan_rows::plan_rows(&plan, &ctx);
    rows.extend(overhead::overhead_rows(&ctx, margins));
    let fragmentation = overhead::fragmentation_row(&rows, margins);
    rows.push(fragmentation);

    let totals = totals(&rows);
    let peak = |bytes: PhaseBytes| {
        let (phase, bytes) = bytes.peak();
        Peak { phase, bytes }
    };
    let peaks = Peaks {
        gpu: peak(totals.gpu),
        cpu: peak(totals.cpu),
        nvme: peak(totals.nvme),
    };
    let mut notes = Vec::new();
    if dims.shape_origin == ShapeOrigin::AssumedFromCount {
        notes.push(format!(
            "no architecture is known: a GPT-3-shaped decoder of {} layers, width {} and MLP width {} is assumed for the buffers and activations",
            dims.layers.self_attention_layers, dims.layers.hidden, dims.layers.intermediate
        ));
    }
    if model
        .lm_head
        .is_some_and(|head| head.choice == LmHead::Exclude && head.extra_params > 0)
    {
        notes.push(
            "the LM head's parameters are not counted (--lm-head include counts them); its logits are"
                .to_owned(),
        );
    }
    notes.extend(
        plan.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Warning)
            .map(|d| format!("plan: {}", d.message)),
    );
    Ok(FullEstimate {
        deepspeed: deepspeed_row(model, hardware, setup),
        model: dims,
        hardware,
        shape: *shape,
        setup: setup.clone(),
        margins: *margins,
        rows,
        totals,
        peaks,
        notes,
    })
}

fn totals(rows: &[Row]) -> Totals {
    let sum = |keep: &dyn Fn(Device) -> bool| {
        rows.iter()
            .filter(|row| keep(row.device))
            .fold(PhaseBytes::default(), |acc, row| acc.plus(row.bytes))
    };
    Totals {
        gpu: sum(&|d| d == Device::Gpu),
        cpu: sum(&Device::is_cpu),
        cpu_pinned: sum(&|d| d == Device::CpuPinned),
        nvme: sum(&|d| d == Device::Nvme),
    }
}

/// DeepSpeed's estimator row for the same stage and offload, when it has one.
fn deepspeed_row(
    model: &ModelSpec,
    hardware: Topology,
    setup: &TrainingSetup,
) -> Option<DeepSpeedRow> {
    let device = |offloaded: bool| {
        if offloaded {
            deepspeed::OffloadDevice::Cpu
        } else {
            deepspeed::OffloadDevice::None
        }
    };
    let zero = &setup.zero;
    let factor = BufferFactor::DEEPSPEED_DEFAULT;
    match zero.stage {
        ZeroStage::Gradients => {
            let offload = device(zero.offload_optimizer.device != OffloadDevice::None);
            let needs = estimate_zero2_model_states_mem_needs(
                model.total_params,
                hardware,
                offload,
                factor,
            )
            .ok()?;
            Some(DeepSpeedRow {
                stage: 2,
                offload_optimizer: offload,
                offload_param: None,
                zero_init: None,
                cpu_bytes: needs.cpu_bytes,
                gpu_bytes: needs.gpu_bytes,
            })
        }
        ZeroStage::Weights => {
            let options = Zero3Options {
                offload_optimizer: device(zero.optimizer_offloaded()),
                offload_param: device(zero.params_offloaded()),
                zero_init: setup.zero_init,
            };
            let needs = estimate_zero3_model_states_mem_needs(
                model.total_params,
                model.largest_layer.params,
                hardware,
                options,
                factor,
            )
            .ok()?;
            Some(DeepSpeedRow {
                stage: 3,
                offload_optimizer: options.offload_optimizer,
                offload_param: Some(options.offload_param),
                zero_init: Some(options.zero_init),
                cpu_bytes: needs.cpu_bytes,
                gpu_bytes: needs.gpu_bytes,
            })
        }
        ZeroStage::Disabled | ZeroStage::OptimizerStates => None,
    }
}
