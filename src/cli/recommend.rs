//! `dsplan recommend`: the fastest DeepSpeed configuration that fits, as a ready
//! `ds_config.json`, with the candidates it rejected and why.
//!
//! Human output: the choice and its predicted step, the table of every candidate of the walk,
//! the cost-model constants, dsplan's per-phase breakdown of the chosen config, then the config
//! itself (or where it was written with `--output`). JSON output carries the same, with the full
//! estimate. Exit 1 when nothing fits (the table says why each candidate failed).

use super::cost_args::CostArgs;
use super::estimate::{MarginArgs, breakdown};
use super::training_choices::{CheckpointingArg, PrecisionArg};
use super::{Format, Outcome};
use crate::units;
use crate::units::gib_figure as gib;
use clap::Args;
use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::{AttentionKernel, Checkpointing, Precision};
use dsplan_planner::model::{self, ErrorKind, LmHead, ModelSpec};
use dsplan_planner::recommend::{
    Candidate, Cluster, CostModel, Fit, RecommendError, Recommendation, Rejection, Request,
    recommend,
};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `dsplan recommend`.
#[derive(Debug, Args)]
pub struct RecommendArgs {
    /// A preset name or Hugging Face id, a config.json, or safetensors (as for `estimate`).
    #[arg(long, value_name = "M")]
    model: String,

    /// Count the language-modelling head (default: include, the model a training run holds).
    #[arg(long, value_enum, default_value = "include")]
    lm_head: LmHeadChoice,

    /// GPUs per node (with --gpus: default 8).
    #[arg(long, value_name = "G", required_unless_present = "gpus")]
    gpus_per_node: Option<u64>,

    /// GPUs in all: search 3D layouts (tensor, pipeline, virtual pipeline, Megatron or
    /// Ulysses sequence parallelism, data parallelism with ZeRO 0-3, micro-batch, recompute)
    /// instead of the ZeRO walk of one cluster shape, and print a ds_config.json plus
    /// Megatron-DeepSpeed flags.
    #[arg(long, value_name = "N", conflicts_with_all = ["nodes", "cpu_memory", "nvme_path"])]
    gpus: Option<u64>,

    /// Number of nodes.
    #[arg(long, value_name = "K", default_value_t = 1)]
    nodes: u64,

    /// Memory of one GPU: 80GiB, 32GiB, 141GB.
    #[arg(long, value_name = "MEM", value_parser = units::memory_arg)]
    gpu_memory: u64,

    /// Host memory of one node; without it, offload is not considered.
    #[arg(long, value_name = "MEM", value_parser = units::memory_arg)]
    cpu_memory: Option<u64>,

    /// A directory on NVMe; without it, NVMe offload is not considered.
    #[arg(long, value_name = "PATH")]
    nvme_path: Option<String>,

    /// Tokens per sequence.
    #[arg(long, value_name = "S", value_parser = units::count_arg)]
    seq_len: u64,

    /// Target global batch (train_batch_size): sequences per optimizer step.
    #[arg(long, value_name = "B", value_parser = units::count_arg)]
    global_batch: u64,

    /// Training precision.
    #[arg(long, value_enum, default_value = "bf16")]
    precision: PrecisionArg,

    /// Activation checkpointing of the model.
    #[arg(long, value_enum, value_name = "MODE", default_value = "none")]
    activation_checkpointing: CheckpointingArg,

    /// Attention runs as FlashAttention.
    #[arg(long)]
    flash_attention: bool,

    /// Write the recommended ds_config.json here.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,

    #[command(flatten)]
    cost: CostArgs,

    /// Step times closer than this fraction are a tie, won by the simpler configuration.
    #[arg(long, value_name = "F", default_value_t = 0.05)]
    tie_tolerance: f64,

    #[command(flatten)]
    margins: MarginArgs,

    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// `--lm-head include|exclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LmHeadChoice {
    /// Count the head.
    Include,
    /// Count the base model only.
    Exclude,
}

/// The `recommend` JSON document.
#[derive(Serialize)]
struct RecommendJson<'a> {
    model: ModelJson<'a>,
    cluster: &'a Cluster,
    seq_len: u64,
    global_batch: u64,
    chosen: Option<&'a Fit>,
    config: Option<&'a serde_json::Value>,
    candidates: &'a [Candidate],
    cost: CostModel,
    estimate: Option<&'a dsplan_planner::estimate::FullEstimate>,
}

#[derive(Serialize)]
struct ModelJson<'a> {
    name: &'a str,
    total_params: u64,
    largest_layer_params: u64,
    source: String,
}

type Failure = (Outcome, String);

/// Runs `dsplan recommend`.
pub fn run(args: RecommendArgs) -> Outcome {
    match run_inner(&args) {
        Ok((text, outcome)) => {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            outcome
        }
        Err((outcome, message)) => {
            if !message.is_empty() {
                say!("error: {message}");
            }
            outcome
        }
    }
}

