//! The buffer list of the `dsplan-cpu` backend ([`super::PlanBackend::DsplanCpu`]): exactly the
//! buffers dsplan's CPU executor allocates on one rank, with their lifetimes over the step's
//! [`Ticks`], so that the executor's measured peaks (per category and in total) equal the
//! plan's timeline to the byte.
//!
//! Every rank is a thread of one process that computes in `f32` and exchanges `f32` buffers
//! through in-process collectives; everything lives in host memory ([`Device::Cpu`], pageable)
//! but what stage 3 swaps to files under `nvme_path` ([`Device::Nvme`]: the fp32 master and
//! Adam's states sub-group by sub-group, the parameter slices past `max_in_cpu`), read and
//! written through swap buffers in host memory. Nothing is staged between devices otherwise. Every size comes from the plan's layout,
//! shards, buckets and fetch units. `Ψ'` is the layout's padded flat buffer, `P` its partition,
//! `H` a rank's stage 3 shard (`Σ⌈numel/W⌉`), `O` what the rank's optimizer owns (the layout's
//! partition: `Ψ`, `P`, `P`, `H` by stage), `W` the ranks.
//!
//! The stage below is the plan's engine stage ([`super::run_policy`]), the config's.
//!
//! | buffer | size | lifetime |
//! |---|---|---|
//! | parameters | `Ψ'` (stages 0-2), `H` (3; less its NVMe slices), model dtype | run |
//! | parameters on NVMe | stage 3, `offload_param.device: nvme`: the slices past `max_in_cpu` ([`Device::Nvme`]) | run |
//! | parameter swap buffers | stage 3, `offload_param.device: nvme`: `buffer_count × buffer_size` of the model dtype, whether or not a slice is on NVMe | run |
//! | persistent parameters | the persistent tensors whole (stage 3), model dtype | run |
//! | master weights | `O` in `f32` when the parameters are not the master (all but fp32 stage 0); on [`Device::Nvme`] under `offload_optimizer.device: nvme` | run |
//! | optimizer states | `O` in `f32` per state (Adam: two); on [`Device::Nvme`] under `offload_optimizer.device: nvme` | run (allocated at start-up) |
//! | optimizer swap buffers | stage 3, `offload_optimizer.device: nvme`: `buffer_count ×` the largest sub-group, `f32` | run |
//! | accumulated gradients | `Ψ'` (stages 0-1), `P` (2), `H` (3), `grad_accum_dtype` | run |
//! | gradient bucket | stage 2: the largest planned bucket; stage 3: `W ×` its largest per-rank part, and the reduce-scatter output of one part; `f32` | run |
//! | activation arena | [`crate::memory::cpu_arena`], `f32`; with full activation checkpointing, each block's input and one shared working set ([`Recompute::EachLayer`]) | run |
//! | gathered parameters, fetch staging, unit gradients | per unit, see [`super::cpu_units`] | forward / backward |
//! | boundary all-reduce bucket | stages 0-1: the largest planned bucket that is not reduced in place (16-bit accumulation, or tensors not contiguous in the flat buffer), `f32` | epilogue |
//! | step scratch | `O` in `f32`, the owned gradients the optimizer steps with, when there is a master | optimizer step |
//! | parameter all-gather staging | stages 1-2: the partition (fp32, one whole piece: input only), else the largest planned piece as input and `W ×` it as output, `f32` | parameter all-gather |
//! | persistent re-gather staging | stage 3: every rank's slices of the persistent tensors, input and `W ×` output, `f32` | parameter all-gather |
//!
//! The fp32 gradients stay in memory under NVMe offload (DeepSpeed swaps them out at the
//! boundary; the executor steps each sub-group with them in place), so the plan's bytes on
//! [`Device::Nvme`] are exactly the executor's swap files. Partial optimizer offload
//! (`ratio < 1`) keeps the sub-groups not on NVMe in host memory (the executor refuses it).

