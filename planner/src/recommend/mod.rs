//! `recommend`: the fastest DeepSpeed configuration that fits a model, a cluster and a target
//! batch, as a ready `ds_config.json`.
//!
//! The walk goes from the fastest configuration to the most memory-frugal ([`Strategy::WALK`]:
//! ZeRO-1, ZeRO-2, ZeRO-2 + optimizer offload, ZeRO-3, ZeRO-3 + optimizer offload, ZeRO-3 +
//! optimizer and parameter offload, ZeRO-3 + NVMe). For each it writes the config, reads it back
//! as `dsplan estimate --config` would, and takes the largest micro-batch (a divisor of the
//! per-GPU batch) whose full estimate fits the GPU and host memory; gradient accumulation makes
//! up the target batch. ZeRO-3's optimizer offload may be partial (`offload_optimizer.ratio`):
//! every whole number of offloaded sub-groups is tried. Each fitting candidate gets a predicted
//! step time from the [`cost`] model; the first strategy of the walk whose prediction is within
//! [`CostModel::tie_tolerance`] of the fastest wins. Every other candidate is reported with why it lost: it does not fit (and by how
//! much), it needs a flag that was not given, or it is slower.
//!
//! The chosen config passes [`crate::validate::validate_document`] with no error; `recommend`
//! checks that before returning it.
//!
//! A micro-batch above 1 whose activations alone overflow the GPU is skipped without its full
//! estimate ([`prune`]): the answer is the same as when every candidate is estimated
//! ([`Planning::EveryCandidate`], kept as the reference), at a fraction of the work for deep
//! models. The model's plan graph and dimensions are derived once per request and shared by
//! every candidate ([`crate::estimate::full::Prepared`]); [`recommend_counted`] reports how
//! many candidates got their full estimate ([`RecommendStats`]).

pub mod cost;
pub mod prune;
pub mod strategy;

pub use cost::{BadConstant, CostModel, StepTime};
pub use prune::Planning;
pub use strategy::{Plan, Strategy};

use serde::Serialize;
use serde_json::Value;
use std::fmt;

use crate::config::primitives::MAX_EXACT_INTEGER;
use crate::diagnostics::Diagnostic;
use crate::estimate::full::{
    AttentionKernel, Checkpointing, Context, Margins, ModelDims, Overrides, Peak, Precision,
    Prepared, TrainingShape, compile_prepared, estimate_prepared, read_config,
};
use crate::estimate::{FullEstimate, FullEstimateError, Topology};
use crate::model::ModelSpec;
use crate::validate::{ValidateOptions, validate_document};
use prune::Pruner;
use strategy::ConfigInputs;

/// The machines.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    /// Nodes and GPUs per node.
    pub hardware: Topology,
    /// Bytes of memory of one GPU.
    pub gpu_memory: u64,
    /// Bytes of host memory of one node (`None`: unknown, offload is not considered).
    pub cpu_memory: Option<u64>,
    /// A directory on NVMe for ZeRO-Infinity (`None`: NVMe is not considered).
    pub nvme_path: Option<String>,
}

/// What to recommend for.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model.
    pub model: ModelSpec,
    /// The cluster.
    pub cluster: Cluster,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Activation checkpointing.
    pub checkpointing: Checkpointing,
    /// Attention kernel.
    pub attention: AttentionKernel,
    /// Target `train_batch_size` (sequences per optimizer step).
    pub global_batch: u64,
    /// Training precision.
    pub precision: Precision,
    /// Runtime margins of the memory estimate.
    pub margins: Margins,
    /// Constants of the step-time model.
    pub cost: CostModel,
}

/// A candidate that fits.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    /// The plan.
    pub plan: Plan,
    /// Peak GPU memory per GPU.
    pub gpu_peak: Peak,
    /// Peak host memory per node.
    pub cpu_peak: Peak,
    /// NVMe bytes per node.
    pub nvme_bytes: u64,
    /// Predicted step time.
    pub step_time: StepTime,
}

