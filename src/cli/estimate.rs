//! `dsplan estimate`: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimates for a model and a cluster,
//! and with `--config` dsplan's full estimate of that configuration.
//!
//! Human output prints DeepSpeed's two tables exactly as DeepSpeed documents them (`cpu ` /
//! `none`), then the model summary and any assumption, then (with `--config`) dsplan's
//! per-phase breakdown: every term as a row, init / forward / backward / step as columns, for
//! the GPU, host memory and NVMe. Its model states, buffers and activations are the buffers of
//! the execution plan compiled from the config (`dsplan plan` shows the same list), at the
//! moment each phase peaks; the margins and initialisation transients are added. JSON output follows DESIGN.md's "Estimate JSON"; `full` is
//! the full estimate, or `null` without `--config`.

use super::cost_args::CostArgs;
use super::training_choices::{CheckpointingArg, PrecisionArg};
use super::{Format, Outcome};
use crate::units;
use clap::{ArgGroup, Args, ValueEnum};
use dsplan_planner::config::{OffloadDevice, ZeroStage};
use dsplan_planner::estimate::full::{
    AttentionKernel, Checkpointing, Context, Device, Margins, Overrides, Phase, Precision, Row,
    SetupError, TrainingShape, read_config,
};
use dsplan_planner::estimate::{
    BufferFactor, DeepSpeedRow, EnumSpelling, FullEstimate, FullEstimateError, Topology, ZeroInit,
    estimate_reading, zero2_all_cold_text, zero2_table, zero3_all_cold_text, zero3_table,
};
use dsplan_planner::model::notes::thousands;
use dsplan_planner::model::{self, ErrorKind, LmHead, ModelSpec, presets};
use dsplan_planner::recommend::cost::step_time;
use dsplan_planner::recommend::{CostModel, StepTime};
use dsplan_planner::source::SourceFile;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `dsplan estimate`.
#[derive(Debug, Args)]
#[command(
    group(ArgGroup::new("model_source").required(true).args(["params", "model", "megatron_args"])),
    after_long_help = presets_help()
)]
pub struct EstimateArgs {
    /// Total parameters: 2.7B, 350M, 65_798_144, 1.5e9.
    #[arg(long, value_name = "P", value_parser = units::count_arg)]
    params: Option<u64>,

    /// Parameters of the largest layer (one module's own parameters, DeepSpeed's definition).
    /// Without it, a GPT-3-shaped model of --params parameters is assumed and reported.
    #[arg(long, value_name = "L", requires = "params", value_parser = units::count_arg)]
    largest_layer: Option<u64>,

    /// A preset name or Hugging Face id (see below), a config.json, a *.safetensors file or a
    /// directory holding safetensors shards or a config.json.
    #[arg(long, value_name = "M")]
    model: Option<String>,

    /// One node with N GPUs.
    #[arg(long, value_name = "N", conflicts_with_all = ["gpus_per_node", "nodes"])]
    gpus: Option<u64>,

    /// GPUs per node (default 1).
    #[arg(long, value_name = "G")]
    gpus_per_node: Option<u64>,

    /// Number of nodes (default 1).
    #[arg(long, value_name = "K")]
    nodes: Option<u64>,

    /// DeepSpeed's additional_buffer_factor (multiplies the CPU estimates).
    #[arg(long, value_name = "F", default_value_t = 1.5)]
    buffer_factor: f64,

    /// Count the language-modelling head (default: exclude, the base model as AutoModel loads
    /// it, which is what DeepSpeed's documented examples measure).
    #[arg(long, value_enum, conflicts_with = "params")]
    lm_head: Option<LmHeadArg>,

    /// A DeepSpeed config: adds dsplan's full estimate of it (needs --seq-len).
    #[arg(long, value_name = "FILE", requires = "seq_len")]
    config: Option<PathBuf>,

    /// Training shape and memory knobs of the full estimate.
    #[command(flatten)]
    full: FullArgs,

    /// Also predict the config's step time with `recommend`'s cost model (its constants are
    /// the flags below).
    #[arg(long, requires = "config")]
    step_time: bool,

    #[command(flatten, next_help_heading = "Cost model (with --step-time)")]
    cost: CostArgs,

    /// Tensor, pipeline and sequence parallelism (the 3D estimate).
    #[command(flatten)]
    parallel: super::parallel::ParallelArgs,

    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// The flags of dsplan's full estimate (with `--config`; `recommend` shares most of them).
#[derive(Debug, Args)]
pub struct FullArgs {
    /// Tokens per sequence.
    #[arg(long, value_name = "S", requires = "config", value_parser = units::count_arg)]
    seq_len: Option<u64>,

