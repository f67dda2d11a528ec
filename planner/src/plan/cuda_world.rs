//! What one rank of dsplan's CUDA step holds at world size `W` ([`CudaShares`]): the sizes of
//! its model states and of the buffers its collectives use, from the plan's layout, buckets and
//! stage-3 schedule. The `dsplan-cuda` buffer list ([`super::cuda_buffers`]) and the
//! executor's `DeviceLayout` both read this one description, so the plan and the allocation
//! agree by construction.
//!
//! The device's compute kernels read the parameters in one buffer, at the model's tensor
//! offsets (the flat buffer, or stage 3's arena), and accumulate the gradients in one buffer
//! (the flat gradients, or stages 2-3's gradient arena). A rank therefore keeps, by scheme
//! (`Ψ` the model's elements, `Ψ'` the flat buffer padded to `2W`, `P = Ψ'/W` a flat
//! partition, `H = Σ⌈numel/W⌉` a stage-3 shard, `G` the gradient arena, `B` the largest bucket):
//!
//! | buffer | one GPU, stage 0 | stage 1 (flat partition) | stage 2 (partitioned gradients) | stage 3 (sharded) |
//! |---|---|---|---|---|
//! | parameters (the buffer the kernels read) | `Ψ` | `Ψ'` | `Ψ'` | the arena `A`, gathered into on the plan's schedule |
//! | parameter shard | - | - | - | `H` |
//! | gradients (the buffer backward accumulates into) | `Ψ` | `Ψ'` | the arena `G` | the arena `G` |
//! | gradient partition (accumulated over micro-steps) | - | - | `P` | `H` |
//! | fp32 master, AdamW moments | `Ψ` | `P` | `P` | `H` |
//! | bucket staging | a bucket not back to back in the flat gradients | as stage 0 | `B` (every bucket is packed, all-reduced there) | the largest bucket on the wire (`Σ W·⌈numel/W⌉`, reduce-scattered in place) |
//! | gather staging (input, output) | - | sharded all-gather: the largest piece, `W ×` it | as stage 1 | the largest fetch, prefetch or persistent re-gather (`Σ⌈numel/W⌉`), `W ×` it |
//!
//! Stages 0-1 reduce each bucket in place in the flat gradients (packed into the staging when
//! its tensors are not back to back there), with an average. Stages 2-3 pack each bucket's
//! gradients out of the gradient arena ([`super::grad_arena`]: a place is free again once its
//! bucket is packed, so `G` holds the gradients in flight, as DeepSpeed's IPG bucket and
//! un-hooked `param.grad`s), reduce it, and add the rank's part into its gradient partition.
//! Stage 3 keeps its gathered parameters in one arena of `A` elements where the plan places
//! every gathered tensor of every trace step ([`super::stage3_arena`]): a released tensor's
//! place is reused by a later gather, so `A` is at least the schedule's live peak and at most
//! `Ψ`, and its parameter memory is `A + H`.

use serde::Serialize;

use super::Plan;
use super::buckets::Buckets;
use super::dtype::Dtype;
use super::layout::Layout;
use super::model_graph::ModelGraph;
use super::run_policy::RunPolicy;
use super::settings::{FlatOrder, Settings};
use super::shards::Shards;
use super::stage3::Stage3Schedule;
use crate::config::ZeroStage;
use crate::diagnostics::{Code, Diagnostic};

/// How a rank's model states are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CudaScheme {
    /// Every rank holds everything (one GPU, or stage 0).
    Replicated,
    /// One flat buffer cut into `W` equal partitions: master and moments (stage 1).
    FlatPartition,
    /// Stage 2: the flat partitions of stage 1, and the gradients too: backward writes into
    /// the gradient arena, and each bucket is reduced into the rank's gradient partition.
    PartitionedGradients,
    /// Every tensor cut into `W` slices: parameters, gradients, master and moments (stage 3).
    Sharded,
}