/// Why a strategy was not chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Rejection {
    /// Even its smallest form needs more GPU memory than there is.
    GpuMemory {
        /// Bytes per GPU at micro-batch 1 (the most offload tried).
        needed: u64,
        /// Bytes per GPU available.
        available: u64,
    },
    /// It fits the GPU only with more host memory than there is.
    CpuMemory {
        /// Host bytes per node of its smallest form that fits the GPU.
        needed: u64,
        /// Host bytes per node available.
        available: u64,
    },
    /// It offloads, and no `--cpu-memory` was given.
    NoCpuMemory,
    /// It needs NVMe, and no `--nvme-path` was given.
    NoNvmePath,
    /// It fits, and the chosen candidate is faster.
    Slower {
        /// Its step time minus the chosen one's, seconds.
        seconds_more: f64,
    },
    /// It fits and is predicted no slower than the chosen one, but within the cost model's
    /// tie tolerance: the earlier, simpler strategy wins.
    Tie {
        /// The chosen step time minus its own, seconds (0 or more).
        seconds_less: f64,
    },
}

/// One strategy of the walk, with its outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Candidate {
    /// The strategy.
    pub strategy: Strategy,
    /// Its best fitting plan, if any.
    pub fit: Option<Fit>,
    /// Why it was not chosen (`None` for the chosen one).
    pub rejection: Option<Rejection>,
}

/// The recommendation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    /// The chosen plan.
    pub chosen: Fit,
    /// Its `ds_config.json`.
    pub config: Value,
    /// Its full memory estimate.
    pub estimate: FullEstimate,
    /// Every strategy of the walk, in walk order.
    pub candidates: Vec<Candidate>,
    /// The cost model used.
    pub cost: CostModel,
}

/// Why there is no recommendation.
#[derive(Debug, Clone, PartialEq)]
pub enum RecommendError {
    /// The global batch is 0.
    ZeroBatch,
    /// The global batch is not a multiple of the GPU count.
    BatchNotDivisible {
        /// The target.
        global_batch: u64,
        /// GPUs.
        world: u64,
    },
    /// The global batch is above 2^53, the largest `train_batch_size` a JSON config holds
    /// exactly (checked before any search).
    BatchTooLarge {
        /// The target.
        global_batch: u64,
    },
    /// No strategy fits; every candidate says why.
    NothingFits(Vec<Candidate>),
    /// The estimate refused the inputs.
    Estimate(FullEstimateError),
    /// A cost constant makes no sense.
    Cost(BadConstant),
    /// A generated config failed to read back or to validate (a dsplan bug).
    Config(String),
}

impl fmt::Display for RecommendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecommendError::ZeroBatch => write!(f, "the global batch must be at least 1"),
            RecommendError::BatchNotDivisible {
                global_batch,
                world,
            } => {
                let below = global_batch / world * world;
                let above = below + world;
                write!(
                    f,
                    "a global batch of {global_batch} cannot be split over {world} GPUs; "
                )?;
                if below > 0 {
                    write!(f, "use {below} or {above}")
                } else {
                    write!(f, "use {above}")
                }
            }
            RecommendError::BatchTooLarge { global_batch } => write!(
                f,
                "a global batch of {global_batch} is above 2^53 = {MAX_EXACT_INTEGER}, the largest train_batch_size a config holds exactly"
            ),
            RecommendError::NothingFits(_) => {
                write!(f, "no configuration fits this model on this cluster")
            }
            RecommendError::Estimate(error) => error.fmt(f),
            RecommendError::Cost(error) => error.fmt(f),
            RecommendError::Config(message) => write!(f, "internal error: {message}"),
        }
    }
}

impl std::error::Error for RecommendError {}

/// One evaluated plan.
struct Evaluated {
    fit: Fit,
    config: Value,
    estimate: FullEstimate,
}

/// The outcome of one plan: it fits, or its peaks.
enum Tried {
    Fits(Box<Evaluated>),
    TooLarge { gpu: u64, cpu: u64 },
}

/// Finds the fastest configuration that fits.
pub fn recommend(request: &Request) -> Result<Recommendation, RecommendError> {
    recommend_with(request, Planning::Pruned)
}

