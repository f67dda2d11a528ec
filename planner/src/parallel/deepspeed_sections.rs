//! A 3D job from a `ds_config.json`: its `pipeline` (`stages`, `activation_checkpoint_interval`),
//! `tensor_parallel` (`autotp_size`, AutoTP) and `sequence_parallel_size` (DeepSpeed-Ulysses)
//! sections, with `--tp/--pp/--sp` for what the config leaves out (DeepSpeed's PipelineEngine
//! takes its stage count from the script's `PipelineModule`, not from the config).
//!
//! The model is a Hugging Face model dsplan knows (GPT-2 or the Llama family): its vocabulary
//! is the checkpoint's and cannot be padded. The runtime is DeepSpeed with the config's ZeRO
//! stage; batch sizes come from the config's batch triangle over the data-parallel degree.

use serde_json::Value;

use super::checks::{check, data_degree};
use super::error::{FlagNames, ParallelError, ParallelErrors};
use super::layout::{
    Batch, Dropout, DropoutUse, GradientAccumulationFusion, Job, Layout, PipelineSchedule,
    Recompute, RecomputeMethod, Runtime, SequenceParallel, Training,
};
use super::shape::TransformerShape;
use crate::config::{AutoOr, DsConfig};
use crate::memory::{AttentionKernel, Precision};
use crate::model::{Architecture, Family};

/// `--sp`: Megatron's sequence parallelism or a Ulysses degree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceChoice {
    /// `--sp megatron`.
    Megatron,
    /// `--sp N`: DeepSpeed-Ulysses over `N` GPUs (1: off).
    Ulysses(u64),
}

/// Command-line values that fill or override the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParallelFlags {
    /// `--tp`.
    pub tensor: Option<u64>,
    /// `--pp`.
    pub pipeline: Option<u64>,
    /// `--vpp`: model chunks per pipeline rank (interleaved schedule).
    pub virtual_stages: Option<u64>,
    /// `--sp`.
    pub sequence: Option<SequenceChoice>,
    /// `--micro-batch`.
    pub micro_batch: Option<u64>,
    /// `--activation-checkpointing`.
    pub recompute: Option<Recompute>,
    /// `--precision`.
    pub precision: Option<Precision>,
}

/// Everything the reader needs.
#[derive(Debug, Clone, Copy)]
pub struct ConfigInputs<'a> {
    /// The raw config (to see which sections are present).
    pub raw: &'a Value,
    /// The typed config.
    pub config: &'a DsConfig,
    /// The model.
    pub architecture: &'a Architecture,
    /// GPUs.
    pub world: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Flash or eager attention.
    pub attention: AttentionKernel,
    /// Flags.
    pub flags: ParallelFlags,
}

/// Whether the config or the flags ask for model parallelism (a degree above 1), which is
/// when `estimate` and `plan` switch to the 3D estimate.
pub fn wants_parallel(config: &DsConfig, flags: &ParallelFlags) -> bool {
    flags.tensor.is_some_and(|t| t > 1)
        || flags.pipeline.is_some_and(|p| p > 1)
        || matches!(flags.sequence, Some(SequenceChoice::Megatron))
        || matches!(flags.sequence, Some(SequenceChoice::Ulysses(u)) if u > 1)
        || config.tensor_parallel.autotp_size.get() > 1
        || pipeline_stages(config).is_some_and(|p| p > 1)
        || config.sequence_parallel_size.is_some_and(|s| s.get() > 1)
}

fn pipeline_stages(config: &DsConfig) -> Option<u64> {
    config.pipeline.get("stages").and_then(Value::as_u64)
}

/// One degree from the config and a flag: they must agree when both are given.
fn degree(
    from_config: Option<u64>,
    pointer: &str,
    flag: Option<u64>,
    flag_name: &str,
    names: &mut String,
) -> Result<u64, ParallelError> {
    match (from_config, flag) {
        (Some(config), Some(flag)) if config != flag => Err(ParallelError::new(
            flag_name,
            format!("{flag_name} {flag} disagrees with the config's {pointer} = {config}"),
            format!("drop {flag_name} or change {pointer}"),
        )),
        (Some(config), _) => {
            *names = pointer.to_owned();
            Ok(config)
        }
        (None, Some(flag)) => Ok(flag),
        (None, None) => Ok(1),
    }
}

fn precision(inputs: &ConfigInputs<'_>) -> Result<Precision, ParallelError> {
    if let Some(precision) = inputs.flags.precision {
        return Ok(precision);
    }
    let enabled = |value: &AutoOr<bool>, pointer: &str| match value {
        AutoOr::Auto => Err(ParallelError::new(
            pointer,
            "\"auto\" is filled by the Hugging Face Trainer",
            "give --precision, or resolve the config first (dsplan resolve)",
        )),
        AutoOr::Value(on) => Ok(*on),
    };
    let bf16 = enabled(&inputs.config.bf16.enabled, "/bf16/enabled")?;
    let fp16 = enabled(&inputs.config.fp16.enabled, "/fp16/enabled")?;
    Ok(match (bf16, fp16) {
        (true, _) => Precision::Bf16,
        (false, true) => Precision::Fp16,
        (false, false) => Precision::Fp32,
    })
}