/// The element counts of one rank's device buffers (see the [module documentation](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CudaShares {
    /// Ranks.
    pub world: u64,
    /// How the states are cut.
    pub scheme: CudaScheme,
    /// The parameter buffer the kernels read (model dtype): the flat parameters, or at
    /// stage 3 the gathered-parameter arena.
    pub params: u64,
    /// The gradient buffer backward accumulates into (model dtype): the flat gradients, or at
    /// stages 2-3 the gradient arena ([`super::grad_arena`]).
    pub grads: u64,
    /// fp32 master weights (0 when the parameters are the master).
    pub master: u64,
    /// Each AdamW moment (fp32).
    pub optimizer: u64,
    /// The rank these shares are ([`Self::for_rank`]; 0 from [`Self::new`]).
    pub rank: u64,
    /// First element of this rank's partition in the flat buffers (`rank × P`; otherwise 0).
    pub partition: u64,
    /// Stage 3: this rank's parameter slices (model dtype).
    pub param_shard: u64,
    /// Stages 2-3: this rank's reduced gradients (model dtype), accumulated over micro-steps:
    /// its flat partition, or its stage-3 slices.
    pub grad_partition: u64,
    /// The gradient buckets' staging (model dtype): stage 3's reduce-scatter input, stage 2's
    /// packed bucket; at stages 0-1 the largest bucket whose tensors are not back to back in the
    /// flat gradients (0 when there is none: the others are all-reduced in place).
    pub bucket: u64,
    /// The all-gather staging's input (model dtype); its output is `world ×` it.
    pub gather: u64,
}

impl CudaShares {
    /// One GPU: everything whole; a master copy when the model is 16-bit.
    pub fn one_gpu(psi: u64, model_dtype: Dtype) -> Self {
        Self {
            world: 1,
            scheme: CudaScheme::Replicated,
            params: psi,
            grads: psi,
            master: if model_dtype == Dtype::Fp32 { 0 } else { psi },
            optimizer: psi,
            rank: 0,
            partition: 0,
            param_shard: 0,
            grad_partition: 0,
            bucket: 0,
            gather: 0,
        }
    }

    /// Rank 0's shares under the plan's `settings`, `layout`, `buckets` and stage-3 schedule
    /// (every rank's buffers have the same sizes; only [`Self::partition`] moves); under
    /// offload, what stays on the GPU ([`offloaded`]).
    pub fn new(
        settings: &Settings,
        layout: &Layout,
        shards: &Shards,
        buckets: &Buckets,
        stage3: Option<&Stage3Schedule>,
    ) -> Self {
        let resident = Self::resident(settings, layout, shards, buckets, stage3);
        if super::cuda_offload::offloads(settings) {
            offloaded(resident, settings, shards, buckets, stage3)
        } else {
            resident
        }
    }

    /// [`Self::new`] with every state on the GPU.
    fn resident(
        settings: &Settings,
        layout: &Layout,
        shards: &Shards,
        buckets: &Buckets,
        stage3: Option<&Stage3Schedule>,
    ) -> Self {
        let psi = layout.numel;
        let world = settings.world_size.max(1);
        if world == 1 {
            return Self::one_gpu(psi, settings.dtypes.params);
        }
        let has_master = layout.master_dtype.is_some();
        // Stages 0-2 all-reduce a bucket in place where its tensors are back to back in the
        // flat gradients, else packed into this staging and copied back.
        let packed = buckets
            .reduce
            .iter()
            .filter(|b| !contiguous(layout, &b.tensors))
            .map(|b| b.numel)
            .max()
            .unwrap_or(0);
        match settings.stage {
            ZeroStage::Disabled => Self {
                world,
                bucket: packed,
                ..Self::one_gpu(psi, settings.dtypes.params)
            },
            ZeroStage::OptimizerStates | ZeroStage::Gradients => {
                let partition = layout.partition_numel;
                let arena = buckets.gradient_arena.as_ref();
                let pieces = buckets.param_gather.as_ref().map_or(0, |g| {
                    if g.shards.len() > 1 {
                        g.shards.iter().map(|s| s.len()).max().unwrap_or(0)
                    } else {
                        0
                    }
                });
                let flat = Self {
                    world,
                    scheme: CudaScheme::FlatPartition,
                    params: layout.padded_numel,
                    grads: layout.padded_numel,
                    master: if has_master { partition } else { 0 },
                    optimizer: partition,
                    rank: 0,
                    partition: 0,
                    param_shard: 0,
                    grad_partition: 0,
                    bucket: packed,
                    gather: pieces,
                };
                match arena {
                    Some(arena) => Self {
                        scheme: CudaScheme::PartitionedGradients,
                        grads: arena.numel,
                        grad_partition: partition,
                        bucket: buckets.reduce.iter().map(|b| b.numel).max().unwrap_or(0),
                        ..flat
                    },
                    None => flat,
                }
            }
            ZeroStage::Weights => {
                let shard = layout.partition_numel;
                let slice = |t: usize| layout.entry_of(t).map_or(0, |e| e.partition_numel);
                let batch = |tensors: &[usize]| tensors.iter().map(|&t| slice(t)).sum::<u64>();
                let fetches = stage3.map_or(0, |s| {
                    s.steps
                        .iter()
                        .flat_map(|step| [batch(&step.on_demand), batch(&step.prefetch)])
                        .max()
                        .unwrap_or(0)
                });
                let persistent: u64 = shards.persistent.as_ref().map_or(0, |p| {
                    p.entries
                        .iter()
                        .filter_map(|&e| layout.entries.get(e))
                        .map(|e| e.partition_numel)
                        .sum()
                });
                // Each bucket's slices, `W` ranks' worth packed; with a gradient arena the
                // reduce-scatter writes the reduced chunk after them.
                let chunk = buckets
                    .reduce
                    .iter()
                    .map(|b| batch(&b.tensors))
                    .max()
                    .unwrap_or(0);
                let chunks = match buckets.gradient_arena {
                    Some(_) => world + 1,
                    None => world,
                };
                let bucket = chunks * chunk;
                let arena = stage3
                    .and_then(|s| s.arena.as_ref())
                    .map_or(psi, |a| a.numel);
                let grads = buckets.gradient_arena.as_ref().map_or(psi, |a| a.numel);
                Self {
                    world,
                    scheme: CudaScheme::Sharded,
                    params: arena,
                    grads,
                    master: if has_master { shard } else { 0 },
                    optimizer: shard,
                    rank: 0,
                    partition: 0,
                    param_shard: shard,
                    grad_partition: shard,
                    bucket,
                    gather: fetches.max(persistent),
                }
            }
        }
    }

