//! [`decide`]: from a resolved config, a model and a cluster to [`Settings`], with a diagnostic
//! for every option that is refused, ignored or changed.
//!
//! DeepSpeed makes several of these decisions silently at run time (deepspeed-facts §3.3,
//! §9.3): `offload_param` below stage 3 is ignored, optimizer `nvme` offload below stage 3
//! runs as `cpu`, CPU offload forces `contiguous_gradients`, NCCL's `all_gather_into_tensor`
//! makes `allgather_bucket_size` moot, stage 0 reduces in fixed 5e8-element buckets. Here each
//! one is a setting plus a warning or note kept in the plan.
//!
//! The input must be resolved: `"auto"` anywhere is an error (`planner::resolve` fills
//! defaults, `"auto"` and the batch triangle). A config given unresolved (`dsplan plan`) has its
//! missing batch key derived by the one solver, [`crate::validate::batch::derive`]; its
//! precision and dtypes come from the one rule, [`super::precision`].

use serde_json::Value;

use super::backend::PlanBackend;
use super::cluster::Cluster;
use super::model_graph::ModelGraph;
use super::settings::{
    AttentionKernel, Batch, CheckpointPlacement, Checkpointing, FlatOrder, GradientStorage,
    OffloadStepping, OffloadTarget, OptimizerChoice, Overlap, ParamGatherMode, Pinning, Precision,
    ReduceTiming, Settings, Stage3Settings,
};
use crate::config::registry::AUTO_KEYS;
use crate::config::{
    DsConfig, GradientAllreduceOp, OffloadDevice, OffloadOptimizerConfig, OffloadParamConfig,
    ZeroConfig, ZeroStage,
};
use crate::diagnostics::{Code, Diagnostic};
use crate::estimate::ZeroInit;
use crate::memory::{MAX_SHAPE_DIMENSION, states_per_param};
use crate::validate::batch::{self, GivenBatch};

/// DeepSpeed's stage-0 all-reduce bucket (`MEMORY_OPT_ALLREDUCE_SIZE`), in elements.
pub const STAGE0_ALLREDUCE_BUCKET: u64 = 500_000_000;

/// What the training script decides, beyond the config. Build it with
/// `Workload { field: ..., ..Workload::default() }`: fields may be added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Tokens per sample; `None` takes the model's context length (2048 without one).
    pub sequence_length: Option<u64>,
    /// Activation checkpointing (gradient checkpointing) of the transformer layers.
    pub checkpointing: Checkpointing,
    /// Where full checkpointing keeps the layer inputs (`activation_checkpointing.cpu_checkpointing`).
    pub checkpoint_placement: CheckpointPlacement,
    /// The attention kernel (FlashAttention stores no score matrix).
    pub attention: AttentionKernel,
    /// Whether stage 3 builds the model under `zero.Init` (the Hugging Face Trainer does).
    pub zero_init: ZeroInit,
    /// Whether the collective backend has `all_gather_into_tensor` (NCCL does).
    pub all_gather_into_tensor: AllGatherIntoTensor,
    /// The runtime whose buffers the plan lists.
    pub backend: PlanBackend,
}

impl Default for Workload {
    /// The model's context length, no checkpointing, eager attention, `zero.Init`, NCCL,
    /// DeepSpeed's GPU buffers.
    fn default() -> Workload {
        Workload {
            sequence_length: None,
            checkpointing: Checkpointing::None,
            checkpoint_placement: CheckpointPlacement::Gpu,
            attention: AttentionKernel::Eager,
            zero_init: ZeroInit::Enabled,
            all_gather_into_tensor: AllGatherIntoTensor::Available,
            backend: PlanBackend::DeepspeedGpu,
        }
    }
}