    /// Sequences per GPU per micro-step (default: the config's train_micro_batch_size_per_gpu,
    /// or what its batch keys imply).
    #[arg(long, value_name = "B", requires = "config", value_parser = units::count_arg)]
    micro_batch: Option<u64>,

    /// Activation checkpointing (default: full when the config has an activation_checkpointing
    /// section, else none).
    #[arg(long, value_enum, value_name = "MODE", requires = "config")]
    activation_checkpointing: Option<CheckpointingArg>,

    /// Attention runs as FlashAttention (no seq x seq score matrix is stored).
    #[arg(long, requires = "config")]
    flash_attention: bool,

    /// Training precision (fills or overrides the config's fp16/bf16 sections).
    #[arg(long, value_enum, requires = "config")]
    precision: Option<PrecisionArg>,

    /// ZeRO-3: whether the model is built under zero.Init (default enabled, as the Hugging Face
    /// Trainer does).
    #[arg(long, value_enum, requires = "config")]
    zero_init: Option<ZeroInitArg>,

    #[command(flatten)]
    margins: MarginArgs,
}

/// The runtime margins, with their documented defaults.
#[derive(Debug, Args)]
pub struct MarginArgs {
    /// CUDA context, cuBLAS and NCCL workspaces per GPU (0.3-2 GB are reported).
    #[arg(long, value_name = "MEM", default_value = "1GiB", value_parser = units::memory_arg)]
    pub cuda_context: u64,

    /// Caching-allocator fragmentation, as a fraction of the GPU buffers and activations.
    #[arg(long, value_name = "F", default_value_t = dsplan_planner::estimate::full::overhead::DEFAULT_FRAGMENTATION)]
    pub fragmentation: f64,

    /// Host memory of one training process besides its tensors.
    #[arg(long, value_name = "MEM", default_value = "2GiB", value_parser = units::memory_arg)]
    pub host_overhead: u64,

    /// Bytes per parameter of the model each rank loads on the host before DeepSpeed takes it
    /// (4: fp32, as DeepSpeed's estimators assume; 2 for a 16-bit load).
    #[arg(long, value_name = "BYTES", default_value_t = 4)]
    pub model_load_bytes: u64,
}

impl MarginArgs {
    /// The margins the planner takes.
    pub fn margins(&self) -> Margins {
        Margins {
            cuda_context_bytes: self.cuda_context,
            fragmentation: self.fragmentation,
            host_process_bytes: self.host_overhead,
            load_bytes_per_param: self.model_load_bytes,
        }
    }
}

/// `--zero-init enabled|disabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ZeroInitArg {
    /// The model is built partitioned.
    Enabled,
    /// The model is built whole, then partitioned.
    Disabled,
}

impl From<ZeroInitArg> for ZeroInit {
    fn from(arg: ZeroInitArg) -> ZeroInit {
        match arg {
            ZeroInitArg::Enabled => ZeroInit::Enabled,
            ZeroInitArg::Disabled => ZeroInit::Disabled,
        }
    }
}

/// `--lm-head include|exclude`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LmHeadArg {
    /// Count the head (`*ForCausalLM`, `T5ForConditionalGeneration`, `BertForMaskedLM`).
    Include,
    /// Count the base model only (`AutoModel`).
    Exclude,
}

impl From<LmHeadArg> for LmHead {
    fn from(arg: LmHeadArg) -> LmHead {
        match arg {
            LmHeadArg::Include => LmHead::Include,
            LmHeadArg::Exclude => LmHead::Exclude,
        }
    }
}

/// The list of presets with their computed default counts, for `--help`.
fn presets_help() -> String {
    let mut help =
        String::from("Presets (parameters without the LM head; Hugging Face ids work too):\n");
    for preset in presets::PRESETS {
        let params = model::load::from_preset(preset, LmHead::Exclude).map_or_else(
            |error| error.to_string(),
            |spec| thousands(spec.total_params),
        );
        let hub_id = preset
            .hub_id
            .unwrap_or("(the reference GPT-2 fixtures' shape)");
        help.push_str(&format!("  {:<18} {:>17}  {hub_id}\n", preset.name, params));
    }
    help
}

