//! `dsplan run FILE`: train according to a DeepSpeed config, ZeRO stages 0-3 over in-process
//! ranks on the CPU or on one GPU (`--device`, [`cuda`]), as `planner::resolve` and
//! `planner::plan` decide.
//!
//! The config is resolved first ([`resolve`], the same as `dsplan resolve`): with the run's
//! world size, the training-argument flags `dsplan resolve` takes (`--steps` standing for
//! `--num-training-steps` when that is not given and the scheduler's length is `"auto"`; a
//! config that names its schedule's length keeps it), and the hidden size of the model trained,
//! so `"auto"` values are filled as the Hugging Face Trainer fills them; mismatches and
//! unresolvable `"auto"`s are errors, rendered with the file's lines (exit 1). The resolved
//! config is then compiled into the execution plan ([`compile_plan`]), which the engines
//! follow.
//!
//! Without `--model` and `--data` it trains the `tiny-gpt2` preset on the corpus bundled with
//! dsplan (byte-level tokens). Progress goes to stderr: a progress bar (step, loss, lr,
//! tokens/s) when stderr is a terminal, otherwise a line every `steps_per_print` steps in
//! DeepSpeed's form (`step=, skipped=, lr=, mom=`, the lr and momentum of the next step, plus
//! loss and tokens/s; with the mean phase times of the interval when `wall_clock_breakdown`);
//! then a summary with tokens/s and the measured peak memory per rank and category next to
//! the plan's prediction. `--format json` prints that summary as JSON on stdout. `--metrics`
//! writes one JSON object per step; `--save-model` the trained fp32 parameters under Hugging
//! Face names. The model is written atomically (temporary file, then rename) over a regular
//! file, the metrics line by line as steps end; a FIFO or character device is written through,
//! never replaced (`dsplan_executor::io::output`).
//!
//! `--save-checkpoint DIR` writes DeepSpeed-style checkpoints (`DIR/global_step{N}/`,
//! `DIR/latest`) every `--checkpoint-every` steps and at the end; `--resume` continues from
//! one, at the same or another world size and stage (see `dsplan_executor::checkpoint`). A
//! checkpoint that cannot be read is an I/O error (exit 2); one that does not fit the run
//! (model, precision, data, sequence length) is refused with exit 1. Every file of a tag is
//! checked against the tag's manifest (CRC-32) and its fields against what a save writes; a
//! checkpoint holding NaN or infinite tensors is refused unless
//! `--allow-non-finite-checkpoint` (weights loaded with `--model` likewise, unless
//! `--allow-non-finite-model`). A fresh run refuses a `--save-checkpoint` directory that
//! holds another run's checkpoints unless `--overwrite` (or `--resume`) is given; one run at a
//! time writes a checkpoint directory (its lock `DIR/.dsplan.lock` names the owner's pid and
//! host).
//!
//! Before step 0 every output is set against every input and the others, and checked for
//! room and a writable place (the `outputs` module): an output that would destroy an input, or a
//! `--save-model` that could not be written after training, is refused first.
//!
//! Before anything is allocated (the model's weights included), the memory pre-flight
//! ([`memory`]) sets the plan's peak per rank against the machine's available memory and
//! refuses a run that cannot fit (exit 1, `--force` to run anyway). `--data` must be a
//! regular file (a FIFO or a device is refused before it is read). A run whose loss stops
//! being finite where nothing can recover it stops at that step with exit 1.

mod cuda;
mod memory;
mod outputs;
mod progress;
mod ranks;
mod report;

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dsplan_executor::checkpoint::{CheckpointError, NonFinite, load_checkpoint_with};
use dsplan_executor::cuda::Backend;
use dsplan_executor::cuda::train::CudaTrainError;
use dsplan_executor::data::{WindowOrder, check_data_file, resident_bytes};
use dsplan_executor::io::llama_pretrained::{SavedTo, save_trained};
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::train::plan::architecture;
use dsplan_executor::train::settings::{AttentionKernel, override_nvme_path};
use dsplan_executor::train::{
    CheckpointOptions, DEFAULT_PRESET, DataChoice, ModelChoiceError, SavePolicy, TrainError,
    TrainSettings, TrainSpec, check_finite_weights, choose_model, compile_cuda_plan, compile_plan,
    model_config, plan_training, resume_point, stored_shape,
};
use dsplan_executor::zero::{Dtype, MixedPrecision, ZeroError};
use dsplan_planner::diagnostics::{Code, Diagnostic, Severity};
use dsplan_planner::plan::Plan;
use dsplan_planner::resolve::{Arg, ArgOrigin, Resolved, hidden_size, resolve};
use dsplan_planner::source::SourceFile;
use serde_json::Value;

