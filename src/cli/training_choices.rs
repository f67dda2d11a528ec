//! The training choices every planning command takes as flags (`--activation-checkpointing`,
//! `--precision`), as clap value enums and their planner types. They sit below `estimate`,
//! `plan`, `recommend` and the 3D side (`parallel`), which all read them.

use clap::ValueEnum;
use dsplan_planner::estimate::full::{Checkpointing, Precision};

/// `--activation-checkpointing none|selective|full`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckpointingArg {
    /// Store every activation.
    None,
    /// Recompute the attention scores only.
    Selective,
    /// Store layer inputs only; recompute each layer in backward.
    Full,
}

impl From<CheckpointingArg> for Checkpointing {
    fn from(arg: CheckpointingArg) -> Checkpointing {
        match arg {
            CheckpointingArg::None => Checkpointing::None,
            CheckpointingArg::Selective => Checkpointing::Selective,
            CheckpointingArg::Full => Checkpointing::Full,
        }
    }
}

/// `--precision fp16|bf16|fp32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// fp16 mixed precision.
    Fp16,
    /// bf16 mixed precision.
    Bf16,
    /// Plain fp32.
    Fp32,
}

impl From<PrecisionArg> for Precision {
    fn from(arg: PrecisionArg) -> Precision {
        match arg {
            PrecisionArg::Fp16 => Precision::Fp16,
            PrecisionArg::Bf16 => Precision::Bf16,
            PrecisionArg::Fp32 => Precision::Fp32,
        }
    }
}