/// [`recommend`], planning the candidates as `planning` says (the answer does not depend on it).
pub fn recommend_with(
    request: &Request,
    planning: Planning,
) -> Result<Recommendation, RecommendError> {
    recommend_counted(request, planning).0
}

/// How much planning one walk did: what [`Planning::Pruned`] saves over
/// [`Planning::EveryCandidate`], as data a test can assert.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RecommendStats {
    /// Candidates (strategy, offload share, micro-batch) the walk considered.
    pub candidates: u64,
    /// Candidates that got their full memory estimate.
    pub full_estimates: u64,
    /// Candidates skipped because their activations alone overflow the GPU.
    pub pruned: u64,
}

/// [`recommend_with`], with the count of the walk's full estimates and skipped candidates.
pub fn recommend_counted(
    request: &Request,
    planning: Planning,
) -> (Result<Recommendation, RecommendError>, RecommendStats) {
    let mut stats = RecommendStats::default();
    let answer = walk(request, planning, &mut stats);
    (answer, stats)
}

fn walk(
    request: &Request,
    planning: Planning,
    stats: &mut RecommendStats,
) -> Result<Recommendation, RecommendError> {
    request.cost.check().map_err(RecommendError::Cost)?;
    let world = request.cluster.hardware.total_gpus();
    if request.global_batch == 0 {
        return Err(RecommendError::ZeroBatch);
    }
    if request.global_batch > MAX_EXACT_INTEGER {
        return Err(RecommendError::BatchTooLarge {
            global_batch: request.global_batch,
        });
    }
    if !request.global_batch.is_multiple_of(world) {
        return Err(RecommendError::BatchNotDivisible {
            global_batch: request.global_batch,
            world,
        });
    }
    // The model's graph and dimensions, shared by every candidate's estimate.
    let prepared = Prepared::of(&request.model);
    let mut pruner = Pruner::new(&prepared, request.cluster.hardware, planning);
    let mut results: Vec<(Strategy, Result<Evaluated, Rejection>)> = Vec::new();
    for strategy in Strategy::WALK {
        results.push((
            strategy,
            evaluate(request, &prepared, strategy, &mut pruner, stats)?,
        ));
    }
    // The fastest prediction, then the first strategy of the walk within the tie tolerance.
    let times: Vec<(usize, f64)> = results
        .iter()
        .enumerate()
        .filter_map(|(i, (_, result))| result.as_ref().ok().map(|e| (i, e.fit.step_time.total)))
        .collect();
    let fastest = times
        .iter()
        .map(|&(_, time)| time)
        .fold(f64::INFINITY, f64::min);
    let best = times
        .iter()
        .copied()
        .find(|&(_, time)| time <= fastest * (1.0 + request.cost.tie_tolerance));
    let candidates: Vec<Candidate> = results
        .iter()
        .enumerate()
        .map(|(i, (strategy, result))| match result {
            Ok(evaluated) => Candidate {
                strategy: *strategy,
                fit: Some(evaluated.fit.clone()),
                rejection: match best {
                    Some((chosen, _)) if chosen == i => None,
                    Some((_, time)) if evaluated.fit.step_time.total > time => {
                        Some(Rejection::Slower {
                            seconds_more: evaluated.fit.step_time.total - time,
                        })
                    }
                    Some((_, time)) => Some(Rejection::Tie {
                        seconds_less: time - evaluated.fit.step_time.total,
                    }),
                    None => None,
                },
            },
            Err(rejection) => Candidate {
                strategy: *strategy,
                fit: None,
                rejection: Some(rejection.clone()),
            },
        })
        .collect();
    let Some((chosen, _)) = best else {
        return Err(RecommendError::NothingFits(candidates));
    };
    let Some((_, Ok(evaluated))) = results.into_iter().nth(chosen) else {
        return Err(RecommendError::Config(
            "the chosen candidate vanished".into(),
        ));
    };
    let errors: Vec<Diagnostic> = validate_document(
        &evaluated.config,
        ValidateOptions {
            world_size: Some(world),
        },
    )
    .into_iter()
    .filter(Diagnostic::is_error)
    .collect();
    if let Some(first) = errors.first() {
        return Err(RecommendError::Config(format!(
            "the generated config does not validate: {} at {}",
            first.message, first.pointer
        )));
    }
    Ok(Recommendation {
        chosen: evaluated.fit,
        config: evaluated.config,
        estimate: evaluated.estimate,
        candidates,
        cost: request.cost,
    })
}