/// The `estimate` JSON document.
#[derive(Serialize)]
struct EstimateJson<'a> {
    model: ModelJson<'a>,
    hardware: Topology,
    additional_buffer_factor: BufferFactor,
    deepspeed: Vec<DeepSpeedRow>,
    full: Option<FullEstimate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    step_time: Option<PredictedStep>,
}

/// `--step-time`: the cost model's predicted step of the config, and the constants it used.
#[derive(Serialize)]
struct PredictedStep {
    seconds: StepTime,
    cost_model: CostModel,
}

/// The `model` object: DESIGN.md's three keys first, then the details.
#[derive(Serialize)]
struct ModelJson<'a> {
    total_params: u64,
    largest_layer_params: u64,
    source: String,
    name: &'a str,
    largest_layer_module: Option<&'a str>,
    lm_head: Option<model::LmHeadReport>,
    architecture: Option<model::Architecture>,
    notes: &'a [model::Note],
}

/// Runs `dsplan estimate`.
pub fn run(args: EstimateArgs) -> Outcome {
    match estimate(&args) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            Outcome::Success
        }
        Err((outcome, message)) => {
            if !message.is_empty() {
                say!("error: {}", crate::render::escape_controls(&message));
            }
            outcome
        }
    }
}

type Failure = (Outcome, String);

fn usage(message: impl ToString) -> Failure {
    (Outcome::UsageError, message.to_string())
}

fn estimate(args: &EstimateArgs) -> Result<String, Failure> {
    let hardware = match args.gpus {
        Some(gpus) => Topology::new(gpus, 1),
        None => Topology::new(args.gpus_per_node.unwrap_or(1), args.nodes.unwrap_or(1)),
    }
    .map_err(usage)?;
    if let Some(text) = parallel_estimate(args, hardware)? {
        return Ok(text);
    }
    let factor = BufferFactor::new(args.buffer_factor).map_err(usage)?;
    let spec = model_spec(args)?;
    let total = spec.total_params;
    let largest = spec.largest_layer.params;
    let too_large = |error| {
        (
            Outcome::InputRejected,
            format!("{error} for this model and cluster"),
        )
    };

    let full = match &args.config {
        Some(path) => Some(full_estimate(args, path, &spec, hardware)?),
        None if args.full.margins.margins() != Margins::default() => {
            return Err(usage(
                "--cuda-context, --fragmentation, --host-overhead and --model-load-bytes adjust the full estimate: they need --config",
            ));
        }
        None => None,
    };
    let step_time = match &full {
        Some(full) if args.step_time => Some(predicted_step(full, &args.cost)?),
        _ if !args.cost.all_default() => {
            return Err(usage(
                "--peak-tflops, --compute-efficiency, --intra-node-gbps, --inter-node-gbps, --host-link-gbps, --hbm-gbps, --cpu-adam-gparams and --nvme-gbps set the step-time cost model: they need --step-time",
            ));
        }
        _ => None,
    };

    match args.format {
        Format::Json => {
            let mut rows = zero2_table(total, hardware, factor).map_err(too_large)?;
            rows.extend(zero3_table(total, largest, hardware, factor).map_err(too_large)?);
            let document = EstimateJson {
                model: ModelJson {
                    total_params: total,
                    largest_layer_params: largest,
                    source: spec.source.to_string(),
                    name: &spec.name,
                    largest_layer_module: spec.largest_layer.module.as_deref(),
                    lm_head: spec.lm_head,
                    architecture: spec.architecture,
                    notes: &spec.notes,
                },
                hardware,
                additional_buffer_factor: factor,
                deepspeed: rows,
                full,
                step_time,
            };
            let json = serde_json::to_string_pretty(&document)
                .map_err(|error| (Outcome::UsageError, format!("cannot render JSON: {error}")))?;
            Ok(json + "\n")
        }
        Format::Human => {
            let spelling = EnumSpelling::Padded;
            let zero2 =
                zero2_all_cold_text(total, hardware, factor, spelling).map_err(too_large)?;
            let zero3 = zero3_all_cold_text(total, largest, hardware, factor, spelling)
                .map_err(too_large)?;
            let mut text = format!("{zero2}\n{zero3}\n{}", summary(&spec));
            if let Some(full) = &full {
                text.push('\n');
                text.push_str(&breakdown(full));
            }
            if let Some(step) = &step_time {
                text.push_str(&step_line(step));
            }
            Ok(text)
        }
    }
}