use super::training_args::{TrainingArgsFlags, environment};
use super::{Format, Outcome};
use crate::render;
use progress::{MetricsFile, Progress};
use ranks::Ranks;
use report::RunFacts;

/// Steps when neither `--steps`, the scheduler's `total_num_steps` nor stored data say.
const DEFAULT_STEPS: u64 = 200;
/// Longest default sequence (the model's `n_positions` if shorter).
const DEFAULT_SEQ_LEN: usize = 64;

/// Arguments of `dsplan run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The DeepSpeed config (ds_config.json) to train with.
    #[arg(value_name = "FILE")]
    config: PathBuf,
    /// A GPT-2 or Llama-family preset (default tiny-gpt2; tiny-llama), a Hugging Face
    /// config.json (gpt2, llama, qwen2, mistral; fresh weights), or a save_pretrained directory
    /// (config.json + model.safetensors or its shards, trained from its weights).
    #[arg(long, value_name = "M")]
    model: Option<String>,
    /// Training data: a text file (byte tokens), an llm.c token .bin, or a .safetensors file
    /// with input_ids [steps, global_batch, seq+1] used batch by batch. Default: the corpus
    /// bundled with dsplan.
    #[arg(long, value_name = "D")]
    data: Option<PathBuf>,
    /// Optimizer steps. Default: the scheduler's total_num_steps, the steps a .safetensors
    /// data file holds, or 200.
    #[arg(long, value_name = "S")]
    steps: Option<u64>,
    /// Data-parallel ranks (threads of this process).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    world_size: u64,
    /// Where to compute: cuda needs an NVIDIA GPU (sm_80 or newer) and trains on one; auto
    /// picks the GPU when one is usable and can run this model, else the CPU.
    #[arg(long, value_enum, default_value_t = Device::Auto)]
    device: Device,
    /// The CUDA attention kernels: auto (the default: tensor-core for bf16/fp16 on a GPU,
    /// else scalar), scalar (f32 arithmetic, every precision) or tensor-core (flash attention
    /// on tensor cores, bf16/fp16 only; refused on the CPU and in f32). Both pass `dsplan
    /// report --check` on an H100 and an H200.
    #[arg(long, value_enum, default_value_t = AttentionChoice::Auto)]
    attention_kernel: AttentionChoice,
    /// Seed of fresh model weights and of the data order.
    #[arg(long, value_name = "S", default_value_t = 1234)]
    seed: u64,
    /// Tokens per row (default: the model's n_positions, at most 64; fixed by .safetensors data).
    #[arg(long, value_name = "L", value_parser = clap::value_parser!(u64).range(1..))]
    seq_len: Option<u64>,
    /// Write one JSON object per step here (step, loss, lr, grad_norm, loss_scale, skipped,
    /// tokens_per_s).
    #[arg(long, value_name = "FILE")]
    metrics: Option<PathBuf>,
    /// Write the trained model here: a GPT-2's fp32 parameters as one safetensors file
    /// (Hugging Face names); a Llama-family model as a `save_pretrained` directory (config.json
    /// and safetensors in the run's dtype, sharded above 5 GB).
    #[arg(long, value_name = "FILE")]
    save_model: Option<PathBuf>,
    /// Put the NVMe offload swap files here instead of the config's nvme_path (an existing,
    /// writable directory; used only when the config offloads to nvme).
    #[arg(long, value_name = "DIR")]
    nvme_path: Option<PathBuf>,
    /// Save checkpoints into this directory (DeepSpeed's layout: DIR/global_step{N}/ and
    /// DIR/latest; safetensors and JSON), atomically, at the end of the run and every
    /// --checkpoint-every steps.
    #[arg(long, value_name = "DIR")]
    save_checkpoint: Option<PathBuf>,
    /// With --save-checkpoint: also save after every N optimizer steps.
    #[arg(long, value_name = "N", requires = "save_checkpoint",
          value_parser = clap::value_parser!(u64).range(1..))]
    checkpoint_every: Option<u64>,
    /// Continue from a checkpoint: a checkpoint directory (its `latest` tag) or a tag
    /// directory (DIR/global_stepN). --steps counts all steps, those before the checkpoint
    /// included. Another world size or ZeRO stage is resharded.
    #[arg(long, value_name = "DIR")]
    resume: Option<PathBuf>,
    /// With --save-checkpoint: write into a directory that already holds another run's
    /// checkpoints (`latest`, `global_step*`), replacing tags of the same steps. Without it, a
    /// fresh run refuses such a directory (--resume continues one instead).
    #[arg(long, requires = "save_checkpoint")]
    overwrite: bool,
    /// Run even when the plan's memory exceeds what the machine has available (the memory
    /// pre-flight reports the figures and refuses otherwise).
    #[arg(long)]
    force: bool,
    /// With --resume: load a checkpoint whose tensors hold NaN or infinite values (refused
    /// otherwise, as a run cannot continue from them).
    #[arg(long, requires = "resume")]
    allow_non_finite_checkpoint: bool,
    /// Train from --model weights that hold NaN or infinite values (refused otherwise, as a
    /// checkpoint's are).
    #[arg(long, requires = "model")]
    allow_non_finite_model: bool,
    #[command(flatten)]
    training: TrainingArgsFlags,
    /// Output format of the final summary.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Device {
    /// The CPU backend.
    Cpu,
    /// The CUDA backend: one GPU, or a clear error.
    Cuda,
    /// CUDA when available, else the CPU.
    Auto,
}

