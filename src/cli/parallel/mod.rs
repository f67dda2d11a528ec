//! The 3D-parallel side of `estimate`, `plan` and `recommend`: tensor, pipeline, sequence and
//! data parallelism from Megatron-LM flags (`--megatron-args`), or from a `ds_config.json`'s
//! `pipeline`, `tensor_parallel` and `sequence_parallel_size` sections with `--tp/--pp/--vpp/
//! --sp`.
//!
//! Each command keeps its own flags; [`ParallelArgs`] is flattened into them, and the command
//! hands over to [`estimate`], [`plan`] or [`recommend`] when a job is model-parallel (a
//! degree above 1, or Megatron flags). Refusals print every problem with the flag to change
//! and exit 1.

pub mod estimate;
pub mod plan;
pub mod recommend;
mod tables;

use std::path::Path;

use clap::Args;
use dsplan_planner::config::{self, DsConfig};
use dsplan_planner::memory::AttentionKernel;
use dsplan_planner::model::{self, ErrorKind, LmHead, ModelSpec};
use dsplan_planner::parallel::deepspeed_sections::{
    ConfigInputs, ParallelFlags, SequenceChoice, job_from_config, wants_parallel,
};
use dsplan_planner::parallel::megatron_args::{self, MegatronJob};
use dsplan_planner::parallel::{ParallelErrors, Recompute, RecomputeMethod};
use dsplan_planner::source::SourceFile;

use super::Outcome;
use super::training_choices::{CheckpointingArg, PrecisionArg};

/// Model-parallel flags shared by `estimate` and `plan`.
#[derive(Debug, Args, Default)]
pub struct ParallelArgs {
    /// Megatron-LM (or Megatron-DeepSpeed) `pretrain_gpt.py` flags, quoted as one argument:
    /// the model, layout and batch of that launch, with Megatron's names and defaults
    /// (unknown flags are warned about and skipped). The GPUs come from --gpus (estimate) or
    /// --world-size (plan).
    #[arg(long, value_name = "FLAGS", allow_hyphen_values = true)]
    pub megatron_args: Option<String>,

    /// Tensor-parallel degree (with --config: fills or must match tensor_parallel.autotp_size).
    #[arg(long, value_name = "T", value_parser = clap::value_parser!(u64).range(1..))]
    pub tp: Option<u64>,

    /// Pipeline stages (with --config: fills or must match pipeline.stages).
    #[arg(long, value_name = "P", value_parser = clap::value_parser!(u64).range(1..))]
    pub pp: Option<u64>,

    /// Model chunks per pipeline rank: the interleaved schedule (Megatron's
    /// --num-virtual-stages-per-pipeline-rank).
    #[arg(long, value_name = "V", value_parser = clap::value_parser!(u64).range(1..))]
    pub vpp: Option<u64>,

    /// Sequence parallelism: `megatron` (Megatron's SP over the tensor-parallel ranks) or N,
    /// DeepSpeed-Ulysses over N GPUs (fills or must match sequence_parallel_size).
    #[arg(long, value_name = "megatron|N", value_parser = parse_sp)]
    pub sp: Option<SequenceChoice>,
}

fn parse_sp(text: &str) -> Result<SequenceChoice, String> {
    if text == "megatron" {
        return Ok(SequenceChoice::Megatron);
    }
    match text.parse::<u64>() {
        Ok(degree) if degree >= 1 => Ok(SequenceChoice::Ulysses(degree)),
        _ => Err(format!(
            "`{text}` is neither `megatron` nor a DeepSpeed-Ulysses degree (a positive integer)"
        )),
    }
}

impl ParallelArgs {
    /// Whether any dsplan layout flag is given.
    pub fn any_layout_flag(&self) -> bool {
        self.tp.is_some() || self.pp.is_some() || self.vpp.is_some() || self.sp.is_some()
    }
}

/// A failure: the exit outcome and the message (empty when already printed).
pub type Failure = (Outcome, String);

fn usage(message: impl Into<String>) -> Failure {
    (Outcome::UsageError, message.into())
}