/// The cost model's step for the estimated config (`recommend`'s formulas, unchanged).
fn predicted_step(full: &FullEstimate, cost: &CostArgs) -> Result<PredictedStep, Failure> {
    let cost_model = cost.cost_model(CostModel::default().tie_tolerance);
    cost_model.check().map_err(usage)?;
    let ctx = Context {
        model: &full.model,
        setup: &full.setup,
        shape: &full.shape,
        hardware: full.hardware,
    };
    Ok(PredictedStep {
        seconds: step_time(&ctx, &cost_model),
        cost_model,
    })
}

/// The human line of `--step-time`.
fn step_line(step: &PredictedStep) -> String {
    let time = &step.seconds;
    let cost = &step.cost_model;
    format!(
        "Predicted step (recommend's cost model): {:.3} s: compute {:.3}, exposed communication {:.3}, offload traffic {:.3}, optimizer {:.3} ({:.1} TFLOP/s peak x {:.2}, host link {:.0} GB/s, HBM {:.0} GB/s, CPU Adam {:.3} G params/s).\n",
        time.total,
        time.compute,
        time.communication,
        time.offload,
        time.optimizer,
        cost.peak_flops / 1e12,
        cost.compute_efficiency,
        cost.host_link_bandwidth / 1e9,
        cost.hbm_bandwidth / 1e9,
        cost.cpu_adam_rate / 1e9,
    )
}

/// The 3D estimate, when asked for: `--megatron-args`, `--tp/--pp/--vpp/--sp`, or a config
/// with a model-parallel degree above 1 (`None` otherwise: DeepSpeed's tables as before).
fn parallel_estimate(args: &EstimateArgs, hardware: Topology) -> Result<Option<String>, Failure> {
    use super::parallel::{self, JobInputs};
    let flagged = args.parallel.megatron_args.is_some() || args.parallel.any_layout_flag();
    let read = match &args.config {
        Some(path) => match parallel::read_config(path) {
            Ok(read) => Some(read),
            Err(failure) if flagged => return Err(failure),
            // Not usable: the DeepSpeed path reports it, as before.
            Err(_) => return Ok(None),
        },
        None => None,
    };
    let wanted = flagged
        || read
            .as_ref()
            .is_some_and(|read| parallel::config_wants_parallel(read, &args.parallel));
    if !wanted {
        return Ok(None);
    }
    let full = &args.full;
    let source = parallel::build_job(&JobInputs {
        args: &args.parallel,
        world: hardware.total_gpus(),
        config: read.as_ref(),
        model: args.model.as_deref(),
        seq_len: full.seq_len,
        micro_batch: full.micro_batch,
        checkpointing: full.activation_checkpointing,
        precision: full.precision,
        flash_attention: full.flash_attention,
    })?;
    parallel::estimate::run(&source, hardware, &full.margins.margins(), args.format).map(Some)
}

/// Reads `--config` and runs the full estimate.
fn full_estimate(
    args: &EstimateArgs,
    path: &std::path::Path,
    spec: &ModelSpec,
    hardware: Topology,
) -> Result<FullEstimate, Failure> {
    let display = crate::render::escape_controls(&path.display().to_string()).into_owned();
    let bytes = super::read_input(path).map_err(|diagnostic| usage(diagnostic.message))?;
    let (file, _) = SourceFile::parse(&display, &bytes).map_err(|fatal| {
        let first = fatal
            .iter()
            .find(|d| d.is_error())
            .map_or_else(String::new, |d| {
                format!(": {}", crate::render::escape_controls(&d.message))
            });
        (
            Outcome::InputRejected,
            format!(
                "{display} is not a usable JSON config{first} (dsplan validate {display} shows where)"
            ),
        )
    })?;
    let full = &args.full;
    let overrides = Overrides {
        precision: full.precision.map(Precision::from),
        micro_batch: full.micro_batch,
        checkpointing: full.activation_checkpointing.map(Checkpointing::from),
        zero_init: full.zero_init.map(ZeroInit::from),
    };
    let hidden = spec.architecture.map(|arch| arch.hidden);
    let reading = read_config(file.value(), hardware, hidden, &overrides).map_err(|error| {
        if let SetupError::Refused(found) = &error {
            let mut found = found.clone();
            file.locate_all(&mut found);
            say_text!("{}", crate::render::human(&file, &found));
        }
        (Outcome::InputRejected, format!("{display}: {error}"))
    })?;
    let shape = TrainingShape {
        seq_len: full
            .seq_len
            .ok_or_else(|| usage("--config needs --seq-len"))?,
        micro_batch: reading.micro_batch,
        checkpointing: reading.checkpointing,
        checkpoint_placement: reading.checkpoint_placement,
        attention: if full.flash_attention {
            AttentionKernel::Flash
        } else {
            AttentionKernel::Eager
        },
    };
    estimate_reading(spec, hardware, &reading, &shape, &full.margins.margins()).map_err(|error| {
        match error {
            FullEstimateError::BadShape { .. } | FullEstimateError::Margin(_) => usage(error),
            FullEstimateError::Model(_) | FullEstimateError::Refused(_) => {
                (Outcome::InputRejected, format!("{display}: {error}"))
            }
        }
    })
}