impl Workload {
    /// The workload of a run on `backend` of `config`, the one place a command derives it
    /// from: the backend's buffers and collectives (the CPU executor's in-process collectives
    /// have no `all_gather_into_tensor`; NCCL has), and full checkpointing's inputs where
    /// `activation_checkpointing.cpu_checkpointing` puts them. What the script decides beyond the
    /// config (sequence length, checkpointing, attention, `zero.Init`) keeps its default; set
    /// it with `Workload { field: ..., ..Workload::for_backend(backend, config) }`.
    pub fn for_backend(backend: PlanBackend, config: &DsConfig) -> Workload {
        Workload {
            checkpoint_placement: if config.activation_checkpointing.cpu_checkpointing {
                CheckpointPlacement::Cpu
            } else {
                CheckpointPlacement::Gpu
            },
            all_gather_into_tensor: match backend {
                PlanBackend::DeepspeedGpu | PlanBackend::DsplanCuda => {
                    AllGatherIntoTensor::Available
                }
                PlanBackend::DsplanCpu => AllGatherIntoTensor::Unavailable,
            },
            backend,
            ..Workload::default()
        }
    }
}

/// Whether the collective backend offers `all_gather_into_tensor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllGatherIntoTensor {
    /// NCCL and recent gloo: one collective gathers the whole flat buffer.
    #[default]
    Available,
    /// Older backends: DeepSpeed gathers in `allgather_bucket_size` shards.
    Unavailable,
}

/// Decides every setting. `Err` holds the diagnostics when one of them is an error.
pub fn decide(
    config: &DsConfig,
    model: &ModelGraph,
    cluster: &Cluster,
    workload: &Workload,
) -> (Option<Settings>, Vec<Diagnostic>) {
    let mut found = unresolved(config);
    if !found.is_empty() {
        return (None, found);
    }
    let zero = &config.zero_optimization;
    let stage = zero.stage;
    let precision = precision(config, &mut found);
    let batch = batch(config, model, cluster.world_size, workload, &mut found);
    let dtypes = super::precision::dtypes(config, precision, stage);
    let optimizer = optimizer(config, &mut found);
    let offload_optimizer = offload_optimizer(zero, &mut found);
    let offload_param = offload_param(zero, &mut found);
    ignored_at_stage(zero, &mut found);
    unmodelled(config, &mut found);
    refused(config, &mut found);
    let reduce_timing = match stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => ReduceTiming::AccumulationBoundary,
        ZeroStage::Gradients | ZeroStage::Weights => ReduceTiming::EveryMicroStep,
    };
    let overlap = if stage != ZeroStage::Disabled && zero.overlap_comm_resolved() {
        Overlap::Overlapped
    } else {
        Overlap::Serialized
    };
    let gradient_storage = gradient_storage(zero, &offload_optimizer, &mut found);
    let param_gather = param_gather(zero, cluster, workload, &mut found);
    let reduce_bucket_size = match stage {
        ZeroStage::Disabled => STAGE0_ALLREDUCE_BUCKET,
        _ => zero.reduce_bucket_size.value().map_or(1, |v| v.get()),
    };
    let flat_order = if zero.round_robin_gradients
        && matches!(stage, ZeroStage::OptimizerStates | ZeroStage::Gradients)
    {
        FlatOrder::RoundRobin
    } else {
        FlatOrder::Model
    };
    let stage3 = (stage == ZeroStage::Weights)
        .then(|| stage3_settings(zero, workload.zero_init, cluster.world_size));
    let Some(batch) = batch else {
        return (None, found);
    };
    if found.iter().any(Diagnostic::is_error) {
        return (None, found);
    }
    let settings = Settings {
        stage,
        world_size: cluster.world_size,
        batch,
        checkpointing: workload.checkpointing,
        checkpoint_placement: workload.checkpoint_placement,
        attention: workload.attention,
        zero_init: workload.zero_init,
        precision,
        dtypes,
        optimizer,
        reduce_bucket_size,
        allgather_bucket_size: zero.allgather_bucket_size.get(),
        reduce_timing,
        overlap,
        gradient_storage,
        reduce_scatter: zero.reduce_scatter,
        multi_rank_bucket_allreduce: zero.use_multi_rank_bucket_allreduce,
        flat_order,
        param_gather,
        offload_ratio: zero
            .offload_optimizer
            .as_ref()
            .map_or(1.0, |o| o.ratio.clamp(0.0, 1.0)),
        offload_stepping: match zero.offload_optimizer.as_ref() {
            Some(o) if o.super_offload && offload_optimizer.is_offloaded() => {
                OffloadStepping::Speculative
            }
            _ => OffloadStepping::Exact,
        },
        offload_optimizer,
        offload_param,
        stage3,
        backend: workload.backend,
    };
    (Some(settings), found)
}