fn run_inner(args: &RecommendArgs) -> Result<(String, Outcome), Failure> {
    let usage = |message: String| (Outcome::UsageError, message);
    // `--output` must not be the model it reads (or lie inside its directory), checked before
    // the model is read.
    if let Some(output) = &args.output {
        use super::outputs::{Paths, Shape};
        let mut paths = Paths::default();
        let model = std::path::Path::new(&args.model);
        if dsplan_planner::user_file::exists(model) {
            let shape = if model.is_dir() {
                Shape::Directory
            } else {
                Shape::File
            };
            paths.input("--model", model, shape);
        }
        if let Some(nvme) = &args.nvme_path {
            paths.input("--nvme-path", std::path::Path::new(nvme), Shape::Directory);
        }
        paths.output("--output", output, Shape::File);
        paths.check().map_err(usage)?;
    }
    if let Some(gpus) = args.gpus {
        let spec = model_spec(args)?;
        return super::parallel::recommend::run(&super::parallel::recommend::RecommendInputs {
            spec: &spec,
            gpus,
            gpus_per_node: args.gpus_per_node.unwrap_or(8),
            gpu_memory: args.gpu_memory,
            seq_len: args.seq_len,
            global_batch: args.global_batch,
            precision: Precision::from(args.precision),
            attention: if args.flash_attention {
                AttentionKernel::Flash
            } else {
                AttentionKernel::Eager
            },
            cost: args.cost.cost_model(args.tie_tolerance),
            margins: args.margins.margins(),
            output: args.output.as_deref(),
            format: args.format,
        });
    }
    let Some(gpus_per_node) = args.gpus_per_node else {
        return Err(usage(
            "give --gpus-per-node (or --gpus for a 3D search)".into(),
        ));
    };
    let hardware = Topology::new(gpus_per_node, args.nodes).map_err(|e| usage(e.to_string()))?;
    let spec = model_spec(args)?;
    let request = Request {
        model: spec.clone(),
        cluster: Cluster {
            hardware,
            gpu_memory: args.gpu_memory,
            cpu_memory: args.cpu_memory,
            nvme_path: args.nvme_path.clone(),
        },
        seq_len: args.seq_len,
        checkpointing: Checkpointing::from(args.activation_checkpointing),
        attention: if args.flash_attention {
            AttentionKernel::Flash
        } else {
            AttentionKernel::Eager
        },
        global_batch: args.global_batch,
        precision: Precision::from(args.precision),
        margins: args.margins.margins(),
        cost: args.cost.cost_model(args.tie_tolerance),
    };
    let (recommendation, candidates) = match recommend(&request) {
        Ok(recommendation) => {
            let candidates = recommendation.candidates.clone();
            (Some(recommendation), candidates)
        }
        Err(RecommendError::NothingFits(candidates)) => (None, candidates),
        Err(error @ RecommendError::Config(_)) => {
            return Err((Outcome::InputRejected, error.to_string()));
        }
        Err(error) => return Err(usage(error.to_string())),
    };
    if let (Some(recommendation), Some(path)) = (&recommendation, &args.output) {
        let text = serde_json::to_string_pretty(&recommendation.config)
            .map_err(|error| usage(format!("cannot render the config: {error}")))?;
        dsplan_executor::io::write_output(path, (text + "\n").as_bytes())
            .map_err(|error| usage(format!("cannot write {}: {error}", path.display())))?;
    }
    let outcome = if recommendation.is_some() {
        Outcome::Success
    } else {
        Outcome::InputRejected
    };
    let text = match args.format {
        Format::Json => {
            let document = RecommendJson {
                model: ModelJson {
                    name: &spec.name,
                    total_params: spec.total_params,
                    largest_layer_params: spec.largest_layer.params,
                    source: spec.source.to_string(),
                },
                cluster: &request.cluster,
                seq_len: request.seq_len,
                global_batch: request.global_batch,
                chosen: recommendation.as_ref().map(|r| &r.chosen),
                config: recommendation.as_ref().map(|r| &r.config),
                candidates: &candidates,
                cost: request.cost,
                estimate: recommendation.as_ref().map(|r| &r.estimate),
            };
            serde_json::to_string_pretty(&document)
                .map_err(|error| usage(format!("cannot render JSON: {error}")))?
                + "\n"
        }
        Format::Human => human(&request, recommendation.as_ref(), &candidates, args)?,
    };
    Ok((text, outcome))
}

fn model_spec(args: &RecommendArgs) -> Result<ModelSpec, Failure> {
    let head = match args.lm_head {
        LmHeadChoice::Include => LmHead::Include,
        LmHeadChoice::Exclude => LmHead::Exclude,
    };
    model::load(&args.model, head).map_err(|error| {
        let outcome = match error.kind() {
            ErrorKind::UsageOrIo => Outcome::UsageError,
            ErrorKind::Input => Outcome::InputRejected,
        };
        (outcome, error.to_string())
    })
}

/// The plan in words: micro-batch, accumulation, offload share.
fn plan_words(fit: &Fit, world: u64) -> String {
    let plan = &fit.plan;
    let ratio = plan
        .offload_ratio
        .map_or(String::new(), |ratio| format!(", offload ratio {ratio:.3}"));
    format!(
        "micro-batch {} x {} accumulation steps x {world} GPUs{ratio}",
        plan.micro_batch, plan.accumulation
    )
}