const GIB: f64 = (1u64 << 30) as f64;

/// GiB with two decimals, `-` for nothing.
fn gib(bytes: u64) -> String {
    if bytes == 0 {
        "-".to_owned()
    } else {
        units::gib_figure(bytes)
    }
}

/// One line describing the configuration an estimate is for.
pub fn describe(estimate: &FullEstimate) -> String {
    let setup = &estimate.setup;
    let zero = &setup.zero;
    let mut parts = vec![format!("ZeRO-{}", zero.stage.number())];
    if zero.optimizer_offloaded() {
        let device = match zero.offload_optimizer.device {
            OffloadDevice::Nvme if zero.stage == ZeroStage::Weights => "nvme",
            _ => "cpu",
        };
        if zero.stage == ZeroStage::Weights && zero.offload_optimizer.ratio < 1.0 {
            parts.push(format!(
                "optimizer offload {device} (ratio {})",
                zero.offload_optimizer.ratio
            ));
        } else {
            parts.push(format!("optimizer offload {device}"));
        }
    }
    if zero.params_offloaded() {
        let device = match zero.offload_param.device {
            OffloadDevice::Nvme => "nvme",
            _ => "cpu",
        };
        parts.push(format!("param offload {device}"));
    }
    parts.push(setup.precision.name().to_owned());
    parts.push(setup.optimizer.name.clone());
    let shape = &estimate.shape;
    parts.push(format!(
        "seq {} x micro-batch {} x {} accumulation steps",
        shape.seq_len, shape.micro_batch, setup.gradient_accumulation_steps
    ));
    parts.push(
        match shape.checkpointing {
            Checkpointing::None => "no checkpointing",
            Checkpointing::Selective => "selective recompute",
            Checkpointing::Full => "full checkpointing",
        }
        .to_owned(),
    );
    parts.push(
        match shape.attention {
            AttentionKernel::Eager => "eager attention",
            AttentionKernel::Flash => "flash attention",
        }
        .to_owned(),
    );
    let hardware = estimate.hardware;
    parts.push(format!(
        "{} GPU(s) ({} node(s) x {})",
        hardware.total_gpus(),
        hardware.nodes(),
        hardware.gpus_per_node()
    ));
    parts.join(", ")
}