use super::buckets::Buckets;
use super::buffers::{Buffer, BufferKind, BufferList, Lifetime, span};
use super::cpu_units::{PassInputs, cpu_units, pass_buffers};
use super::dtype::{Device, Dtype};
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::run_policy::RunPolicy;
use super::settings::Checkpointing;
use super::settings::{OffloadTarget, Settings};
use super::shards::Shards;
use super::ticks::Ticks;
use crate::config::ZeroStage;
use crate::diagnostics::{Code, Diagnostic};
use crate::memory::{
    CpuArenaShape, LlamaArenaShape, Recompute, arena_elements, llama_arena_elements,
};
use crate::model::Family;

/// Everything [`cpu_buffers`] needs.
pub struct CpuBufferInputs<'a> {
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
    /// Ticks.
    pub ticks: &'a Ticks,
    /// Per model tensor: whether its stage 3 slice lives on NVMe
    /// ([`super::offload::Offload::nvme_resident`]).
    pub nvme_resident: &'a [bool],
    /// The engine the executor runs ([`RunPolicy::engine_stage`]).
    pub run: &'a RunPolicy,
}

/// Why the CPU executor cannot run what `settings` plan for `model`: it runs GPT-2 and the
/// Llama family only, and recomputes whole layers or nothing (no selective recomputation).
pub fn check_cpu_backend(model: &ModelGraph, settings: &Settings, found: &mut Vec<Diagnostic>) {
    let family = model.architecture.family;
    if !matches!(
        family,
        Family::Gpt2 | Family::Llama { .. } | Family::Qwen2 | Family::Mistral
    ) {
        found.push(Diagnostic::error(
            Code::IncompatibleSettings,
            "",
            format!(
                "the dsplan-cpu backend runs GPT-2 and Llama-family models only, not `{}`",
                family.model_type()
            ),
        ));
    }
    if settings.checkpointing == Checkpointing::Selective {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                "",
                "the dsplan-cpu backend recomputes whole layers (full activation checkpointing) or nothing; selective recomputation of the attention scores is not built",
            )
            .with_help("plan with --activation-checkpointing full, or without it"),
        );
    }
}

/// What the CPU executor recomputes under `checkpointing` (selective recomputation is refused
/// by [`check_cpu_backend`]).
pub fn arena_recompute(checkpointing: Checkpointing) -> Recompute {
    match checkpointing {
        Checkpointing::Full => Recompute::EachLayer,
        Checkpointing::None | Checkpointing::Selective => Recompute::Nothing,
    }
}

/// The arena's dimensions for `model` under `settings`.
pub fn arena_shape(model: &ModelGraph, settings: &Settings) -> CpuArenaShape {
    let arch = &model.architecture;
    CpuArenaShape {
        layers: arch.layers,
        hidden: arch.hidden,
        heads: arch.heads,
        intermediate: arch.intermediate,
        vocab: arch.vocab,
        batch: settings.batch.micro_batch,
        seq_len: settings.batch.sequence_length,
        recompute: arena_recompute(settings.checkpointing),
    }
}

/// Every buffer of one rank over one step (see the [module documentation](self)).
pub fn cpu_buffers(inputs: &CpuBufferInputs<'_>) -> Vec<Buffer> {
    let mut list = BufferList::new();
    model_states(inputs, &mut list);
    let s = inputs.settings;
    let stage = inputs.run.engine_stage;
    let sixteen_bit = s.dtypes.params != Dtype::Fp32;
    let units = cpu_units(inputs.model);
    let mut persistent = vec![false; inputs.model.tensors.len()];
    for t in persistent_tensors(inputs) {
        if let Some(slot) = persistent.get_mut(t) {
            *slot = true;
        }
    }
    pass_buffers(
        &PassInputs {
            model: inputs.model,
            layout: inputs.layout,
            shards: inputs.shards,
            ticks: inputs.ticks,
            units: &units,
            world: s.world_size,
            gathers: stage == ZeroStage::Weights || sixteen_bit,
            stage3: stage == ZeroStage::Weights,
            stages_fetches: stage == ZeroStage::Weights && sixteen_bit,
            nvme_resident: inputs.nvme_resident,
            persistent: &persistent,
        },
        &mut list,
    );
    boundary(inputs, &mut list);
    list.into_buffers()
}