/// An error for every `"auto"` still in the config.
fn unresolved(config: &DsConfig) -> Vec<Diagnostic> {
    let Ok(value) = serde_json::to_value(config) else {
        return vec![Diagnostic::error(
            Code::NeedsResolution,
            "",
            "the config could not be read back as JSON",
        )];
    };
    AUTO_KEYS
        .iter()
        .filter(|pointer| value.pointer(pointer).and_then(Value::as_str) == Some("auto"))
        .map(|pointer| {
            Diagnostic::error(
                Code::NeedsResolution,
                *pointer,
                format!("`{pointer}` is still \"auto\"; a plan needs a concrete value"),
            )
            .with_help("run `dsplan resolve` first, or write the value")
        })
        .collect()
}

/// The precision ([`super::precision::precision`]); both fp16 and bf16 is an error.
fn precision(config: &DsConfig, found: &mut Vec<Diagnostic>) -> Precision {
    super::precision::precision(config).unwrap_or_else(|_| {
        found.push(Diagnostic::error(
            Code::ConflictingPrecision,
            "/bf16/enabled",
            "fp16 and bf16 are both enabled (DeepSpeed asserts)",
        ));
        Precision::Fp16
    })
}

/// The batch triangle (train_batch_size = micro × accumulation × world size), solved by
/// DeepSpeed's derivation ([`batch::derive`]); what it refuses is reported as validation
/// reports it ([`batch::check`]).
fn batch(
    config: &DsConfig,
    model: &ModelGraph,
    world: u64,
    workload: &Workload,
    found: &mut Vec<Diagnostic>,
) -> Option<Batch> {
    let keys = [
        (batch::TRAIN_BATCH, &config.train_batch_size),
        (batch::MICRO_BATCH, &config.train_micro_batch_size_per_gpu),
        (batch::GRAD_ACCUM, &config.gradient_accumulation_steps),
    ]
    .map(|(pointer, key)| {
        (
            pointer,
            key.as_ref().and_then(|v| v.value()).map(|v| v.get()),
        )
    });
    let [(_, train), (_, micro), (_, accumulation)] = keys;
    let given = GivenBatch {
        train: train.map(i128::from),
        micro: micro.map(i128::from),
        accumulation: accumulation.map(i128::from),
    };
    let solved = batch::derive(given, i128::from(world))
        .ok()
        .and_then(|solved| {
            Some((
                u64::try_from(solved.micro).ok()?,
                u64::try_from(solved.accumulation).ok()?,
            ))
        });
    let Some((micro, accumulation)) = solved else {
        let written: serde_json::Map<String, Value> = keys
            .iter()
            .filter_map(|(pointer, value)| Some((pointer[1..].to_owned(), Value::from((*value)?))))
            .collect();
        let mut errors = batch::check(&Value::Object(written), Some(world));
        if errors.is_empty() {
            errors.push(Diagnostic::error(
                Code::BatchSizeMismatch,
                batch::TRAIN_BATCH,
                format!("the batch sizes do not add up at world size {world}"),
            ));
        }
        found.extend(errors);
        return None;
    };
    let sequence_length = workload
        .sequence_length
        .or(model.architecture.positions)
        .unwrap_or(2048)
        .max(1);
    for (what, value, pointer) in [
        ("sequence length", sequence_length, ""),
        ("micro-batch", micro, "/train_micro_batch_size_per_gpu"),
    ] {
        if value > MAX_SHAPE_DIMENSION {
            found.push(Diagnostic::error(
                Code::OutOfRange,
                pointer,
                format!("the {what} {value} is above dsplan's limit of {MAX_SHAPE_DIMENSION}"),
            ));
            return None;
        }
    }
    Some(Batch {
        micro_batch: micro,
        gradient_accumulation_steps: accumulation,
        train_batch_size: micro * accumulation * world,
        sequence_length,
    })
}