    /// Rank 0's shares in `plan`.
    pub fn of_plan(plan: &Plan) -> Self {
        Self::new(
            &plan.settings,
            &plan.layout,
            &plan.shards,
            &plan.buckets,
            plan.stage3.as_ref(),
        )
    }

    /// The same shares for `rank` (its partition's first element).
    pub fn for_rank(self, rank: u64) -> Self {
        let partition = match self.scheme {
            CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => rank * self.optimizer,
            CudaScheme::Replicated | CudaScheme::Sharded => 0,
        };
        Self {
            rank,
            partition,
            ..self
        }
    }

    /// The all-gather staging's output elements.
    pub fn gather_out(&self) -> u64 {
        self.gather.saturating_mul(self.world)
    }
}

/// What one rank of the CUDA step keeps on the GPU under offload: this takes the
/// shares of the same job without offload ([`CudaShares`]) and moves out what the host holds.
///
/// | share | optimizer offload | + parameter offload (stage 3) |
/// |---|---|---|
/// | fp32 master, AdamW moments | the sub-groups kept on the GPU (`ratio < 1`), else none | as left |
/// | gradient partition | the kept sub-groups' | as left |
/// | gradients | the gradient arena (gradients in flight), at one GPU too | as left |
/// | parameter shard | kept | none: the host's slices are copied into the gather staging |
/// | parameters | unchanged (whole, flat, or stage 3's arena) | stage 3's arena, at one GPU too |
///
/// At one GPU nothing is reduced: each bucket's gradients are copied to the host straight out
/// of the gradient arena, and a gather is a host → device copy into the arena, so neither
/// bucket nor gather staging is kept.
fn offloaded(
    resident: CudaShares,
    settings: &Settings,
    shards: &Shards,
    buckets: &Buckets,
    stage3: Option<&Stage3Schedule>,
) -> CudaShares {
    let kept = if settings.offload_optimizer.is_offloaded() {
        super::cuda_offload::resident_numel(shards)
    } else {
        resident.optimizer
    };
    let params_offloaded = settings.offload_param.is_offloaded();
    let base = CudaShares {
        master: if resident.master > 0 { kept } else { 0 },
        optimizer: kept,
        grad_partition: if resident.grad_partition > 0 { kept } else { 0 },
        param_shard: if params_offloaded {
            0
        } else {
            resident.param_shard
        },
        ..resident
    };
    if resident.world > 1 {
        return base;
    }
    let arena = buckets.gradient_arena.as_ref();
    let grads = arena.map_or(resident.grads, |a| a.numel);
    let gathered = stage3.and_then(|s| s.arena.as_ref()).map(|a| a.numel);
    let (scheme, params) = match (params_offloaded, gathered) {
        (true, Some(numel)) => (CudaScheme::Sharded, numel),
        _ if arena.is_some() => (CudaScheme::PartitionedGradients, resident.params),
        _ => (resident.scheme, resident.params),
    };
    CudaShares {
        scheme,
        params,
        grads,
        grad_partition: if arena.is_some() { kept } else { 0 },
        bucket: 0,
        gather: 0,
        ..base
    }
}