/// dsplan's per-phase breakdown: rows x phases for the GPU, host memory and NVMe.
pub fn breakdown(estimate: &FullEstimate) -> String {
    let mut text = format!(
        "dsplan full estimate: {}
",
        describe(estimate)
    );
    let sections: [(&str, &dyn Fn(Device) -> bool); 3] = [
        ("GPU, per GPU", &|d| d == Device::Gpu),
        ("host memory, per node", &Device::is_cpu),
        ("NVMe, per node", &|d| d == Device::Nvme),
    ];
    for (title, keep) in sections {
        let rows: Vec<&Row> = estimate.rows.iter().filter(|r| keep(r.device)).collect();
        if rows.iter().all(|r| r.bytes.is_zero()) {
            continue;
        }
        text.push_str(&format!(
            "  {:<34}{:>10}{:>10}{:>10}{:>10}\n",
            format!("{title} (GiB)"),
            "init",
            "forward",
            "backward",
            "step"
        ));
        let mut total = dsplan_planner::estimate::full::PhaseBytes::default();
        for row in rows {
            total = total.plus(row.bytes);
            let label = match row.device {
                Device::CpuPinned => format!("{} (pinned)", row.term.label()),
                _ => row.term.label().to_owned(),
            };
            text.push_str(&format!("    {label:<32}"));
            for phase in Phase::ALL {
                text.push_str(&format!("{:>10}", gib(row.bytes.get(phase))));
            }
            text.push('\n');
        }
        text.push_str(&format!("    {:<32}", "total"));
        for phase in Phase::ALL {
            text.push_str(&format!("{:>10}", gib(total.get(phase))));
        }
        text.push('\n');
    }
    let peaks = &estimate.peaks;
    text.push_str(&format!(
        "Peak: {} GiB per GPU ({}), {} GiB of host memory per node ({}, {} GiB pinned)",
        gib(peaks.gpu.bytes),
        peaks.gpu.phase.title(),
        gib(peaks.cpu.bytes),
        peaks.cpu.phase.title(),
        format_args!(
            "{:.2}",
            estimate.totals.cpu_pinned.get(peaks.cpu.phase) as f64 / GIB
        ),
    ));
    if peaks.nvme.bytes > 0 {
        text.push_str(&format!(", {} GiB of NVMe per node", gib(peaks.nvme.bytes)));
    }
    text.push_str(".\n");
    if let Some(deepspeed) = &estimate.deepspeed {
        text.push_str(&format!(
            "DeepSpeed's estimator for this setup: {:.2} GiB per GPU, {:.2} GiB per node (model states only, x1.5 on the host); dsplan's GPU peak is {:.2} GiB more.\n",
            deepspeed.gpu_bytes as f64 / GIB,
            deepspeed.cpu_bytes as f64 / GIB,
            (peaks.gpu.bytes as f64 - deepspeed.gpu_bytes as f64) / GIB,
        ));
    }
    for note in &estimate.notes {
        text.push_str(&format!("Note: {note}\n"));
    }
    text
}

fn model_spec(args: &EstimateArgs) -> Result<ModelSpec, Failure> {
    let result = match (&args.model, args.params) {
        (Some(reference), _) => model::load(
            reference,
            args.lm_head.map(LmHead::from).unwrap_or_default(),
        ),
        (None, Some(params)) => model::from_params(params, args.largest_layer),
        (None, None) => return Err(usage("pass --params P or --model M")),
    };
    result.map_err(|error| {
        let outcome = match error.kind() {
            ErrorKind::UsageOrIo => Outcome::UsageError,
            ErrorKind::Input => Outcome::InputRejected,
        };
        (outcome, error.to_string())
    })
}

/// The model summary printed after DeepSpeed's tables.
fn summary(spec: &ModelSpec) -> String {
    let mut text = String::new();
    let origin = match &spec.source {
        model::ModelSource::Params => "given on the command line".to_owned(),
        model::ModelSource::Preset {
            hub_id: Some(hub_id),
            ..
        } => format!("built-in preset for {hub_id}"),
        model::ModelSource::Preset { hub_id: None, .. } => "built-in test preset".to_owned(),
        model::ModelSource::HfConfig { .. } => "Hugging Face config.json".to_owned(),
        model::ModelSource::Safetensors { files, tensors, .. } => {
            format!(
                "{tensors} tensors in {} safetensors file(s), headers only",
                files.len()
            )
        }
    };
    text.push_str(&format!("Model: {} ({origin})\n", spec.name));
    text.push_str(&format!(
        "  total params          {}\n",
        thousands(spec.total_params)
    ));
    let module = spec
        .largest_layer
        .module
        .as_deref()
        .map_or(String::new(), |module| format!(" (`{module}`)"));
    text.push_str(&format!(
        "  largest layer params  {}{module}\n",
        thousands(spec.largest_layer.params)
    ));
    if let Some(head) = spec.lm_head {
        let line = match (head.choice, head.extra_params) {
            (_, 0) => "adds no parameters (tied to the embeddings, or absent)".to_owned(),
            (LmHead::Exclude, extra) => {
                format!(
                    "not counted ({} params); --lm-head include counts it",
                    thousands(extra)
                )
            }
            (LmHead::Include, extra) => format!("counted ({} params)", thousands(extra)),
        };
        text.push_str(&format!("  LM head               {line}\n"));
    }
    if let Some(arch) = &spec.architecture {
        text.push_str(&format!("  architecture          {}\n", arch.describe()));
    }
    for note in &spec.notes {
        let label = match note {
            model::Note::InferredLargestLayer { .. } | model::Note::ConfigDefault { .. } => {
                "Assumption"
            }
            model::Note::ConfigDisagrees { .. } | model::Note::ConfigUnused { .. } => "Note",
        };
        text.push_str(&format!("{label}: {}\n", note.message()));
    }
    text
}