/// State tensors per parameter of the optimizers DeepSpeed builds.
fn optimizer(config: &DsConfig, found: &mut Vec<Diagnostic>) -> OptimizerChoice {
    let Some(name) = config.optimizer.as_ref().and_then(|o| o.kind.clone()) else {
        found.push(Diagnostic::info(
            Code::MissingKey,
            "/optimizer",
            "no optimizer section: the plan assumes the script passes AdamW (2 states per parameter)",
        ));
        return OptimizerChoice {
            name: "AdamW (assumed)".into(),
            states: 2,
        };
    };
    let empty = serde_json::Map::new();
    let params = config
        .optimizer
        .as_ref()
        .map_or(&empty, |o| &o.params.other);
    let states = states_per_param(&name, params).unwrap_or_else(|| {
        found.push(Diagnostic::info(
            Code::UnknownOptimizer,
            "/optimizer/type",
            format!("the plan does not know `{name}`'s state; it assumes 2 tensors per parameter, as Adam"),
        ));
        2
    });
    OptimizerChoice { name, states }
}

fn pinning(pin: bool) -> Pinning {
    Pinning::from_flag(pin)
}

fn offload_optimizer(zero: &ZeroConfig, found: &mut Vec<Diagnostic>) -> OffloadTarget {
    let legacy = zero.cpu_offload == Some(true);
    let given = zero.offload_optimizer.clone().or_else(|| {
        legacy.then(|| OffloadOptimizerConfig {
            device: OffloadDevice::Cpu,
            ..OffloadOptimizerConfig::default()
        })
    });
    let Some(offload) = given else {
        return OffloadTarget::None;
    };
    const POINTER: &str = "/zero_optimization/offload_optimizer/device";
    match (zero.stage, offload.device) {
        (_, OffloadDevice::None) => OffloadTarget::None,
        (ZeroStage::Disabled, _) => {
            found.push(Diagnostic::warning(
                Code::IneffectiveAtStage,
                POINTER,
                "optimizer offload needs ZeRO stage 1, 2 or 3; at stage 0 DeepSpeed ignores it and the plan keeps the optimizer on the GPU",
            ));
            OffloadTarget::None
        }
        (ZeroStage::OptimizerStates | ZeroStage::Gradients, OffloadDevice::Nvme) => {
            found.push(
                Diagnostic::warning(
                    Code::IneffectiveAtStage,
                    POINTER,
                    "stages 1 and 2 treat optimizer offload to nvme as cpu (nvme_path is ignored); the plan offloads to the CPU",
                )
                .with_help("use stage 3 for NVMe optimizer offload, or write \"cpu\""),
            );
            OffloadTarget::Cpu {
                pinning: pinning(offload.pin_memory),
            }
        }
        (_, OffloadDevice::Cpu) => OffloadTarget::Cpu {
            pinning: pinning(offload.pin_memory),
        },
        (ZeroStage::Weights, OffloadDevice::Nvme) => match &offload.nvme_path {
            Some(path) => OffloadTarget::Nvme {
                path: path.clone(),
                pinning: pinning(offload.pin_memory),
                buffer_count: offload.buffer_count.get(),
                buffer_size: 0,
                max_in_cpu: 0,
            },
            None => {
                found.push(Diagnostic::error(
                    Code::NvmeWithoutPath,
                    "/zero_optimization/offload_optimizer/nvme_path",
                    "optimizer offload to nvme without nvme_path (DeepSpeed fails joining the path)",
                ));
                OffloadTarget::None
            }
        },
    }
}

