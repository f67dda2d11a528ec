//! `dsplan plan FILE --model M --world-size N`: the explicit execution plan.
//!
//! `--backend` picks whose buffers the plan lists: DeepSpeed's on GPUs (the default), or
//! dsplan's CPU executor's (`dsplan-cpu`: the plan `dsplan run` compiles and measures against,
//! with the in-process collectives' lack of `all_gather_into_tensor`), or dsplan's CUDA
//! executor's on one GPU (`dsplan-cuda`: what `dsplan run --device cuda` allocates; world size
//! 1 only, anything else is refused with exit 1).
//!
//! `human` prints a compact summary (settings, the engine the executor runs with its gradient
//! norm rule and gradient average, the run's optimizer, loss scaling, clipping and schedule, layout, shards, buckets, stage-3 schedule,
//! offload copies, peak memory per phase, step time, diagnostics); `json` the whole plan;
//! `trace` Chrome trace-event JSON of one step (Perfetto, chrome://tracing). Diagnostics of the
//! file go to stderr. Exit 1 when the config is refused or, with `--gpu-memory`, when the plan
//! does not fit.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dsplan_planner::config;
use dsplan_planner::diagnostics::{Code, Diagnostic, Severity};
use dsplan_planner::estimate::ZeroInit;
use dsplan_planner::model::notes::thousands;
use dsplan_planner::model::{self, ErrorKind, LmHead};
use dsplan_planner::plan::buckets::FlushPoint;
use dsplan_planner::plan::shards::ShardRule;
use dsplan_planner::plan::stage3::Pass;
use dsplan_planner::plan::{
    self, AttentionKernel, CheckpointPlacement, Checkpointing, Cluster, Device, GradientAveraging,
    ModelGraph, Plan, PlanBackend, Workload,
};
use dsplan_planner::validate::{self, ValidateOptions};

use super::Outcome;

mod compare;
mod host_offload;
mod training;
use super::estimate::ZeroInitArg;
use super::training_choices::CheckpointingArg;
use crate::{render, units};

/// Rows of a table shown before "... N more".
const ROWS: usize = 12;

/// Arguments of `dsplan plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The DeepSpeed config (resolved: no "auto" left).
    #[arg(value_name = "FILE", required_unless_present = "megatron_args")]
    file: Option<PathBuf>,
    /// A preset name or Hugging Face id, a config.json, or a directory with one.
    #[arg(long, value_name = "M", required_unless_present = "megatron_args")]
    model: Option<String>,
    /// Data-parallel world size (ranks).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    world_size: u64,
    /// GPUs per node (default: 8, or the world size when smaller).
    #[arg(long, value_name = "G", value_parser = clap::value_parser!(u64).range(1..))]
    gpus_per_node: Option<u64>,
    /// Tokens per sample (default: the model's context length).
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u64).range(1..))]
    seq_len: Option<u64>,
    /// Activation checkpointing of the training script: `full` (the flag alone) keeps each
    /// block's input and recomputes the block in backward, `selective` recomputes the attention
    /// scores only. With `--backend dsplan-cpu` a config with an activation_checkpointing
    /// section means `full`, as in `dsplan run`. With `full`, the config's `activation_checkpointing.cpu_checkpointing`
    /// keeps the inputs in host memory.
    #[arg(long, value_enum, value_name = "MODE", num_args = 0..=1, default_missing_value = "full")]
    activation_checkpointing: Option<CheckpointingArg>,
    /// Attention runs as FlashAttention (no seq x seq score matrix is stored).
    #[arg(long)]
    flash_attention: bool,
    /// ZeRO-3: whether the model is built under zero.Init (default enabled).
    #[arg(long, value_enum)]
    zero_init: Option<ZeroInitArg>,
    /// GPU memory per rank (e.g. 80GiB): exit 1 when the planned peak exceeds it
    /// (deepspeed-gpu and dsplan-cuda backends).
    #[arg(long, value_name = "BYTES", value_parser = units::memory_arg)]
    gpu_memory: Option<u64>,
    /// Whose buffers the plan lists: DeepSpeed's on GPUs, or dsplan's CPU or CUDA executor's
    /// (what `dsplan run --device cpu|cuda` measures).
    #[arg(long, value_enum, default_value_t)]
    backend: BackendArg,
    /// Another backend's plan of the same job beside this one: both GPU peaks, kind by kind
    /// (`--backend dsplan-cuda --compare deepspeed-gpu`: where dsplan's executor saves memory
    /// against DeepSpeed and where it does not).
    #[arg(long, value_enum, value_name = "BACKEND")]
    compare: Option<BackendArg>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: PlanFormat,
    /// Tensor, pipeline and sequence parallelism: the 3D plan (grid, stages, timeline).
    #[command(flatten)]
    parallel: super::parallel::ParallelArgs,
}

