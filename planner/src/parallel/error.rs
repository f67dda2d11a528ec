//! Refusals of a parallel job, as data: the flag (or config pointer) at fault, what is wrong,
//! and how to fix it.
//!
//! A job reaches dsplan through Megatron-LM flags, dsplan's own `--tp/--pp/--sp`, or a
//! `ds_config.json`; [`FlagNames`] remembers which spelling each knob came from, so an error
//! names what the user wrote.

use serde::Serialize;
use std::fmt;

/// One reason a job is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParallelError {
    /// The flag or config pointer at fault, as the user spelled it.
    pub flag: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub help: String,
}

impl ParallelError {
    /// An error about `flag`.
    pub fn new(flag: &str, message: impl Into<String>, help: impl Into<String>) -> ParallelError {
        ParallelError {
            flag: flag.to_owned(),
            message: message.into(),
            help: help.into(),
        }
    }
}

impl fmt::Display for ParallelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.flag, self.message, self.help)
    }
}

impl std::error::Error for ParallelError {}

/// Several refusals at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParallelErrors(pub Vec<ParallelError>);

impl fmt::Display for ParallelErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ParallelErrors {}

impl From<ParallelError> for ParallelErrors {
    fn from(error: ParallelError) -> ParallelErrors {
        ParallelErrors(vec![error])
    }
}

/// How each knob of a job was spelled where it came from (a Megatron-LM flag, a dsplan flag,
/// or a JSON pointer into a `ds_config.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlagNames {
    /// The tensor-parallel degree.
    pub tensor: String,
    /// The pipeline degree.
    pub pipeline: String,
    /// The virtual pipeline (interleaved schedule) setting.
    pub virtual_stages: String,
    /// Sequence parallelism.
    pub sequence: String,
    /// The number of GPUs.
    pub world: String,
    /// The micro-batch.
    pub micro_batch: String,
    /// The global batch.
    pub global_batch: String,
    /// The vocabulary padding.
    pub vocab_padding: String,
    /// The ZeRO stage or the distributed optimizer.
    pub sharding: String,
    /// Recomputation.
    pub recompute: String,
}

impl FlagNames {
    /// Megatron-LM's own argument names.
    pub fn megatron() -> FlagNames {
        FlagNames {
            tensor: "--tensor-model-parallel-size".into(),
            pipeline: "--pipeline-model-parallel-size".into(),
            virtual_stages: "--num-layers-per-virtual-pipeline-stage".into(),
            sequence: "--sequence-parallel".into(),
            world: "--gpus".into(),
            micro_batch: "--micro-batch-size".into(),
            global_batch: "--global-batch-size".into(),
            vocab_padding: "--make-vocab-size-divisible-by".into(),
            sharding: "--use-distributed-optimizer".into(),
            recompute: "--recompute-granularity".into(),
        }
    }

    /// dsplan's own flags.
    pub fn dsplan() -> FlagNames {
        FlagNames {
            tensor: "--tp".into(),
            pipeline: "--pp".into(),
            virtual_stages: "--vpp".into(),
            sequence: "--sp".into(),
            world: "--gpus".into(),
            micro_batch: "--micro-batch".into(),
            global_batch: "--global-batch".into(),
            vocab_padding: "--model".into(),
            sharding: "--zero-stage".into(),
            recompute: "--activation-checkpointing".into(),
        }
    }
}