fn offload_param(zero: &ZeroConfig, found: &mut Vec<Diagnostic>) -> OffloadTarget {
    let legacy = zero.cpu_offload_param == Some(true);
    let given = zero.offload_param.clone().or_else(|| {
        legacy.then(|| OffloadParamConfig {
            device: OffloadDevice::Cpu,
            ..OffloadParamConfig::default()
        })
    });
    let Some(offload) = given else {
        return OffloadTarget::None;
    };
    const POINTER: &str = "/zero_optimization/offload_param/device";
    if offload.device == OffloadDevice::None {
        return OffloadTarget::None;
    }
    if zero.stage != ZeroStage::Weights {
        found.push(Diagnostic::warning(
            Code::IneffectiveAtStage,
            POINTER,
            format!(
                "parameter offload works only with ZeRO stage 3; stage {} silently ignores it and the plan keeps parameters on the GPU",
                zero.stage.number()
            ),
        ));
        return OffloadTarget::None;
    }
    match (offload.device, &offload.nvme_path) {
        (OffloadDevice::Nvme, Some(path)) => OffloadTarget::Nvme {
            path: path.clone(),
            pinning: pinning(offload.pin_memory),
            buffer_count: offload.buffer_count.get(),
            buffer_size: offload.buffer_size.get(),
            max_in_cpu: offload.max_in_cpu.get(),
        },
        (OffloadDevice::Nvme, None) => {
            found.push(Diagnostic::error(
                Code::NvmeWithoutPath,
                "/zero_optimization/offload_param/nvme_path",
                "parameter offload to nvme without nvme_path (DeepSpeed asserts in zero.Init)",
            ));
            OffloadTarget::None
        }
        _ => OffloadTarget::Cpu {
            pinning: pinning(offload.pin_memory),
        },
    }
}

fn gradient_storage(
    zero: &ZeroConfig,
    offload_optimizer: &OffloadTarget,
    found: &mut Vec<Diagnostic>,
) -> GradientStorage {
    let stage12 = matches!(
        zero.stage,
        ZeroStage::OptimizerStates | ZeroStage::Gradients
    );
    if zero.contiguous_gradients {
        GradientStorage::Contiguous
    } else if stage12 && offload_optimizer.is_offloaded() {
        found.push(Diagnostic::info(
            Code::IneffectiveAtStage,
            "/zero_optimization/contiguous_gradients",
            "CPU offload forces contiguous_gradients on in stages 1 and 2",
        ));
        GradientStorage::Contiguous
    } else {
        GradientStorage::PerParameter
    }
}

fn param_gather(
    zero: &ZeroConfig,
    cluster: &Cluster,
    workload: &Workload,
    found: &mut Vec<Diagnostic>,
) -> ParamGatherMode {
    let stage12 = matches!(
        zero.stage,
        ZeroStage::OptimizerStates | ZeroStage::Gradients
    );
    match workload.all_gather_into_tensor {
        AllGatherIntoTensor::Unavailable => ParamGatherMode::Sharded,
        AllGatherIntoTensor::Available => {
            let default = ZeroConfig::default().allgather_bucket_size;
            if stage12 && cluster.world_size > 1 && zero.allgather_bucket_size != default {
                found.push(Diagnostic::info(
                    Code::IneffectiveAtStage,
                    "/zero_optimization/allgather_bucket_size",
                    "allgather_bucket_size is unused: NCCL's all_gather_into_tensor gathers the whole flat buffer in one collective",
                ));
            }
            ParamGatherMode::IntoTensor
        }
    }
}

/// Stage 3's knobs. Under `zero.Init` DeepSpeed divides `stage3_model_persistence_threshold`
/// by the world size (deepspeed-facts §4.6).
fn stage3_settings(zero: &ZeroConfig, zero_init: ZeroInit, world: u64) -> Stage3Settings {
    let value =
        |v: &crate::config::AutoOr<crate::config::NonNegativeInt>| v.value().map_or(0, |v| v.get());
    Stage3Settings {
        prefetch_bucket_size: value(&zero.prefetch_bucket_size),
        param_persistence_threshold: value(&zero.param_persistence_threshold),
        model_persistence_threshold: zero.model_persistence_threshold.map_or(
            i64::MAX as u64,
            |v| match zero_init {
                ZeroInit::Enabled => v.get() / world.max(1),
                ZeroInit::Disabled => v.get(),
            },
        ),
        max_live_parameters: zero.max_live_parameters.get(),
        max_reuse_distance: zero.max_reuse_distance.get(),
        sub_group_size: zero.sub_group_size.get().max(1),
        fetch_with_all_reduce: zero.use_all_reduce_for_fetch_params,
    }
}