/// `--attention-kernel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AttentionChoice {
    /// tensor-core for bf16/fp16 training on a GPU, scalar otherwise.
    Auto,
    /// attention.cu: scalar f32 arithmetic.
    Scalar,
    /// attention_tc.cu: tensor cores (bf16, fp16).
    TensorCore,
}

impl AttentionChoice {
    /// The kernels a run on `backend` launches: an explicit choice as it is (checked by
    /// [`cuda::check_attention_kernel`]); `auto` the tensor-core kernels wherever they run
    /// (the CUDA backend, 16-bit training: 2.5x the scalar kernels' tokens/s on an H200,
    /// 2026-11-27, every check passed), else the scalar ones.
    fn kernel(self, backend: &Backend, settings: &TrainSettings) -> AttentionKernel {
        match self {
            AttentionChoice::Scalar => AttentionKernel::Scalar,
            AttentionChoice::TensorCore => AttentionKernel::TensorCore,
            AttentionChoice::Auto => match backend {
                Backend::Cuda(_) if settings.precision().model_dtype() != Dtype::F32 => {
                    AttentionKernel::TensorCore
                }
                _ => AttentionKernel::Scalar,
            },
        }
    }
}

/// A failure with its exit code.
pub(super) struct Failure {
    outcome: Outcome,
    message: String,
}

impl Failure {
    fn input(message: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::InputRejected,
            message: message.into(),
        }
    }

    fn usage(message: impl Into<String>) -> Self {
        Self {
            outcome: Outcome::UsageError,
            message: message.into(),
        }
    }
}

/// Run `dsplan run`.
pub fn run(args: RunArgs) -> Outcome {
    let ranks = match Ranks::detect(args.world_size, args.device) {
        Ok(ranks) => ranks,
        Err(failure) => return Ranks::Threads.fail(&failure),
    };
    match train_from_args(&args, &ranks) {
        Ok(()) => Outcome::Success,
        Err(failure) => ranks.fail(&failure),
    }
}