/// Prints every refusal with its help and returns exit 1.
pub fn refused(errors: &ParallelErrors) -> Failure {
    let mut text = String::new();
    for error in &errors.0 {
        text.push_str(&format!(
            "error: {}: {}\n  help: {}\n",
            crate::render::escape_controls(&error.flag),
            crate::render::escape_controls(&error.message),
            crate::render::escape_controls(&error.help)
        ));
    }
    say_text!("{text}");
    (Outcome::InputRejected, String::new())
}

/// Loads `--model`.
pub fn load_model(reference: &str) -> Result<ModelSpec, Failure> {
    model::load(reference, LmHead::Include).map_err(|error| {
        let outcome = match error.kind() {
            ErrorKind::UsageOrIo => Outcome::UsageError,
            ErrorKind::Input => Outcome::InputRejected,
        };
        (outcome, error.to_string())
    })
}

/// A config file, read and typed.
pub struct ReadConfig {
    /// The path, for messages.
    pub display: String,
    /// The file's JSON.
    pub raw: serde_json::Value,
    /// Typed.
    pub config: DsConfig,
}

/// Reads and types a `ds_config.json`.
pub fn read_config(path: &Path) -> Result<ReadConfig, Failure> {
    let display = path.display().to_string();
    let bytes = super::read_input(path).map_err(|d| usage(d.message))?;
    let (file, _) = SourceFile::parse(&display, &bytes).map_err(|_| {
        (
            Outcome::InputRejected,
            format!(
                "{display} is not a usable JSON config (dsplan validate {display} shows where)"
            ),
        )
    })?;
    let raw = file.value().clone();
    let config = config::from_value(&raw)
        .map_err(|error| (Outcome::InputRejected, format!("{display}: {error}")))?;
    Ok(ReadConfig {
        display,
        raw,
        config,
    })
}

/// Whether a read config, with the flags, asks for the 3D path.
pub fn config_wants_parallel(read: &ReadConfig, args: &ParallelArgs) -> bool {
    wants_parallel(&read.config, &flags(args, None, None, None))
}

/// dsplan's layout flags as the planner takes them.
pub fn flags(
    args: &ParallelArgs,
    micro_batch: Option<u64>,
    checkpointing: Option<CheckpointingArg>,
    precision: Option<PrecisionArg>,
) -> ParallelFlags {
    ParallelFlags {
        tensor: args.tp,
        pipeline: args.pp,
        virtual_stages: args.vpp,
        sequence: args.sp,
        micro_batch,
        recompute: checkpointing.map(|c| match c {
            CheckpointingArg::None => Recompute::None,
            CheckpointingArg::Selective => Recompute::Selective,
            CheckpointingArg::Full => Recompute::Full {
                method: RecomputeMethod::Uniform,
                layers: 1,
            },
        }),
        precision: precision.map(dsplan_planner::estimate::full::Precision::from),
    }
}

/// Where a job came from, for the output.
pub enum JobSource {
    /// `--megatron-args`.
    Megatron(MegatronJob),
    /// A config and a model.
    Config {
        /// The job.
        job: dsplan_planner::parallel::Job,
        /// The model.
        spec: Box<ModelSpec>,
    },
}

impl JobSource {
    /// The job.
    pub fn job(&self) -> &dsplan_planner::parallel::Job {
        match self {
            JobSource::Megatron(parsed) => &parsed.job,
            JobSource::Config { job, .. } => job,
        }
    }

    /// Warnings about the input.
    pub fn warnings(&self) -> &[String] {
        match self {
            JobSource::Megatron(parsed) => &parsed.warnings,
            JobSource::Config { .. } => &[],
        }
    }

    /// A name for the model.
    pub fn model_name(&self) -> String {
        match self {
            JobSource::Megatron(_) => "Megatron-LM flags".to_owned(),
            JobSource::Config { spec, .. } => spec.name.clone(),
        }
    }
}