/// Notes for settings given a non-default value at a stage that does not read them.
fn ignored_at_stage(zero: &ZeroConfig, found: &mut Vec<Diagnostic>) {
    let default = ZeroConfig::default();
    let stage = zero.stage;
    let mut note = |differs: bool, key: &str, needs: &str| {
        if differs {
            found.push(Diagnostic::info(
                Code::IneffectiveAtStage,
                format!("/zero_optimization/{key}"),
                format!(
                    "`{key}` has no effect at ZeRO stage {} ({needs})",
                    stage.number()
                ),
            ));
        }
    };
    if stage != ZeroStage::Weights {
        let needs = "stage 3 only";
        note(
            zero.prefetch_bucket_size != default.prefetch_bucket_size,
            "stage3_prefetch_bucket_size",
            needs,
        );
        note(
            zero.param_persistence_threshold != default.param_persistence_threshold,
            "stage3_param_persistence_threshold",
            needs,
        );
        note(
            zero.max_live_parameters != default.max_live_parameters,
            "stage3_max_live_parameters",
            needs,
        );
        note(
            zero.max_reuse_distance != default.max_reuse_distance,
            "stage3_max_reuse_distance",
            needs,
        );
        note(
            zero.sub_group_size != default.sub_group_size,
            "sub_group_size",
            needs,
        );
    }
    if stage == ZeroStage::Disabled {
        let needs = "stage 0 all-reduces in fixed 5e8-element buckets after backward";
        note(
            zero.reduce_bucket_size != default.reduce_bucket_size,
            "reduce_bucket_size",
            needs,
        );
        note(zero.overlap_comm.is_some(), "overlap_comm", needs);
    }
    if stage == ZeroStage::Weights {
        note(
            zero.round_robin_gradients,
            "round_robin_gradients",
            "stages 1 and 2 only",
        );
    }
}

/// Warnings for features the plan does not model (the executor cannot run them either).
fn unmodelled(config: &DsConfig, found: &mut Vec<Diagnostic>) {
    let zero = &config.zero_optimization;
    let mut warn = |active: bool, pointer: &str, what: &str| {
        if active {
            found.push(Diagnostic::warning(
                Code::IncompatibleSettings,
                pointer,
                format!("{what} is not modelled by dsplan's plan: its buffers and collectives are missing from it"),
            ));
        }
    };
    warn(
        zero.zero_hpz_partition_size.get() > 1,
        "/zero_optimization/zero_hpz_partition_size",
        "ZeRO++ hierarchical partitioning (hpZ)",
    );
    warn(
        zero.zero_quantized_weights,
        "/zero_optimization/zero_quantized_weights",
        "ZeRO++ weight quantization (qwZ)",
    );
    warn(
        zero.zero_quantized_gradients,
        "/zero_optimization/zero_quantized_gradients",
        "ZeRO++ gradient quantization (qgZ)",
    );
    warn(
        zero.zenflow.is_some(),
        "/zero_optimization/zenflow",
        "ZenFlow",
    );
    warn(
        config.tensor_parallel.autotp_size.get() > 1,
        "/tensor_parallel/autotp_size",
        "tensor parallelism",
    );
    warn(
        !config.pipeline.is_empty(),
        "/pipeline",
        "pipeline parallelism",
    );
    warn(
        config.sequence_parallel_size.is_some_and(|s| s.get() > 1),
        "/sequence_parallel_size",
        "sequence parallelism",
    );
}