/// `--format` of `dsplan plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum PlanFormat {
    /// A compact summary.
    #[default]
    Human,
    /// The whole plan.
    Json,
    /// Chrome trace-event JSON of one step.
    Trace,
}

/// `--backend` of `dsplan plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum BackendArg {
    /// DeepSpeed's buffers on GPUs (and the host, under offload).
    #[default]
    DeepspeedGpu,
    /// dsplan's CPU executor: f32 compute, every buffer in host memory.
    DsplanCpu,
    /// dsplan's CUDA executor on one GPU (world size 1): the device step's allocations.
    DsplanCuda,
}

impl From<BackendArg> for PlanBackend {
    fn from(arg: BackendArg) -> Self {
        match arg {
            BackendArg::DeepspeedGpu => PlanBackend::DeepspeedGpu,
            BackendArg::DsplanCpu => PlanBackend::DsplanCpu,
            BackendArg::DsplanCuda => PlanBackend::DsplanCuda,
        }
    }
}

type Failure = (Outcome, String);

/// Runs `dsplan plan`.
pub fn run(args: PlanArgs) -> Outcome {
    match plan_text(&args) {
        Ok((text, outcome)) => {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(text.as_bytes());
            let _ = stdout.flush();
            outcome
        }
        Err((outcome, message)) => {
            if !message.is_empty() {
                say!("error: {}", render::escape_controls(&message));
            }
            outcome
        }
    }
}