/// What a command knows, to build a job.
pub struct JobInputs<'a> {
    /// The layout flags.
    pub args: &'a ParallelArgs,
    /// GPUs.
    pub world: u64,
    /// `--config` (estimate) or FILE (plan).
    pub config: Option<&'a ReadConfig>,
    /// `--model`.
    pub model: Option<&'a str>,
    /// `--seq-len`.
    pub seq_len: Option<u64>,
    /// `--micro-batch`.
    pub micro_batch: Option<u64>,
    /// `--activation-checkpointing`.
    pub checkpointing: Option<CheckpointingArg>,
    /// `--precision`.
    pub precision: Option<PrecisionArg>,
    /// `--flash-attention`.
    pub flash_attention: bool,
}

/// Builds the job from Megatron flags or from a config and a model.
pub fn build_job(inputs: &JobInputs<'_>) -> Result<JobSource, Failure> {
    let args = inputs.args;
    if let Some(text) = &args.megatron_args {
        if args.any_layout_flag() || inputs.config.is_some() || inputs.model.is_some() {
            return Err(usage(
                "--megatron-args describes the model, layout and batch by itself: drop --config, --model, --tp, --pp, --vpp and --sp",
            ));
        }
        if inputs.seq_len.is_some()
            || inputs.micro_batch.is_some()
            || inputs.checkpointing.is_some()
            || inputs.precision.is_some()
            || inputs.flash_attention
        {
            return Err(usage(
                "with --megatron-args, give the sequence, micro-batch, recomputation, precision and attention as Megatron flags (--seq-length, --micro-batch-size, --recompute-granularity, --bf16, --attention-backend)",
            ));
        }
        return megatron_args::parse(text, inputs.world)
            .map(JobSource::Megatron)
            .map_err(|errors| refused(&errors));
    }
    let Some(read) = inputs.config else {
        return Err(usage(
            "--tp, --pp, --vpp and --sp apply to a DeepSpeed config: give one (or describe the launch with --megatron-args)",
        ));
    };
    let Some(reference) = inputs.model else {
        return Err(usage(
            "the 3D estimate needs --model (a preset, config.json or safetensors directory)",
        ));
    };
    let spec = load_model(reference)?;
    let Some(architecture) = spec.architecture else {
        return Err((
            Outcome::InputRejected,
            format!(
                "{}: the 3D estimate needs the model's shape, and this source gives only counts",
                spec.name
            ),
        ));
    };
    let Some(seq_len) = inputs.seq_len else {
        return Err(usage("the 3D estimate needs --seq-len"));
    };
    let config_inputs = ConfigInputs {
        raw: &read.raw,
        config: &read.config,
        architecture: &architecture,
        world: inputs.world,
        seq_len,
        attention: if inputs.flash_attention {
            AttentionKernel::Flash
        } else {
            AttentionKernel::Eager
        },
        flags: flags(
            args,
            inputs.micro_batch,
            inputs.checkpointing,
            inputs.precision,
        ),
    };
    let job = job_from_config(&config_inputs).map_err(|mut errors| {
        // A JSON pointer names a key of the config: say which file.
        for error in &mut errors.0 {
            if error.flag.starts_with('/') {
                error.flag = format!("{} {}", read.display, error.flag);
            }
        }
        refused(&errors)
    })?;
    Ok(JobSource::Config {
        job,
        spec: Box::new(spec),
    })
}

/// `dsplan run` trains data parallelism (ZeRO 0-3) only: a config asking for tensor
/// (`tensor_parallel.autotp_size`) or pipeline (`pipeline.stages`) parallelism above 1 is
/// refused, naming the key and what dsplan offers instead.
pub fn refuse_in_run(raw: &serde_json::Value) -> Result<(), String> {
    let degree = |pointer: &str| raw.pointer(pointer).and_then(serde_json::Value::as_f64);
    for (pointer, what) in [
        ("/tensor_parallel/autotp_size", "tensor parallelism"),
        ("/pipeline/stages", "pipeline parallelism"),
    ] {
        if let Some(value) = degree(pointer).filter(|&v| v > 1.0) {
            return Err(format!(
                "{pointer} = {value}: dsplan run trains with data parallelism only (ZeRO 0-3), not {what}; set it to 1 (or remove it) to train, and use `dsplan estimate --config` or `dsplan plan` to size the {what} job"
            ));
        }
    }
    Ok(())
}