/// Whether dsplan's CUDA step keeps only its gradient partition and the gradients in flight
/// (a gradient arena, [`super::grad_arena`]): stages 2 and 3 at `W > 1`, reducing every
/// micro-step, and at one GPU too under optimizer offload (each bucket's gradients go to the
/// host). Stage 1 too when a step is one
/// micro-step and `overlap_comm` reduces each bucket during backward: its one reduction per
/// step is then stage 2's, so the gradients outside the partition (which DeepSpeed's ZeRO-1
/// keeps to the step) have no later reader.
pub fn partitions_gradients(settings: &Settings) -> bool {
    let reduces_every_micro_step = match settings.stage {
        ZeroStage::Gradients | ZeroStage::Weights => {
            settings.reduce_timing == super::settings::ReduceTiming::EveryMicroStep
        }
        ZeroStage::OptimizerStates => {
            settings.batch.gradient_accumulation_steps == 1
                && settings.overlap == super::settings::Overlap::Overlapped
        }
        ZeroStage::Disabled => false,
    };
    // At one GPU the "reduce" is a no-op; the arena pays off when the gradients go to the
    // host under optimizer offload.
    let arena_pays = settings.world_size > 1 || settings.offload_optimizer.is_offloaded();
    settings.backend == super::PlanBackend::DsplanCuda && arena_pays && reduces_every_micro_step
}

/// What the CUDA executor does not run at world sizes above 1, each an error naming it:
/// `BF16_Optimizer` (bf16 at stage 1 accumulating in fp32), a communication dtype other than
/// the model's, the round-robin flat order. Buckets whose tensors are not back to back in the flat buffer or
/// the shard are packed into the bucket staging.
///
/// Gradient accumulation at stages 2-3: each micro-step's reduced buckets are added into the
/// rank's gradient partition, which the step zeroes first (DeepSpeed's order).
pub fn check_cuda_world(
    model: &ModelGraph,
    settings: &Settings,
    run: &RunPolicy,
    found: &mut Vec<Diagnostic>,
) {
    if settings.world_size <= 1 {
        return;
    }
    let world = settings.world_size;
    let mut refuse = |pointer: &str, what: String, help: &str| {
        found.push(
            Diagnostic::error(
                Code::IncompatibleSettings,
                pointer,
                format!(
                    "the dsplan-cuda backend does not run {what} on a world of {world} GPUs yet"
                ),
            )
            .with_help(help.to_string()),
        );
    };
    if run.optimizer == super::run_policy::DeepSpeedOptimizer::Bf16Optimizer {
        refuse(
            "/data_types/grad_accum_dtype",
            "BF16_Optimizer (bf16 at stage 1 accumulating in fp32)".into(),
            "remove data_types.grad_accum_dtype: stage 1 then accumulates in bf16",
        );
    }
    if settings.dtypes.communication != settings.dtypes.params {
        refuse(
            "/communication_data_type",
            format!(
                "a communication dtype ({}) other than the model's ({})",
                settings.dtypes.communication.as_str(),
                settings.dtypes.params.as_str()
            ),
            "remove communication_data_type",
        );
    }
    if settings.flat_order == FlatOrder::RoundRobin {
        refuse(
            "/zero_optimization/round_robin_gradients",
            "the round-robin gradient order".into(),
            "remove round_robin_gradients",
        );
    }
    let layout = Layout::new(model, settings);
    let buckets = super::buckets::buckets(model, &layout, settings, run);
    if buckets
        .reduce
        .iter()
        .any(|b| b.collective == super::buckets::Collective::Reduce)
    {
        refuse(
            "/zero_optimization/use_multi_rank_bucket_allreduce",
            "a reduce to each rank per bucket (use_multi_rank_bucket_allreduce: false)".into(),
            "remove use_multi_rank_bucket_allreduce",
        );
    }
    if settings
        .stage3
        .as_ref()
        .is_some_and(|s3| s3.fetch_with_all_reduce)
    {
        refuse(
            "/zero_optimization/stage3_use_all_reduce_for_fetch_params",
            "stage 3 fetches by all-reduce".into(),
            "remove stage3_use_all_reduce_for_fetch_params",
        );
    }
}

/// Whether `tensors`' layout entries form one range of the flat (or shard) buffer.
pub fn contiguous(layout: &Layout, tensors: &[usize]) -> bool {
    let mut spans: Vec<(u64, u64)> = tensors
        .iter()
        .filter_map(|&t| layout.entry_of(t))
        .map(|e| (e.offset, e.offset + e.partition_numel))
        .collect();
    if spans.len() != tensors.len() {
        return false;
    }
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 == w[1].0)
}