fn train_from_args(args: &RunArgs, ranks: &Ranks) -> Result<(), Failure> {
    let backend = cuda::choose(args.device)?;
    let world = ranks.world(args.world_size);
    // Printed: the user's path, control characters escaped (`render::escape_controls`).
    let display = crate::render::escape_controls(&args.config.display().to_string()).into_owned();
    let bytes = super::read_input(&args.config).map_err(|d| Failure::usage(d.message))?;
    let (file, parsed) = match SourceFile::parse(&display, &bytes) {
        Ok(parsed) => parsed,
        Err(fatal) => {
            eprint!("{}", render::human_with_bytes(&display, &bytes, &fatal));
            return Err(Failure::input(format!(
                "{display} is not a readable config"
            )));
        }
    };
    super::parallel::refuse_in_run(file.value()).map_err(Failure::input)?;
    let data_bytes = match &args.data {
        Some(path) => {
            let size = check_data_file(path).map_err(|e| Failure::usage(e.to_string()))?;
            resident_bytes(path, size)
        }
        None => 0,
    };
    let model_name = args.model.as_deref().unwrap_or(DEFAULT_PRESET);
    let model_shape = model_config(args.model.as_deref())
        .map_err(|e: ModelChoiceError| Failure::usage(e.to_string()))?;
    // Every dimension bounded (naming the one out of bounds) before anything is sized by it.
    architecture(&model_shape)
        .validate()
        .map_err(|e| Failure::input(format!("{model_name}: {e}")))?;
    let stored = match &args.data {
        Some(path) => stored_shape(path).map_err(|e| Failure::usage(e.to_string()))?,
        None => None,
    };
    let seq_len = match (stored, args.seq_len) {
        (Some(shape), Some(asked)) if asked as usize != shape.seq_len => {
            return Err(Failure::usage(format!(
                "--seq-len {asked}, but the stored rows hold {} tokens (seq_len {})",
                shape.seq_len + 1,
                shape.seq_len
            )));
        }
        (Some(shape), _) => shape.seq_len,
        (None, Some(asked)) => asked as usize,
        (None, None) => model_shape.max_positions().min(DEFAULT_SEQ_LEN),
    };
    let known_steps = args.steps.or(stored.map(|s| s.steps));

    let mut resolved = resolve_config(args, world, &file, parsed, model_name, known_steps)?;
    if let Some(path) = &args.nvme_path
        && override_nvme_path(&mut resolved.typed, &path.to_string_lossy())
    {
        eprintln!(
            "note: --nvme-path {} replaces the config's nvme_path",
            crate::render::escape_controls(&path.display().to_string())
        );
    }
    // The Trainer's gradient_checkpointing (the flag or --training-args) asks for the same
    // recomputation as an activation_checkpointing section.
    let gradient_checkpointing = args.training.training_args().map_err(Failure::usage)?;
    let settings = TrainSettings::from_resolved(&resolved)
        .map_err(|e| Failure::input(format!("{display}: {e}")))?
        .with_gradient_checkpointing(gradient_checkpointing.gradient_checkpointing.value);
    let settings = settings
        .clone()
        .with_attention_kernel(args.attention_kernel.kernel(&backend, &settings));
    let steps = known_steps.unwrap_or_else(|| {
        resolved
            .config
            .pointer("/scheduler/params/total_num_steps")
            .and_then(Value::as_u64)
            .filter(|&n| n > 0)
            .unwrap_or(DEFAULT_STEPS)
    });
    let order = WindowOrder::Shuffled { seed: args.seed };
    let data = match &args.data {
        Some(path) => DataChoice::File {
            path: path.clone(),
            order,
        },
        None => DataChoice::Bundled { order },
    };
    let data_name = args
        .data
        .as_ref()
        .map_or("the bundled corpus (byte tokens)".to_string(), |p| {
            crate::render::escape_controls(&p.display().to_string()).into_owned()
        });

    let num_params = model_shape.layout().num_params();
    // Outputs against inputs and each other, then each output's place and room, and the
    // checkpoint directory locked: all before step 0, before anything is written.
    outputs::check_paths(args, &model_shape)?;
    let sizes = outputs::Sizes::of(
        &model_shape,
        num_params as u64,
        settings.precision().model_dtype(),
    );
    let prepared = outputs::prepare(args, sizes, ranks.reports())?;
    // The weights are made after the memory pre-flight: a model too large for the machine is
    // refused before they are allocated.
    let mut spec = TrainSpec {
        settings: settings.clone(),
        model: model_shape,
        initial_params: Vec::new(),
        data,
        seq_len,
        steps,
        world,
    };
    cuda::check_attention_kernel(&backend, &settings)?;
    let backend = cuda::settle(backend, args.device, &spec)?;
    // `auto` decides again once the backend is settled (a GPU run may fall back to the CPU).
    let settings = settings
        .clone()
        .with_attention_kernel(args.attention_kernel.kernel(&backend, &settings));
    spec.settings = settings.clone();
    cuda::check_attention_kernel(&backend, &settings)?;
    // The GPU run measures against the CUDA executor's buffers, the CPU run against its own.
    let compile = match backend {
        Backend::Cuda(_) => compile_cuda_plan,
        Backend::Cpu => compile_plan,
    };
    let plan = match compile(&settings, &spec.model, seq_len, world) {
        Ok(compiled) => compiled,
        Err(mut found) => {
            file.locate_all(&mut found);
            eprint!("{}", render::human(&file, &found));
            return Err(Failure::input(format!(
                "{display}: the plan cannot be compiled; `dsplan plan` explains it"
            )));
        }
    };
    let mut plan_warnings: Vec<Diagnostic> = plan
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
        .cloned()
        .collect();
    file.locate_all(&mut plan_warnings);
    // Rank 0 alone speaks for a job of processes.
    if ranks.reports() {
        eprint!("{}", render::human(&file, &plan_warnings));
    }
    let ranks_per_gpu = cuda::ranks_per_gpu(&backend, ranks, world);
    let preflight = memory::preflight(
        &plan,
        &backend,
        world,
        ranks_per_gpu,
        num_params,
        data_bytes,
    );
    memory::enforce(preflight, args.force)?;
    let model = choose_model(args.model.as_deref(), args.seed)
        .map_err(|e: ModelChoiceError| Failure::usage(e.to_string()))?;
    if model.config != spec.model {
        return Err(Failure::usage(format!(
            "{model_name}: the model's shape changed while dsplan read it"
        )));
    }
    if let Some(path) = args
        .model
        .as_deref()
        .map(std::path::Path::new)
        .filter(|p| p.is_dir())
        && !args.allow_non_finite_model
    {
        check_finite_weights(path, &model.params).map_err(|e| {
            Failure::input(format!(
                "{e} (--allow-non-finite-model trains from them anyway)"
            ))
        })?;
    }
    spec.initial_params = model.params;
    let load_started = std::time::Instant::now();
    let loaded = match &args.resume {
        Some(path) => {
            let non_finite = if args.allow_non_finite_checkpoint {
                NonFinite::Allow
            } else {
                NonFinite::Refuse
            };
            Some(load_checkpoint_with(path, non_finite).map_err(checkpoint_failure)?)
        }
        None => None,
    };
    let load_seconds = load_started.elapsed().as_secs_f64();

    if ranks.reports() {
        let batch = settings.batch;
        eprintln!(
            "dsplan run {display}: ZeRO stage {}, {}, {world} {} {}",
            settings.stage as u8,
            precision_name(&settings.precision()),
            ranks.kind(),
            cuda::place(&backend, ranks, world),
        );
        eprintln!(
            "model {} ({} parameters); data {data_name}; {} x {seq_len} tokens per rank and micro-step, {} micro-step(s), global batch {}; {steps} steps",
            crate::render::escape_controls(&model.description),
            thousands(num_params as u64),
            batch.micro_batch,
            batch.grad_accum,
            batch.train_batch,
        );
        eprintln!("{}", plan_line(&plan));
        for notice in &settings.notices {
            eprintln!("note: {}", crate::render::escape_message(notice));
        }
    }
    let resume = match &loaded {
        Some(loaded) => {
            let point =
                resume_point(&spec, &plan, loaded).map_err(|e| train_failure(e, &display))?;
            if ranks.reports() {
                for note in &point.notes {
                    eprintln!("note: {}", crate::render::escape_message(note));
                }
                eprintln!(
                    "resuming from {} at step {} ({} applied, loss scale {}; read in {load_seconds:.2} s)",
                    crate::render::escape_controls(&point.location.path().display().to_string()),
                    point.global_step,
                    point.applied_steps,
                    point.scaler.scale()
                );
            }
            Some(point)
        }
        None => None,
    };
    let checkpoints = CheckpointOptions {
        save: args
            .save_checkpoint
            .as_ref()
            .map(|dir| SavePolicy::new(dir, args.checkpoint_every)),
        resume,
    };

    ranks.check_backend(&backend)?;
    let metrics = match args.metrics.as_ref().filter(|_| ranks.reports()) {
        Some(path) => Some(MetricsFile::create(path)?),
        None => None,
    };
    let mut progress = Progress::new(
        steps,
        plan_training(&plan).map_err(|e| train_failure(e, &display))?,
        metrics,
    );
    if let Some(point) = &checkpoints.resume {
        progress.resume_at(point.global_step, point.applied_steps);
    }
    let observer = |m: &StepMetrics| progress.observe(m);
    let result = match &backend {
        Backend::Cuda(device) => {
            cuda::train(&spec, &plan, &checkpoints, (device, ranks), &observer).map_err(|e| match e
            {
                CudaTrainError::Run(e) => train_failure(e, &display),
                other => Failure::input(format!("--device cuda: {other}")),
            })
        }
        Backend::Cpu => ranks
            .train(&spec, &plan, &checkpoints, &observer)
            .map_err(|e| train_failure(e, &display)),
    };
    // A failed run is reported as itself; a metrics file that failed too is added to it.
    let committed = progress.finish().map(|m| m.commit()).transpose();
    let report = match (result, committed) {
        (Err(mut failure), Err(metrics)) => {
            failure.message = format!("{}; also: {}", failure.message, metrics.message);
            return Err(failure);
        }
        (Err(failure), Ok(_)) | (Ok(_), Err(failure)) => return Err(failure),
        (Ok(report), Ok(_)) => report,
    };
    if let Some(dir) = args.save_checkpoint.as_ref().filter(|_| ranks.reports()) {
        for note in prepared.finish(dir, &report.checkpoints) {
            eprintln!("note: {note}");
        }
    }
    if !ranks.reports() {
        return Ok(());
    }

    let saved = match &args.save_model {
        Some(path) => Some(
            save_trained(
                path,
                &spec.model,
                &report.final_params,
                settings.precision().model_dtype(),
            )
            .map_err(|e| Failure::usage(format!("cannot save the model: {e}")))?,
        ),
        None => None,
    };
    let facts = RunFacts {
        config: &display,
        model: &model.description,
        num_params,
    };
    let summary = report::summary(&facts, &spec, &report);
    match args.format {
        Format::Human => eprint!("{}", report::human(&report, &summary)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ),
    }
    match (&args.save_model, saved) {
        (Some(path), Some(SavedTo::File)) => {
            eprintln!(
                "saved the trained fp32 model to {}",
                crate::render::escape_controls(&path.display().to_string())
            );
        }
        (Some(path), Some(SavedTo::Directory(files))) => eprintln!(
            "saved the trained model to {} (config.json, {})",
            crate::render::escape_controls(&path.display().to_string()),
            files.join(", ")
        ),
        _ => {}
    }
    if let Some(last) = report.checkpoints.last() {
        eprintln!(
            "saved {} checkpoint(s) to {}; the last, {} ({}, {:.2} s), is `latest`",
            report.checkpoints.len(),
            crate::render::escape_controls(&last.location.dir.display().to_string()),
            last.location.tag,
            self::bytes(last.bytes),
            last.seconds
        );
    }
    Ok(())
}