/// The 3D plan, when asked for: `--megatron-args`, `--tp/--pp/--vpp/--sp`, or a config with a
/// model-parallel degree above 1 (`None` otherwise).
fn parallel_plan(args: &PlanArgs) -> Result<Option<(String, Outcome)>, Failure> {
    use super::parallel::{self, JobInputs};
    let flagged = args.parallel.megatron_args.is_some() || args.parallel.any_layout_flag();
    let read = match &args.file {
        Some(path) => match parallel::read_config(path) {
            Ok(read) => Some(read),
            Err(failure) if flagged => return Err(failure),
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
    if args.backend != BackendArg::DeepspeedGpu {
        return Err((
            Outcome::UsageError,
            "dsplan's own executors run data parallelism only; a 3D plan uses --backend deepspeed-gpu".into(),
        ));
    }
    let source = parallel::build_job(&JobInputs {
        args: &args.parallel,
        world: args.world_size,
        config: read.as_ref(),
        model: args.model.as_deref(),
        seq_len: args.seq_len,
        micro_batch: None,
        checkpointing: args.activation_checkpointing,
        precision: None,
        flash_attention: args.flash_attention,
    })?;
    parallel::plan::run(&source, args.gpu_memory, args.format).map(Some)
}

fn plan_text(args: &PlanArgs) -> Result<(String, Outcome), Failure> {
    let backend = PlanBackend::from(args.backend);
    if backend == PlanBackend::DsplanCpu && args.gpu_memory.is_some() {
        return Err((
            Outcome::UsageError,
            "--gpu-memory applies to the deepspeed-gpu and dsplan-cuda backends; a dsplan-cpu plan holds everything in host memory".into(),
        ));
    }
    if let Some(planned) = parallel_plan(args)? {
        return Ok(planned);
    }
    let (Some(path), Some(model_reference)) = (&args.file, &args.model) else {
        return Err((
            Outcome::UsageError,
            "dsplan plan needs FILE and --model (or --megatron-args)".into(),
        ));
    };
    // Printed: the user's path, control characters escaped (`render::escape_controls`).
    let display = crate::render::escape_controls(&path.display().to_string()).into_owned();
    let bytes =
        super::read_input(path).map_err(|diagnostic| (Outcome::UsageError, diagnostic.message))?;
    let options = ValidateOptions {
        world_size: Some(args.world_size),
    };
    let (file, found) = validate::validate_source(&display, &bytes, options).map_err(|fatal| {
        say_text!("{}", render::human_with_bytes(&display, &bytes, &fatal));
        (Outcome::InputRejected, String::new())
    })?;
    // Options without effect at the configured stage are the planner's to decide: it records
    // the fallback DeepSpeed would take as a warning in the plan instead of refusing.
    let errors: Vec<Diagnostic> = found
        .iter()
        .filter(|d| d.is_error() && d.code != Code::IneffectiveAtStage)
        .cloned()
        .collect();
    if !errors.is_empty() {
        say_text!("{}", render::human(&file, &errors));
        return Err((
            Outcome::InputRejected,
            format!("{display} is not a valid DeepSpeed config"),
        ));
    }
    let config = config::from_value(file.value()).map_err(|e| (Outcome::InputRejected, e))?;
    let spec = model::load(model_reference, LmHead::Include).map_err(|error| {
        let outcome = match error.kind() {
            ErrorKind::UsageOrIo => Outcome::UsageError,
            ErrorKind::Input => Outcome::InputRejected,
        };
        (outcome, error.to_string())
    })?;
    let graph =
        ModelGraph::from_spec(&spec).map_err(|e| (Outcome::InputRejected, e.to_string()))?;
    let per_node = args.gpus_per_node.unwrap_or(8);
    let cluster = Cluster::new(args.world_size, per_node).map_err(|e| (Outcome::UsageError, e))?;
    let inputs = PlanInputs {
        config: &config,
        graph: &graph,
        cluster: &cluster,
        file: &file,
        display: &display,
    };
    let plan = compile_for(args, backend, &inputs)?;
    let compared = match args.compare {
        Some(other) => {
            let other = compile_for(args, PlanBackend::from(other), &inputs)
                .map_err(|(outcome, message)| (outcome, format!("--compare: {message}")))?;
            Some(compare::Compared::of(&other))
        }
        None => None,
    };
    // On dsplan's CUDA executor the device holds its runtime too (context, workspace, modules).
    let needed = plan.device_total_bytes();
    let fits = args.gpu_memory.is_none_or(|limit| needed <= limit);
    let outcome = if fits {
        Outcome::Success
    } else {
        Outcome::InputRejected
    };
    if !fits {
        let what = if plan.device_runtime.is_some() {
            "the planned GPU peak with the CUDA runtime"
        } else {
            "the planned GPU peak"
        };
        say!(
            "error: {what} ({}) exceeds --gpu-memory ({})",
            gib(needed),
            gib(args.gpu_memory.unwrap_or(0))
        );
    }
    let text = match args.format {
        PlanFormat::Json => {
            let mut value = serde_json::to_value(&plan);
            if let (Ok(serde_json::Value::Object(object)), Some(compared)) = (&mut value, &compared)
            {
                object.insert("compare".into(), compared.to_json(&plan));
            }
            json(&value)?
        }
        PlanFormat::Trace => json(&Ok(plan::trace::chrome_trace(&plan)))?,
        PlanFormat::Human => {
            if !plan.diagnostics.is_empty() {
                say_text!("{}", render::human(&file, &plan.diagnostics));
            }
            let mut text = human(&plan);
            if let Some(compared) = &compared {
                let largest = plan.device_total_bytes().max(compared.device_total_bytes);
                let unit = ByteUnit::for_peak(largest);
                text.push_str(&compared.human(&plan, |bytes| unit.show(bytes)));
            }
            text
        }
    };
    Ok((text, outcome))
}

/// What both backends' plans of one `dsplan plan` are compiled from.
struct PlanInputs<'a> {
    config: &'a config::DsConfig,
    graph: &'a ModelGraph,
    cluster: &'a Cluster,
    file: &'a dsplan_planner::source::SourceFile,
    display: &'a str,
}

/// The plan of `inputs` for `backend`, with the run's training sections attached.
fn compile_for(
    args: &PlanArgs,
    backend: PlanBackend,
    inputs: &PlanInputs<'_>,
) -> Result<Plan, Failure> {
    let PlanInputs {
        config,
        graph,
        cluster,
        file,
        display,
    } = *inputs;
    let workload = Workload {
        sequence_length: args.seq_len,
        // dsplan's own executor reads an activation_checkpointing section as recomputing every
        // layer (`dsplan run`); its plan does the same unless the flag says otherwise.
        checkpointing: match args.activation_checkpointing {
            Some(chosen) => Checkpointing::from(chosen),
            None if backend == PlanBackend::DsplanCpu
                && file.value().get("activation_checkpointing").is_some() =>
            {
                Checkpointing::Full
            }
            None => Checkpointing::None,
        },
        attention: if args.flash_attention {
            AttentionKernel::Flash
        } else {
            AttentionKernel::Eager
        },
        zero_init: args.zero_init.map_or(ZeroInit::Enabled, ZeroInit::from),
        ..Workload::for_backend(backend, config)
    };
    let plan = plan::compile(config, graph, cluster, &workload).map_err(|mut refused| {
        file.locate_all(&mut refused);
        say_text!("{}", render::human(file, &refused));
        (
            Outcome::InputRejected,
            format!("{display} cannot be planned"),
        )
    })?;
    let (mut plan, refusals) = training::attach(plan, config, file.value(), backend);
    plan.diagnostics.extend(refusals);
    file.locate_all(&mut plan.diagnostics);
    Ok(plan)
}

fn json(value: &Result<serde_json::Value, serde_json::Error>) -> Result<String, Failure> {
    match value {
        Ok(value) => serde_json::to_string_pretty(value)
            .map(|text| text + "\n")
            .map_err(|e| (Outcome::UsageError, format!("cannot render JSON: {e}"))),
        Err(e) => Err((Outcome::UsageError, format!("cannot render JSON: {e}"))),
    }
}

/// A binary unit for a table of byte counts: the largest of B, KiB, MiB, GiB that its peak
/// fills at least once, so a tiny model's table does not read `0.00 GiB` throughout.
#[derive(Debug, Clone, Copy)]
struct ByteUnit {
    name: &'static str,
    size: u64,
}

impl ByteUnit {
    fn for_peak(peak: u64) -> Self {
        [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)]
            .into_iter()
            .find(|&(_, size)| peak >= size)
            .map_or(ByteUnit { name: "B", size: 1 }, |(name, size)| ByteUnit {
                name,
                size,
            })
    }

    fn show(self, bytes: u64) -> String {
        format!("{:.2} {}", bytes as f64 / self.size as f64, self.name)
    }
}