fn batch(inputs: &ConfigInputs<'_>, data: u64) -> Result<Batch, ParallelError> {
    let value =
        |field: &Option<AutoOr<crate::config::primitives::PositiveInt>>, pointer: &str| match field
        {
            None => Ok(None),
            Some(AutoOr::Value(v)) => Ok(Some(v.get())),
            Some(AutoOr::Auto) => Err(ParallelError::new(
                pointer,
                "\"auto\" is filled by the Hugging Face Trainer",
                "give a number, or resolve the config first (dsplan resolve)",
            )),
        };
    let config = inputs.config;
    let micro = match inputs.flags.micro_batch {
        Some(micro) => Some(micro),
        None => value(
            &config.train_micro_batch_size_per_gpu,
            "/train_micro_batch_size_per_gpu",
        )?,
    };
    let accumulation = value(
        &config.gradient_accumulation_steps,
        "/gradient_accumulation_steps",
    )?;
    let global = value(&config.train_batch_size, "/train_batch_size")?;
    let (micro, global) = match (micro, accumulation, global) {
        (Some(micro), Some(gas), _) => (micro, micro * gas * data),
        (Some(micro), None, Some(global)) => (micro, global),
        (Some(micro), None, None) => (micro, micro * data),
        (None, Some(gas), Some(global)) => (global / (gas * data).max(1), global),
        (None, None, Some(global)) => (global / data, global),
        (None, _, None) => {
            return Err(ParallelError::new(
                "/train_micro_batch_size_per_gpu",
                "the config gives no batch size",
                "set train_micro_batch_size_per_gpu (or pass --micro-batch)",
            ));
        }
    };
    Ok(Batch {
        seq_len: inputs.seq_len,
        micro_batch: micro,
        global_batch: global,
    })
}

/// Reads the job.
pub fn job_from_config(inputs: &ConfigInputs<'_>) -> Result<Job, ParallelErrors> {
    let shape = TransformerShape::from_architecture(inputs.architecture)?;
    let config = inputs.config;
    let flags = &inputs.flags;
    let mut names = FlagNames::dsplan();
    let autotp = Some(config.tensor_parallel.autotp_size.get()).filter(|&t| t > 0);
    let tensor = degree(
        autotp,
        "/tensor_parallel/autotp_size",
        flags.tensor,
        "--tp",
        &mut names.tensor,
    )?;
    let pipeline = degree(
        pipeline_stages(config),
        "/pipeline/stages",
        flags.pipeline,
        "--pp",
        &mut names.pipeline,
    )?;
    let ulysses_config = config
        .sequence_parallel_size
        .map(|s| s.get())
        .filter(|&s| s > 0);
    let sequence = match (flags.sequence, ulysses_config) {
        (Some(SequenceChoice::Megatron), Some(u)) if u > 1 => {
            return Err(ParallelError::new(
                "--sp",
                format!("--sp megatron cannot be combined with the config's /sequence_parallel_size = {u} (DeepSpeed-Ulysses)"),
                "keep one of the two",
            )
            .into());
        }
        (Some(SequenceChoice::Megatron), _) => SequenceParallel::Megatron,
        (Some(SequenceChoice::Ulysses(u)), from_config) => {
            match degree(
                from_config,
                "/sequence_parallel_size",
                Some(u),
                "--sp",
                &mut names.sequence,
            )? {
                1 => SequenceParallel::Off,
                degree => SequenceParallel::Ulysses { degree },
            }
        }
        (None, Some(u)) if u > 1 => {
            names.sequence = "/sequence_parallel_size".into();
            SequenceParallel::Ulysses { degree: u }
        }
        (None, _) => SequenceParallel::Off,
    };
    let schedule = match flags.virtual_stages {
        None | Some(1) => PipelineSchedule::OneForwardOneBackward,
        Some(virtual_stages) => PipelineSchedule::Interleaved { virtual_stages },
    };
    let data = data_degree(
        inputs.world,
        tensor,
        pipeline,
        sequence.ulysses_degree(),
        &names,
    )?;
    let batch = batch(inputs, data)?;
    let interval = config
        .pipeline
        .get("activation_checkpoint_interval")
        .and_then(Value::as_u64)
        .filter(|&k| k > 0);
    let recompute = match (flags.recompute, interval) {
        (Some(recompute), _) => recompute,
        (None, Some(layers)) => {
            names.recompute = "/pipeline/activation_checkpoint_interval".into();
            Recompute::Full {
                method: RecomputeMethod::Uniform,
                layers,
            }
        }
        (None, None) if inputs.raw.get("activation_checkpointing").is_some() => {
            names.recompute = "/activation_checkpointing".into();
            Recompute::Full {
                method: RecomputeMethod::Uniform,
                layers: 1,
            }
        }
        (None, None) => Recompute::None,
    };
    let dropout = match inputs.architecture.family {
        Family::Gpt2 => DropoutUse::Applied,
        _ => DropoutUse::Skipped,
    };
    let reduce_bucket = match config.zero_optimization.reduce_bucket_size {
        AutoOr::Value(size) => size.get(),
        AutoOr::Auto => 500_000_000,
    };
    names.sharding = "/zero_optimization/stage".into();
    names.micro_batch = "/train_micro_batch_size_per_gpu".into();
    names.global_batch = "/train_batch_size".into();
    let job = Job {
        shape,
        layout: Layout {
            tensor,
            pipeline,
            schedule,
            sequence,
            data,
        },
        batch,
        training: Training {
            precision: precision(inputs)?,
            runtime: Runtime::DeepSpeed {
                zero: config.zero_optimization.stage,
                reduce_bucket,
            },
            recompute,
            attention: inputs.attention,
            dropout: Dropout {
                hidden: dropout,
                attention: dropout,
            },
            gradient_fusion: GradientAccumulationFusion::Fused,
        },
        names,
    };
    check(&job)?;
    Ok(job)
}