fn host(
    list: &mut BufferList,
    name: &str,
    kind: BufferKind,
    dtype: Dtype,
    numel: u64,
    at: Lifetime,
) {
    list.add(name, kind, dtype, numel, Device::Cpu, at);
}

/// Whether the optimizer steps a separate fp32 master (all but fp32 stage 0).
fn has_master(inputs: &CpuBufferInputs<'_>) -> bool {
    inputs.layout.master_dtype.is_some()
}

/// Elements of tensor `t`'s stage 3 slice.
fn slice(layout: &Layout, t: usize) -> u64 {
    layout.entry_of(t).map_or(0, |e| e.partition_numel)
}

/// The persistent tensors (model indices).
fn persistent_tensors(inputs: &CpuBufferInputs<'_>) -> Vec<usize> {
    inputs.shards.persistent.as_ref().map_or(Vec::new(), |p| {
        p.entries
            .iter()
            .filter_map(|&e| inputs.layout.entries.get(e).map(|e| e.tensor))
            .collect()
    })
}

/// Parameters, master, optimizer states, accumulated gradients, the run-long buckets and the
/// activation arena: allocated at start-up, kept for the run.
fn model_states(inputs: &CpuBufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let layout = inputs.layout;
    let stage = inputs.run.engine_stage;
    let run = Lifetime::Persistent;
    let (params_numel, grads_numel) = match stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => {
            (layout.padded_numel, layout.padded_numel)
        }
        ZeroStage::Gradients => (layout.padded_numel, layout.partition_numel),
        ZeroStage::Weights => (layout.partition_numel, layout.partition_numel),
    };
    let params_on_nvme = match stage {
        ZeroStage::Weights => nvme_slices(inputs),
        _ => 0,
    };
    host(
        list,
        "parameters",
        BufferKind::Parameters,
        s.dtypes.params,
        params_numel - params_on_nvme,
        run,
    );
    if let (
        ZeroStage::Weights,
        OffloadTarget::Nvme {
            buffer_count,
            buffer_size,
            ..
        },
    ) = (stage, &s.offload_param)
    {
        list.add(
            "parameter slices past max_in_cpu (NVMe)",
            BufferKind::Parameters,
            s.dtypes.params,
            params_on_nvme,
            Device::Nvme,
            run,
        );
        host(
            list,
            "parameter swap buffers",
            BufferKind::ParamSwapBuffers,
            s.dtypes.params,
            buffer_count * buffer_size,
            run,
        );
    }
    if stage == ZeroStage::Weights {
        let numel = persistent_tensors(inputs)
            .iter()
            .map(|&t| inputs.model.tensors[t].numel)
            .sum();
        host(
            list,
            "persistent parameters (whole)",
            BufferKind::PersistentParameters,
            s.dtypes.params,
            numel,
            run,
        );
    }
    optimizer_states(inputs, list);
    host(
        list,
        "accumulated gradients",
        BufferKind::Gradients,
        s.dtypes.grad_accum,
        grads_numel,
        run,
    );
    match stage {
        ZeroStage::Gradients => {
            let largest = bucket_numels(inputs).max().unwrap_or(0);
            host(
                list,
                "gradient bucket (f32)",
                BufferKind::GradientBuckets,
                Dtype::Fp32,
                largest,
                run,
            );
        }
        ZeroStage::Weights => {
            let largest = inputs
                .buckets
                .reduce
                .iter()
                .map(|b| b.tensors.iter().map(|&t| slice(layout, t)).sum::<u64>())
                .max()
                .unwrap_or(0);
            host(
                list,
                "gradient bucket, per-rank layout (f32)",
                BufferKind::GradientBuckets,
                Dtype::Fp32,
                s.world_size * largest,
                run,
            );
            host(
                list,
                "reduce-scatter output (f32)",
                BufferKind::ReduceScatterStaging,
                Dtype::Fp32,
                largest,
                run,
            );
        }
        ZeroStage::Disabled | ZeroStage::OptimizerStates => {}
    }
    host(
        list,
        "activation arena (f32)",
        BufferKind::ActivationArena,
        Dtype::Fp32,
        model_arena_elements(inputs.model, s),
        run,
    );
}