/// One byte count, in the largest binary unit it fills.
fn gib(bytes: u64) -> String {
    ByteUnit::for_peak(bytes).show(bytes)
}

fn seconds(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.3} s")
    } else {
        format!("{:.3} ms", value * 1e3)
    }
}

/// The compact summary.
pub fn human(plan: &Plan) -> String {
    let mut out = String::new();
    header(plan, &mut out);
    layout(plan, &mut out);
    shards(plan, &mut out);
    buckets(plan, &mut out);
    stage3(plan, &mut out);
    offload(plan, &mut out);
    host_offload::host_offload(plan, &mut out);
    memory(plan, &mut out);
    step(plan, &mut out);
    out
}

fn header(plan: &Plan, out: &mut String) {
    let s = &plan.settings;
    let c = &plan.cluster;
    out.push_str(&format!(
        "Plan: {} ({} params, {} tensors, {} fetch units)\n",
        plan.model.name,
        thousands(plan.model.total_params),
        plan.model.tensors,
        plan.model.units
    ));
    let ranks = match s.backend {
        PlanBackend::DsplanCpu => "threads of one process".to_string(),
        _ => format!("{} node(s) × {} GPUs", c.nodes(), c.gpus_per_node),
    };
    out.push_str(&format!(
        "  ZeRO stage {}, {} ranks ({ranks}), {} params, master {}, {} ({} states/param)\n",
        s.stage.number(),
        c.world_size,
        s.dtypes.params.as_str(),
        s.dtypes.master.as_str(),
        s.optimizer.name,
        s.optimizer.states
    ));
    run_policy(plan, out);
    training::human(plan, out);
    out.push_str(&format!(
        "  batch: micro {} × accumulation {} × {} ranks = {} samples of {} tokens\n",
        s.batch.micro_batch,
        s.batch.gradient_accumulation_steps,
        c.world_size,
        s.batch.train_batch_size,
        s.batch.sequence_length
    ));
    let checkpointing = match (s.checkpointing, s.checkpoint_placement) {
        (Checkpointing::None, _) => "no activation checkpointing",
        (Checkpointing::Selective, _) => "selective recomputation (attention scores)",
        (Checkpointing::Full, CheckpointPlacement::Gpu) => "full activation checkpointing",
        (Checkpointing::Full, CheckpointPlacement::Cpu) => {
            "full activation checkpointing, inputs in host memory"
        }
    };
    let attention = match s.attention {
        AttentionKernel::Eager => "eager attention",
        AttentionKernel::Flash => "flash attention",
    };
    out.push_str(&format!("  activations: {checkpointing}, {attention}\n"));
    match s.backend {
        PlanBackend::DsplanCpu => out.push_str(
            "  backend: dsplan-cpu (dsplan's CPU executor: f32 compute, every buffer in host memory)\n",
        ),
        PlanBackend::DsplanCuda => out.push_str(
            "  backend: dsplan-cuda (dsplan's CUDA executor on one GPU: every buffer allocated once, for the run)\n",
        ),
        PlanBackend::DeepspeedGpu => {}
    }
    out.push('\n');
}