/// The failure a training error is reported as (`display`: the config file's name).
fn train_failure(e: TrainError, display: &str) -> Failure {
    match e {
        TrainError::Data(_) => Failure::usage(e.to_string()),
        TrainError::Checkpoint(e) => checkpoint_failure(*e),
        // Names the config value (the `nvme_path`) the failure concerns.
        TrainError::Rank {
            error: ZeroError::Swap(_),
            ..
        } => Failure::input(format!("{display}: {e}")),
        _ => Failure::input(e.to_string()),
    }
}

fn checkpoint_failure(e: CheckpointError) -> Failure {
    if e.is_io() {
        Failure::usage(e.to_string())
    } else {
        Failure::input(e.to_string())
    }
}

/// Resolves the config as the Hugging Face Trainer and DeepSpeed would for this run: its world
/// size, the training-argument flags (`--steps` or the stored steps standing for
/// `num_training_steps` when that is not given), and the hidden size of the model trained.
/// Errors are rendered with the file's lines; so are warnings, except the mismatches against
/// `TrainingArguments`' defaults, which matter only under the Trainer and are counted in one
/// note.
fn resolve_config(
    args: &RunArgs,
    world: usize,
    file: &SourceFile,
    mut diagnostics: Vec<Diagnostic>,
    model_name: &str,
    known_steps: Option<u64>,
) -> Result<Resolved, Failure> {
    let display = file.path().to_string();
    let mut env = environment(Some(world as u64), &args.training, None).map_err(Failure::usage)?;
    if env.training_args.num_training_steps.is_none()
        && schedule_length_is_auto(file.value())
        && let Some(steps) = known_steps
    {
        env.training_args.num_training_steps = Some(Arg::given(steps, ArgOrigin::Flag));
    }
    env.hidden_size = hidden_size::from_model(model_name).map_err(Failure::usage)?;
    let outcome = resolve(file.value(), &env);
    let resolved = match outcome {
        Ok(resolved) => {
            diagnostics.extend(resolved.diagnostics.iter().cloned());
            Some(resolved)
        }
        Err(found) => {
            diagnostics.extend(found);
            None
        }
    };
    file.locate_all(&mut diagnostics);
    diagnostics.sort_by_key(|d| (d.line, d.column));
    let against_defaults = diagnostics
        .iter()
        .filter(|d| d.code == Code::AutoMismatch && d.severity == Severity::Warning)
        .count();
    let shown: Vec<Diagnostic> = diagnostics
        .iter()
        .filter(|d| {
            d.is_error() || (d.severity == Severity::Warning && d.code != Code::AutoMismatch)
        })
        .cloned()
        .collect();
    eprint!("{}", render::human(file, &shown));
    let Some(resolved) = resolved else {
        eprint!("{}", render::file_summary(&display, &shown));
        return Err(Failure::input(format!(
            "{display} cannot be resolved for this run; `dsplan resolve {display} --world-size {world}` explains it"
        )));
    };
    if against_defaults > 0 {
        eprintln!(
            "note: {against_defaults} value(s) of {display} differ from Hugging Face TrainingArguments' defaults; that matters only when training with the Trainer (`dsplan resolve` lists them)"
        );
    }
    Ok(resolved)
}