/// Elements of the activation arena of the executor's model of `model`'s family.
pub fn model_arena_elements(model: &ModelGraph, settings: &Settings) -> u64 {
    let arch = &model.architecture;
    match arch.family {
        Family::Llama { .. } | Family::Qwen2 | Family::Mistral => {
            llama_arena_elements(&LlamaArenaShape {
                layers: arch.layers,
                hidden: arch.hidden,
                heads: arch.heads,
                kv_heads: arch.kv_heads,
                head_dim: arch.head_dim,
                intermediate: arch.intermediate,
                vocab: arch.vocab,
                batch: settings.batch.micro_batch,
                seq_len: settings.batch.sequence_length,
                recompute: arena_recompute(settings.checkpointing),
            })
        }
        _ => arena_elements(&arena_shape(model, settings)),
    }
}

/// Elements of the stage 3 slices on NVMe (`offload_param.device: nvme`, past `max_in_cpu`).
fn nvme_slices(inputs: &CpuBufferInputs<'_>) -> u64 {
    inputs
        .layout
        .entries
        .iter()
        .filter(|e| inputs.nvme_resident.get(e.tensor).copied().unwrap_or(false))
        .map(|e| e.partition_numel)
        .sum()
}

/// The master weights and optimizer states of the owned region, in host memory; under
/// `offload_optimizer.device: nvme` (stage 3) the sub-groups on NVMe live in the swap files
/// instead, stepped through `buffer_count` swap buffers of the largest of them.
fn optimizer_states(inputs: &CpuBufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let run = Lifetime::Persistent;
    let owned = inputs.layout.partition_numel;
    let swapped = matches!(s.offload_optimizer, OffloadTarget::Nvme { .. })
        && inputs.run.engine_stage == ZeroStage::Weights;
    let nvme_groups = || {
        inputs
            .shards
            .sub_groups
            .iter()
            .filter(move |g| swapped && g.device == Device::Nvme)
            .map(|g| g.partition_numel)
    };
    let on_nvme: u64 = nvme_groups().sum();
    let in_memory = owned - on_nvme;
    let mut add = |name: &str, kind: BufferKind| {
        host(list, name, kind, Dtype::Fp32, in_memory, run);
        if swapped {
            list.add(
                format!("{name} (NVMe)"),
                kind,
                Dtype::Fp32,
                on_nvme,
                Device::Nvme,
                run,
            );
        }
    };
    if has_master(inputs) {
        add("fp32 master weights", BufferKind::MasterWeights);
    }
    for state in 0..s.optimizer.states {
        add(
            &format!("optimizer state {state}"),
            BufferKind::OptimizerStates,
        );
    }
    if let OffloadTarget::Nvme { buffer_count, .. } = s.offload_optimizer
        && swapped
    {
        let largest = nvme_groups().max().unwrap_or(0);
        host(
            list,
            "optimizer swap buffers (f32)",
            BufferKind::OptimizerSwapBuffers,
            Dtype::Fp32,
            buffer_count * largest,
            run,
        );
    }
}