/// The engine the executor runs, its gradient-norm rule and gradient average (`plan.run`).
fn run_policy(plan: &Plan, out: &mut String) {
    let run = &plan.run;
    let averaging = match run.averaging {
        GradientAveraging::PreDivide => "divided by the world size before the sum".to_string(),
        GradientAveraging::PostMultiply {
            predivide_factor: 1.0,
        } => "summed, then divided by the world size".to_string(),
        GradientAveraging::PostMultiply { predivide_factor } => format!(
            "divided by {predivide_factor} before the sum, multiplied by {predivide_factor}/world after"
        ),
    };
    out.push_str(&format!(
        "  engine: {} (stage {}'s), as {}; gradient norm: {}; gradient average: {averaging}\n",
        run.engine.as_str(),
        run.engine_stage.number(),
        run.optimizer.class_name(),
        run.clip.as_str(),
    ));
}

fn layout(plan: &Plan, out: &mut String) {
    let l = &plan.layout;
    out.push_str(&format!(
        "Layout ({:?}): {} elements, padded to {} (alignment {}), {} per rank ({})\n\n",
        l.scheme,
        thousands(l.numel),
        thousands(l.padded_numel),
        l.alignment,
        thousands(l.partition_numel),
        gib(l.partition_bytes())
    ));
}

fn shards(plan: &Plan, out: &mut String) {
    let sh = &plan.shards;
    out.push_str(&format!(
        "Shards: optimizer states {}, gradients {}, parameters {}; {} optimizer sub-group(s)\n",
        rule(sh.optimizer_states),
        rule(sh.gradients),
        rule(sh.parameters),
        sh.sub_groups.len()
    ));
    if let Some(persistent) = &sh.persistent {
        out.push_str(&format!(
            "  persistent (kept whole): {} tensors, {} elements\n",
            persistent.entries.len(),
            thousands(persistent.numel)
        ));
    }
    if let Some(ranks) = &sh.ranks {
        out.push_str("  rank        owned  padding  first tensor (offset)\n");
        for rank in ranks.iter().take(ROWS) {
            let first = rank
                .first
                .as_ref()
                .map_or(String::from("-"), |(name, offset)| {
                    format!("{name} (+{offset})")
                });
            out.push_str(&format!(
                "  {:>4} {:>12} {:>8}  {first}\n",
                rank.rank,
                thousands(rank.owned_numel),
                rank.padding
            ));
        }
        if ranks.len() > ROWS {
            out.push_str(&format!("  ... {} more ranks\n", ranks.len() - ROWS));
        }
    }
    out.push('\n');
}