/// Errors for combinations DeepSpeed refuses at start-up.
fn refused(config: &DsConfig, found: &mut Vec<Diagnostic>) {
    let zero = &config.zero_optimization;
    let stage = zero.stage;
    let mut refuse = |refused: bool, pointer: &str, message: &str| {
        if refused {
            found.push(Diagnostic::error(
                Code::IncompatibleSettings,
                pointer,
                message,
            ));
        }
    };
    let partitions_grads = stage >= ZeroStage::Gradients;
    refuse(
        partitions_grads && zero.reduce_scatter && config.gradient_predivide_factor != 1.0,
        "/gradient_predivide_factor",
        "gradient_predivide_factor != 1.0 is not supported by ZeRO-2/3 with reduce_scatter (DeepSpeed asserts)",
    );
    refuse(
        partitions_grads && zero.reduce_scatter && config.prescale_gradients,
        "/prescale_gradients",
        "prescale_gradients is not supported by ZeRO-2/3 with reduce_scatter (DeepSpeed asserts)",
    );
    refuse(
        stage < ZeroStage::Weights
            && zero
                .offload_optimizer
                .as_ref()
                .is_some_and(|o| o.ratio < 1.0),
        "/zero_optimization/offload_optimizer/ratio",
        "partial offloading (ratio < 1) is only supported with ZeRO stage 3",
    );
    refuse(
        stage == ZeroStage::Weights && config.gradient_allreduce_op == GradientAllreduceOp::Sum,
        "/gradient_allreduce_op",
        "gradient_allreduce_op \"sum\" is not supported with ZeRO stage 3",
    );
    refuse(
        matches!(stage, ZeroStage::OptimizerStates | ZeroStage::Gradients)
            && !zero.allgather_bucket_size.get().is_multiple_of(2),
        "/zero_optimization/allgather_bucket_size",
        "allgather_bucket_size must be a multiple of 2 (nccl_start_alignment_factor) in stages 1 and 2",
    );
    refuse(
        zero.legacy_stage1,
        "/zero_optimization/legacy_stage1",
        "the deprecated ZeRO stage 1 (legacy_stage1) is not supported by DeepSpeed >= 0.5.9",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Architecture, Embeddings, Family};
    use serde_json::json;

    fn decided(config: Value, world: u64) -> (Option<Settings>, Vec<Diagnostic>) {
        let arch = Architecture {
            family: Family::Gpt2,
            layers: 1,
            hidden: 8,
            heads: 2,
            kv_heads: 2,
            head_dim: 4,
            intermediate: 32,
            vocab: 16,
            positions: Some(8),
            embeddings: Embeddings::Tied,
        };
        let graph = ModelGraph::from_architecture("gpt2", &arch).expect("graph");
        let cluster = Cluster::new(world, world).expect("cluster");
        let config = crate::config::from_value(&config).expect("typed");
        decide(&config, &graph, &cluster, &Workload::default())
    }

    #[test]
    fn the_batch_triangle_is_validations_solver() {
        let (settings, _) = decided(
            json!({"train_batch_size": 64, "gradient_accumulation_steps": 2}),
            4,
        );
        let batch = settings.expect("solved").batch;
        assert_eq!(
            (batch.micro_batch, batch.gradient_accumulation_steps),
            (8, 2)
        );
        let (settings, found) = decided(
            json!({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2}),
            4,
        );
        assert!(settings.is_none());
        let error = found.iter().find(|d| d.is_error()).expect("an error");
        assert_eq!(error.code, Code::BatchSizeMismatch);
        assert!(
            error.message.contains("DeepSpeed derives"),
            "{}",
            error.message
        );
        let (_, found) = decided(json!({}), 1);
        assert!(found.iter().any(|d| d.code == Code::BatchSizeMissing));
    }

    #[test]
    fn each_backend_has_one_workload() {
        let config = crate::config::from_value(
            &json!({"activation_checkpointing": {"cpu_checkpointing": true}}),
        )
        .expect("typed");
        let cpu = Workload::for_backend(PlanBackend::DsplanCpu, &config);
        assert_eq!(cpu.all_gather_into_tensor, AllGatherIntoTensor::Unavailable);
        assert_eq!(cpu.checkpoint_placement, CheckpointPlacement::Cpu);
        for backend in [PlanBackend::DeepspeedGpu, PlanBackend::DsplanCuda] {
            let workload = Workload::for_backend(backend, &DsConfig::default());
            assert_eq!(workload.backend, backend);
            assert_eq!(
                workload.all_gather_into_tensor,
                AllGatherIntoTensor::Available
            );
            assert_eq!(workload.checkpoint_placement, CheckpointPlacement::Gpu);
        }
    }
}