/// Elements of every planned bucket.
fn bucket_numels<'a>(inputs: &'a CpuBufferInputs<'_>) -> impl Iterator<Item = u64> + 'a {
    inputs.buckets.reduce.iter().map(|b| {
        b.tensors
            .iter()
            .map(|&t| inputs.model.tensors[t].numel)
            .sum()
    })
}

/// The boundary's all-reduce bucket, the step scratch, and the gathers after the step.
fn boundary(inputs: &CpuBufferInputs<'_>, list: &mut BufferList) {
    let s = inputs.settings;
    let ticks = inputs.ticks;
    let layout = inputs.layout;
    let world = s.world_size;
    let stage = inputs.run.engine_stage;
    if matches!(stage, ZeroStage::Disabled | ZeroStage::OptimizerStates) {
        let in_place = |tensors: &[usize]| {
            let entry = |t: usize| layout.entries.iter().find(|e| e.tensor == t);
            let start = tensors
                .iter()
                .filter_map(|&t| entry(t))
                .map(|e| e.offset)
                .min();
            let end = tensors
                .iter()
                .filter_map(|&t| entry(t))
                .map(|e| e.offset + e.numel)
                .max();
            let numel: u64 = tensors.iter().map(|&t| inputs.model.tensors[t].numel).sum();
            s.dtypes.grad_accum == Dtype::Fp32
                && matches!((start, end), (Some(a), Some(b)) if b - a == numel)
        };
        let staged = inputs
            .buckets
            .reduce
            .iter()
            .filter(|b| !in_place(&b.tensors))
            .map(|b| {
                b.tensors
                    .iter()
                    .map(|&t| inputs.model.tensors[t].numel)
                    .sum()
            })
            .max()
            .unwrap_or(0);
        let tick = ticks.epilogue();
        host(
            list,
            "boundary all-reduce bucket (f32)",
            BufferKind::GradientBuckets,
            Dtype::Fp32,
            staged,
            span(tick, tick),
        );
    }
    if has_master(inputs) {
        host(
            list,
            "fp32 owned gradients for the step",
            BufferKind::StepScratch,
            Dtype::Fp32,
            layout.partition_numel,
            span(ticks.first_optimizer(), ticks.last_optimizer()),
        );
    }
    let gather = span(ticks.param_gather(), ticks.param_gather());
    match stage {
        ZeroStage::OptimizerStates | ZeroStage::Gradients => {
            let partition = layout.partition_numel;
            // The planned pieces (none with one rank).
            let pieces: Vec<(u64, u64)> = inputs
                .buckets
                .param_gather
                .as_ref()
                .map(|g| g.shards.iter().map(|r| (r.start, r.end)).collect())
                .unwrap_or_default();
            let whole = pieces == [(0, partition)];
            if whole && s.dtypes.params == Dtype::Fp32 {
                host(
                    list,
                    "parameter all-gather input (f32)",
                    BufferKind::CollectiveStaging,
                    Dtype::Fp32,
                    partition,
                    gather,
                );
            } else {
                let largest = pieces.iter().map(|(a, b)| b - a).max().unwrap_or(0);
                host(
                    list,
                    "parameter all-gather input (f32)",
                    BufferKind::CollectiveStaging,
                    Dtype::Fp32,
                    largest,
                    gather,
                );
                host(
                    list,
                    "parameter all-gather output (f32)",
                    BufferKind::CollectiveStaging,
                    Dtype::Fp32,
                    world * largest,
                    gather,
                );
            }
        }
        ZeroStage::Weights => {
            let contributed: u64 = persistent_tensors(inputs)
                .iter()
                .map(|&t| slice(layout, t))
                .sum();
            host(
                list,
                "persistent re-gather input (f32)",
                BufferKind::CollectiveStaging,
                Dtype::Fp32,
                contributed,
                gather,
            );
            host(
                list,
                "persistent re-gather output (f32)",
                BufferKind::CollectiveStaging,
                Dtype::Fp32,
                world * contributed,
                gather,
            );
        }
        ZeroStage::Disabled => {}
    }
}