fn rule(rule: ShardRule) -> String {
    match rule {
        ShardRule::Replicated => "replicated".into(),
        ShardRule::FlatEqual { partition_numel } => {
            format!("flat partitions of {}", thousands(partition_numel))
        }
        ShardRule::PerParameter => "per tensor".into(),
    }
}

fn buckets(plan: &Plan, out: &mut String) {
    let b = &plan.buckets;
    out.push_str(&format!(
        "Gradient buckets: {} of ≤ {} elements, {:?}, {} on the wire\n",
        b.reduce.len(),
        thousands(b.bucket_size),
        b.timing,
        b.dtype.as_str()
    ));
    out.push_str("     #  tensors      elements      bytes  collective      overlap     flush\n");
    for bucket in b.reduce.iter().take(ROWS) {
        let flush = match bucket.flush {
            FlushPoint::BackwardStep { step } => format!("backward step {step}"),
            FlushPoint::Epilogue => "epilogue".into(),
        };
        out.push_str(&format!(
            "  {:>4} {:>8} {:>13} {:>10}  {:<14}  {:<10}  {flush}\n",
            bucket.index,
            bucket.tensors.len(),
            thousands(bucket.numel),
            gib(bucket.bytes),
            bucket.collective.as_str(),
            format!("{:?}", bucket.overlap)
        ));
    }
    if b.reduce.len() > ROWS {
        out.push_str(&format!("  ... {} more buckets\n", b.reduce.len() - ROWS));
    }
    if let Some(gather) = &b.param_gather {
        out.push_str(&format!(
            "Parameter all-gather after the step: {:?}, {} collective(s), {}\n",
            gather.mode,
            gather.shards.len(),
            gib(gather.bytes)
        ));
    }
    out.push('\n');
}

fn stage3(plan: &Plan, out: &mut String) {
    let Some(schedule) = &plan.stage3 else {
        return;
    };
    let count = |pass: Pass, prefetch: bool| {
        schedule
            .steps
            .iter()
            .filter(|s| s.pass == pass)
            .map(|s| {
                if prefetch {
                    s.prefetch.len()
                } else {
                    s.on_demand.len()
                }
            })
            .sum::<usize>()
    };
    out.push_str(&format!(
        "Stage 3 schedule ({:?}): {} trace steps; forward gathers {} on demand + {} prefetched, backward {} + {}\n",
        schedule.collective,
        schedule.steps.len(),
        count(Pass::Forward, false),
        count(Pass::Forward, true),
        count(Pass::Backward, false),
        count(Pass::Backward, true)
    ));
    let kept: usize = schedule.steps.iter().map(|s| s.kept.len()).sum();
    out.push_str(&format!(
        "  kept for reuse {kept}, peak gathered {} elements (persistent {})\n\n",
        thousands(schedule.peak_live_numel),
        thousands(schedule.persistent_numel)
    ));
    if let Some(arena) = &schedule.arena {
        out.truncate(out.len() - 1);
        out.push_str(&format!(
            "  device parameter arena {} elements ({}, {} of the model's {}; {:?}): {} placements\n\n",
            thousands(arena.numel),
            gib(arena.numel * plan.settings.dtypes.params.bytes()),
            percent(arena.numel, plan.model.total_params),
            thousands(plan.model.total_params),
            arena.packing,
            arena.spans.len()
        ));
    }
}

fn percent(part: u64, whole: u64) -> String {
    format!("{:.1}%", 100.0 * part as f64 / whole.max(1) as f64)
}

