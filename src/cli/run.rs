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
mod job;
mod memory;
mod outputs;
mod progress;
mod ranks;
mod report;
mod session;
mod setup;
mod sft;

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dsplan_executor::checkpoint::CheckpointError;
use dsplan_executor::train::TrainError;
use dsplan_executor::zero::ZeroError;

use super::training_args::TrainingArgsFlags;
use super::{Format, Outcome};
use job::Job;
use ranks::Ranks;
use setup::Setup;

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
    /// with input_ids [steps, global_batch, seq+1] used batch by batch; or fine-tuning data as
    /// TRL's SFTTrainer takes it: a .jsonl, .json or .parquet file (or a directory of them) of
    /// text, prompt-completion or messages rows, tokenized with the model's tokenizer; or a
    /// .safetensors of recorded fine-tuning micro-batches (train.stepSS.microM.input_ids,
    /// labels, attention_mask or position_ids; see --save-batches), trained as they are.
    /// Default: the corpus bundled with dsplan.
    #[arg(long, value_name = "D")]
    data: Option<PathBuf>,
    /// Fine-tuning eval data (.jsonl, .json, .parquet or a directory): the eval loss at the end
    /// and every eval_steps (eval_strategy "steps" in --training-args).
    #[arg(long, value_name = "D", requires = "data")]
    eval_data: Option<PathBuf>,
    /// Fine-tuning eval set held out of --data instead: the last ceil(F x records) records
    /// evaluate and are not trained on, as datasets' train_test_split(test_size=F,
    /// shuffle=False) splits them (0 < F < 1).
    #[arg(
        long,
        value_name = "F",
        requires = "data",
        conflicts_with = "eval_data"
    )]
    eval_split: Option<f64>,
    /// The tokenizer's directory (tokenizer.json, tokenizer_config.json) for fine-tuning data,
    /// when the --model directory has none.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
    /// The shape of fine-tuning rows (auto: from the first record's fields).
    #[arg(long, value_enum, default_value_t = sft::DatasetFormat::Auto)]
    dataset_format: sft::DatasetFormat,
    /// A bad fine-tuning row (malformed JSON, a missing field, a template error, ...): stop
    /// naming its file and line, or skip it and count it.
    #[arg(long, value_enum, default_value_t = sft::BadRowChoice::Stop)]
    on_bad_row: sft::BadRowChoice,
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
    /// Write the micro-batches a fine-tuning run trains on (every step, as collated) to this
    /// .safetensors file (NAME_rankR.safetensors per rank with several ranks), the format
    /// --data takes back: the same run replayed from pre-tokenized data.
    #[arg(long, value_name = "FILE", requires = "data")]
    save_batches: Option<PathBuf>,
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

/// The run: read the job, check its outputs, settle the backend and compile the plan (the
/// memory pre-flight included), read the weights, find where the run starts, train through
/// the one loop, and leave the model, the checkpoints and the summary.
fn train_from_args(args: &RunArgs, ranks: &Ranks) -> Result<(), Failure> {
    let backend = cuda::choose(args.device)?;
    let world = ranks.world(args.world_size);
    let job = Job::read(args, world)?;
    // Outputs against inputs and each other, then each output's place and room, and the
    // checkpoint directory locked: all before step 0, before anything is written.
    outputs::check_paths(args, &job.model)?;
    let sizes = outputs::Sizes::of(
        &job.model,
        job.num_params as u64,
        job.settings.precision().model_dtype(),
    );
    let prepared = outputs::prepare(args, sizes, ranks.reports())?;
    let Setup {
        backend,
        mut spec,
        plan,
    } = setup::setup(args, &job, backend, world, ranks)?;
    let (weights, model) = job.weights(args)?;
    spec.initial_params = weights;
    let checkpoints = session::checkpoints(args, &spec, &plan, &job, ranks)?;
    if ranks.reports() {
        session::opening(&job, &spec, &plan, (&backend, ranks), &model);
    }
    let report = session::train(args, &job, (&spec, &plan, &checkpoints), (&backend, ranks))?;
    session::finish(args, &job, (&spec, &report), (prepared, ranks), &model)
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