/// The largest fitting micro-batch of `strategy` (and, for a partial offload, the fastest
/// offload share), or why nothing fits.
fn evaluate(
    request: &Request,
    prepared: &Prepared<'_>,
    strategy: Strategy,
    pruner: &mut Pruner<'_>,
    stats: &mut RecommendStats,
) -> Result<Result<Evaluated, Rejection>, RecommendError> {
    let cluster = &request.cluster;
    let dims = &prepared.dims;
    if strategy.needs_nvme() && cluster.nvme_path.is_none() {
        return Ok(Err(Rejection::NoNvmePath));
    }
    if strategy.offloads() && cluster.cpu_memory.is_none() {
        return Ok(Err(Rejection::NoCpuMemory));
    }
    let world = cluster.hardware.total_gpus();
    let per_gpu = request.global_batch / world;
    // Micro-batches above the estimate's shape bound cannot be estimated; larger per-GPU
    // batches are reached by accumulation.
    let mut micro_batches: Vec<u64> = divisors(per_gpu)
        .into_iter()
        .filter(|m| *m <= crate::memory::shape::MAX_SHAPE_DIMENSION)
        .collect();
    micro_batches.reverse();
    let mut best: Option<Evaluated> = None;
    let mut smallest_gpu = u64::MAX;
    let mut smallest_cpu_fitting_gpu: Option<u64> = None;
    for ratio in offload_ratios(request, prepared, strategy)? {
        for &micro_batch in &micro_batches {
            let plan = Plan {
                strategy,
                micro_batch,
                accumulation: per_gpu / micro_batch,
                offload_ratio: ratio,
            };
            let read = read_back(request, dims, &plan)?;
            stats.candidates += 1;
            // Only micro-batch 1's peaks are reported when nothing fits.
            if micro_batch > 1 && pruner.overflows(&read.1, &read.2, cluster.gpu_memory) {
                stats.pruned += 1;
                continue;
            }
            stats.full_estimates += 1;
            match try_plan(request, prepared, plan, read)? {
                Tried::Fits(evaluated) => {
                    if best
                        .as_ref()
                        .is_none_or(|b| evaluated.fit.step_time.total < b.fit.step_time.total)
                    {
                        best = Some(*evaluated);
                    }
                    break;
                }
                Tried::TooLarge { gpu, cpu } => {
                    if micro_batch == 1 {
                        smallest_gpu = smallest_gpu.min(gpu);
                        if gpu <= cluster.gpu_memory {
                            smallest_cpu_fitting_gpu =
                                Some(smallest_cpu_fitting_gpu.map_or(cpu, |c| c.min(cpu)));
                        }
                    }
                }
            }
        }
    }
    Ok(match best {
        Some(evaluated) => Ok(evaluated),
        None => Err(match (smallest_cpu_fitting_gpu, cluster.cpu_memory) {
            (Some(needed), Some(available)) => Rejection::CpuMemory { needed, available },
            _ => Rejection::GpuMemory {
                needed: smallest_gpu,
                available: cluster.gpu_memory,
            },
        }),
    })
}

/// Every divisor of `n` (≥ 1), ascending: trial division up to √n, so a per-GPU batch of 2^40
/// costs 2^20 steps, not 2^40.
fn divisors(n: u64) -> Vec<u64> {
    let (mut small, mut large) = (Vec::new(), Vec::new());
    let mut d = 1u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    large.reverse();
    small.extend(large);
    small
}