fn offload(plan: &Plan, out: &mut String) {
    let o = &plan.offload;
    if o.transfers.is_empty() {
        return;
    }
    let t = &o.totals;
    out.push_str(&format!(
        "Offload: {} copies; per step GPU→host {}, host→GPU {}, NVMe read {}, write {}\n\n",
        o.transfers.len(),
        gib(t.device_to_host),
        gib(t.host_to_device),
        gib(t.nvme_read),
        gib(t.nvme_write)
    ));
}

fn memory(plan: &Plan, out: &mut String) {
    out.push_str("Memory per rank (every rank alike):\n");
    let rows = plan.memory_rows();
    for (device, row) in plan.timeline.devices.iter().zip(&rows) {
        // One unit per device's table, the largest its peak fills (GiB for real models).
        let unit = ByteUnit::for_peak(device.peak.bytes);
        let in_unit = |bytes: u64| unit.show(bytes);
        out.push_str(&format!(
            "  {} peak {} at \"{}\": model states {}, buffers {}, activations {}\n",
            device.device.as_str(),
            in_unit(device.peak.bytes),
            plan.ticks.ticks[device.peak.tick].label,
            in_unit(row.model_states),
            in_unit(row.buffers),
            in_unit(row.activations)
        ));
        for part in &device.peak.breakdown {
            out.push_str(&format!(
                "      {:<22} {:>12}\n",
                part.kind.as_str(),
                in_unit(part.bytes)
            ));
        }
        let phases: Vec<String> = device
            .phases
            .iter()
            .map(|p| format!("{} {}", p.phase.as_str(), in_unit(p.bytes)))
            .collect();
        out.push_str(&format!("    by phase: {}\n", phases.join(", ")));
        if let (Device::Gpu, Some(runtime)) = (device.device, &plan.device_runtime) {
            device_runtime(device.peak.bytes, runtime, out);
        }
    }
    out.push('\n');
}

/// The device's total (what `nvidia-smi` shows): the peak and the executor's runtime.
fn device_runtime(peak: u64, runtime: &plan::DeviceRuntime, out: &mut String) {
    let parts: Vec<String> = runtime
        .parts
        .iter()
        .map(|p| {
            let basis = match p.basis {
                plan::device_runtime::Basis::Measured => "",
                plan::device_runtime::Basis::Estimated => ", estimated",
            };
            format!("{} {:.1} MiB{basis}", p.name, p.bytes as f64 / 1048576.0)
        })
        .collect();
    out.push_str(&format!(
        "  on the device (nvidia-smi): {} = the peak + the CUDA runtime {} ({})\n",
        gib(peak + runtime.bytes),
        gib(runtime.bytes),
        parts.join(", ")
    ));
}

fn step(plan: &Plan, out: &mut String) {
    let Some(graph) = &plan.graph else {
        return;
    };
    if plan.settings.backend == PlanBackend::DsplanCpu {
        out.push_str(
            "Step time: not predicted for the dsplan-cpu backend (the cost model describes GPUs and their links)\n",
        );
        return;
    }
    let t = &graph.step;
    out.push_str(&format!(
        "Step time (cost model, {}): {}\n",
        plan.cluster.hardware.name,
        seconds(t.step_seconds)
    ));
    out.push_str(&format!(
        "  compute {}, communication {} ({:.0}% hidden, {} exposed), copies {}\n",
        seconds(t.compute_seconds),
        seconds(t.communication_seconds),
        t.hidden_fraction * 100.0,
        seconds(t.communication_exposed_seconds),
        seconds(t.copy_seconds)
    ));
    out.push_str(&format!(
        "  {} ops, critical path {} ops, {:.0} tokens/s\n",
        graph.ops.len(),
        graph.critical_path.len(),
        t.tokens_per_second
    ));
    let notes = plan
        .diagnostics
        .iter()
        .filter(|d| d.severity != Severity::Info)
        .count();
    if notes > 0 {
        out.push_str(&format!("  {notes} warning(s) on stderr\n"));
    }
}