/// Whether the scheduler's length is left to the Trainer (`"auto"` total or warmup steps).
/// Only then does the number of steps run stand for `num_training_steps`: a config that names
/// its schedule's length keeps it, and `--steps` runs that many steps of it.
fn schedule_length_is_auto(config: &Value) -> bool {
    [
        "/scheduler/params/total_num_steps",
        "/scheduler/params/warmup_num_steps",
    ]
    .iter()
    .any(|pointer| config.pointer(pointer).and_then(Value::as_str) == Some("auto"))
}

/// One line saying what the plan decided and the engines follow.
fn plan_line(plan: &Plan) -> String {
    let layout = &plan.layout;
    let mut line = format!(
        "plan: {} elements padded to {}, {} per rank; {} gradient bucket(s) ({})",
        thousands(layout.numel),
        thousands(layout.padded_numel),
        thousands(layout.partition_numel),
        plan.buckets.reduce.len(),
        plan.buckets
            .reduce
            .first()
            .map_or("none", |b| b.collective.as_str()),
    );
    if let Some(gather) = &plan.buckets.param_gather {
        line.push_str(&format!(
            "; parameter all-gather in {} piece(s)",
            gather.shards.len()
        ));
    }
    if let (Some(schedule), Some(persistent)) = (&plan.stage3, &plan.shards.persistent) {
        line.push_str(&format!(
            "; stage 3: {} fetch units, {} persistent tensor(s), gathered on demand",
            schedule.unit_count(),
            persistent.entries.len()
        ));
    }
    line
}

fn precision_name(precision: &MixedPrecision) -> String {
    match precision {
        MixedPrecision::Fp32 => "fp32".to_string(),
        MixedPrecision::Bf16 { .. } => "bf16 (fp32 master weights)".to_string(),
        MixedPrecision::Fp16 { scale } => {
            if scale.is_dynamic() {
                format!(
                    "fp16 (fp32 master weights, dynamic loss scale from 2^{})",
                    scale.initial_scale_power
                )
            } else {
                format!(
                    "fp16 (fp32 master weights, static loss scale {})",
                    scale.loss_scale
                )
            }
        }
    }
}

/// `1234567` as `1,234,567`.
pub(super) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes as `12.3 MiB`.
pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024), "3.00 MiB");
    }
}