/// Offload shares to try: for ZeRO-3 + optimizer offload, every whole number `k` of the `G`
/// sub-groups of a partition (`ratio = (k + ½)/G` so that DeepSpeed's `int(ratio × G)` is `k`;
/// `None` for all of them); one `None` otherwise. `G` is the plan's: tensors are grouped until
/// their partitions reach `sub_group_size`, as DeepSpeed groups them.
fn offload_ratios(
    request: &Request,
    prepared: &Prepared<'_>,
    strategy: Strategy,
) -> Result<Vec<Option<f64>>, RecommendError> {
    if strategy != Strategy::Zero3OffloadOptimizer {
        return Ok(vec![None]);
    }
    let plan = Plan {
        strategy,
        micro_batch: 1,
        accumulation: 1,
        offload_ratio: None,
    };
    let (_, reading, shape) = read_back(request, &prepared.dims, &plan)?;
    let compiled = compile_prepared(
        prepared,
        request.cluster.hardware,
        &reading.setup,
        &shape,
        &reading.config,
    )
    .map_err(RecommendError::Estimate)?;
    let groups = compiled.shards.sub_groups.len().max(1);
    let mut ratios: Vec<Option<f64>> = (1..groups)
        .map(|k| Some((k as f64 + 0.5) / groups as f64))
        .collect();
    ratios.push(None);
    Ok(ratios)
}

/// The config of `plan`, read back as `dsplan estimate --config` reads it, and its shape.
fn read_back(request: &Request, dims: &ModelDims, plan: &Plan) -> Result<ReadBack, RecommendError> {
    let hardware = request.cluster.hardware;
    let inputs = ConfigInputs {
        precision: request.precision,
        hidden: dims.layers.hidden,
        largest_tensor: dims.largest_tensor,
        world: hardware.total_gpus(),
        checkpointing: request.checkpointing,
        nvme_path: request.cluster.nvme_path.as_deref(),
    };
    let config = strategy::ds_config(plan, &inputs);
    let overrides = Overrides {
        checkpointing: Some(request.checkpointing),
        precision: Some(request.precision),
        ..Overrides::default()
    };
    let reading = read_config(&config, hardware, Some(dims.layers.hidden), &overrides)
        .map_err(|error| RecommendError::Config(error.to_string()))?;
    let shape = TrainingShape {
        seq_len: request.seq_len,
        micro_batch: reading.micro_batch,
        checkpointing: reading.checkpointing,
        checkpoint_placement: reading.checkpoint_placement,
        attention: request.attention,
    };
    Ok((config, reading, shape))
}

/// A config, its reading and its shape ([`read_back`]).
type ReadBack = (Value, crate::estimate::full::ConfigReading, TrainingShape);

/// The full estimate of `plan`, read back as `read`.
fn try_plan(
    request: &Request,
    prepared: &Prepared<'_>,
    plan: Plan,
    (config, reading, shape): ReadBack,
) -> Result<Tried, RecommendError> {
    let cluster = &request.cluster;
    let hardware = cluster.hardware;
    let estimate = estimate_prepared(prepared, hardware, &reading, &shape, &request.margins)
        .map_err(RecommendError::Estimate)?;
    let gpu = estimate.peaks.gpu.bytes;
    let cpu = estimate.peaks.cpu.bytes;
    let fits_gpu = gpu <= cluster.gpu_memory;
    let fits_cpu = cluster.cpu_memory.is_none_or(|available| cpu <= available);
    if !(fits_gpu && fits_cpu) {
        return Ok(Tried::TooLarge { gpu, cpu });
    }
    let ctx = Context {
        model: &prepared.dims,
        setup: &estimate.setup,
        shape: &estimate.shape,
        hardware,
    };
    let step_time = cost::step_time(&ctx, &request.cost);
    Ok(Tried::Fits(Box::new(Evaluated {
        fit: Fit {
            plan,
            gpu_peak: estimate.peaks.gpu,
            cpu_peak: estimate.peaks.cpu,
            nvme_bytes: estimate.peaks.nvme.bytes,
            step_time,
        },
        config,
        estimate,
    })))
}

#[cfg(test)]
mod tests;