fn verdict(candidate: &Candidate, request: &Request) -> String {
    let world = request.cluster.hardware.total_gpus();
    let fitted = candidate.fit.as_ref().map_or(String::new(), |fit| {
        format!(
            "{}; {} GiB/GPU, {} GiB host; {:.1} s/step",
            plan_words(fit, world),
            gib(fit.gpu_peak.bytes),
            gib(fit.cpu_peak.bytes),
            fit.step_time.total
        )
    });
    match &candidate.rejection {
        None => format!("chosen: {fitted}"),
        Some(Rejection::Slower { seconds_more }) => {
            format!("fits, {seconds_more:.1} s/step slower: {fitted}")
        }
        Some(Rejection::Tie { seconds_less }) => format!(
            "fits, within {:.0} % of the chosen ({seconds_less:.1} s/step less), the simpler one wins: {fitted}",
            request.cost.tie_tolerance * 100.0
        ),
        Some(Rejection::GpuMemory { needed, available }) => format!(
            "does not fit: {} GiB per GPU at micro-batch 1, {} GiB available",
            gib(*needed),
            gib(*available)
        ),
        Some(Rejection::CpuMemory { needed, available }) => format!(
            "does not fit: {} GiB of host memory per node, {} GiB available",
            gib(*needed),
            gib(*available)
        ),
        Some(Rejection::NoCpuMemory) => "not considered: offload needs --cpu-memory".to_owned(),
        Some(Rejection::NoNvmePath) => "not considered: NVMe offload needs --nvme-path".to_owned(),
    }
}

fn human(
    request: &Request,
    recommendation: Option<&Recommendation>,
    candidates: &[Candidate],
    args: &RecommendArgs,
) -> Result<String, Failure> {
    let world = request.cluster.hardware.total_gpus();
    let mut text = String::new();
    match recommendation {
        Some(recommendation) => {
            let fit = &recommendation.chosen;
            let time = &fit.step_time;
            text.push_str(&format!(
                "Recommended: {}, {}\n",
                fit.plan.strategy.name(),
                plan_words(fit, world)
            ));
            text.push_str(&format!(
                "  predicted step {:.1} s: compute {:.1}, exposed communication {:.1}, offload traffic {:.1}, optimizer {:.1}\n",
                time.total, time.compute, time.communication, time.offload, time.optimizer
            ));
            let host = request
                .cluster
                .cpu_memory
                .map_or(String::new(), |available| format!(" of {}", gib(available)));
            text.push_str(&format!(
                "  memory: {} of {} GiB per GPU ({}), {}{host} GiB of host memory per node ({})\n",
                gib(fit.gpu_peak.bytes),
                gib(request.cluster.gpu_memory),
                fit.gpu_peak.phase.title(),
                gib(fit.cpu_peak.bytes),
                fit.cpu_peak.phase.title(),
            ));
        }
        None => text.push_str("No configuration fits this model on this cluster.\n"),
    }
    text.push_str("\nCandidates, fastest first:\n");
    for candidate in candidates {
        text.push_str(&format!(
            "  {:<38} {}\n",
            candidate.strategy.name(),
            verdict(candidate, request)
        ));
    }
    let cost = &request.cost;
    text.push_str(&format!(
        "\nCost model: {:.1} TFLOP/s peak x {:.2}; NVLink {:.0} GB/s, network {:.0} GB/s, host link {:.0} GB/s per GPU; CPU Adam {:.3} G params/s and NVMe {:.0} GB/s per node (override with --peak-tflops, --compute-efficiency, --intra-node-gbps, --inter-node-gbps, --host-link-gbps, --cpu-adam-gparams, --nvme-gbps).\n",
        cost.peak_flops / 1e12,
        cost.compute_efficiency,
        cost.intra_node_bandwidth / 1e9,
        cost.inter_node_bandwidth / 1e9,
        cost.host_link_bandwidth / 1e9,
        cost.cpu_adam_rate / 1e9,
        cost.nvme_bandwidth / 1e9,
    ));
    if let Some(recommendation) = recommendation {
        text.push('\n');
        text.push_str(&breakdown(&recommendation.estimate));
        if request.checkpointing != Checkpointing::None {
            text.push_str(
                "Note: turn activation checkpointing on in the model too (Hugging Face: --gradient_checkpointing).\n",
            );
        }
        if request.attention == AttentionKernel::Flash {
            text.push_str("Note: the estimate assumes FlashAttention (Hugging Face: attn_implementation=\"flash_attention_2\").\n");
        }
        match &args.output {
            Some(path) => text.push_str(&format!("\nWrote {}\n", path.display())),
            None => {
                let config =
                    serde_json::to_string_pretty(&recommendation.config).map_err(|error| {
                        (
                            Outcome::UsageError,
                            format!("cannot render the config: {error}"),
                        )
                    })?;
                text.push_str(&format!("\nds_config.json:\n{config}\n"));
            }
        }
    }
    Ok(text)
}
