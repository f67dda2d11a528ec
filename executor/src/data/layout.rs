//! [`BatchLayout`]: how one optimizer step's global batch is cut among ranks and micro-steps.
//!
//! # The split rule
//!
//! A step consumes one *global batch* of `G = micro_batch * grad_accum * world` rows (DeepSpeed's
//! `train_batch_size`). Rank `r` at micro-step `k` (`0 <= k < grad_accum`) gets the rows
//!
//! ```text
//! [r * micro_batch * grad_accum + k * micro_batch,  r * micro_batch * grad_accum + (k + 1) * micro_batch)
//! ```
//!
//! i.e. the global batch is split **rank-major**: each rank owns one contiguous block of
//! `micro_batch * grad_accum` rows and walks through it one micro-batch per micro-step.
//!
//! This is what the DeepSpeed reference runs did (`reference/gpt2/deepspeed_zero/README.md`,
//! "Data, loss and gradient semantics", and the `rows` of every rank and step in its
//! `runs.json`): with 2 ranks, micro-batch 2 and no accumulation, rank 0 gets rows 0..1 and
//! rank 1 rows 2..3; with micro-batch 1 and 2 accumulation steps, rank 0 gets row 0 then row 1
//! and rank 1 row 2 then row 3 — the same rows per rank in both runs. It is also llm.c's
//! order (each process reads a contiguous block). Note that a `torch` `DistributedSampler` would
//! instead interleave samples across ranks; dsplan follows the reference runs.

use std::ops::Range;

use super::DataError;

/// The shape of the data one optimizer step consumes and how it is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLayout {
    micro_batch: usize,
    seq_len: usize,
    grad_accum: usize,
    world: usize,
}

/// Which micro-batch to produce: optimizer step, rank and micro-step within the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MicroBatchIndex {
    /// Optimizer step, from 0.
    pub step: u64,
    /// Data-parallel rank.
    pub rank: usize,
    /// Gradient-accumulation micro-step within the step, from 0.
    pub micro_step: usize,
}

impl BatchLayout {
    /// A layout of `micro_batch` rows of `seq_len` predicted positions (rows hold
    /// `seq_len + 1` tokens) per micro-step, `grad_accum` micro-steps per optimizer step and
    /// `world` data-parallel ranks. Every count must be at least 1.
    pub fn new(
        micro_batch: usize,
        seq_len: usize,
        grad_accum: usize,
        world: usize,
    ) -> Result<Self, DataError> {
        for (field, value) in [
            ("micro_batch", micro_batch),
            ("seq_len", seq_len),
            ("grad_accum", grad_accum),
            ("world", world),
        ] {
            if value == 0 {
                return Err(DataError::InvalidLayout { field, value });
            }
        }
        let layout = BatchLayout {
            micro_batch,
            seq_len,
            grad_accum,
            world,
        };
        let global = micro_batch
            .checked_mul(grad_accum)
            .and_then(|rows| rows.checked_mul(world));
        let row = seq_len.checked_add(1);
        match (global, row) {
            (Some(global), Some(row)) if global.checked_mul(row).is_some() => Ok(layout),
            _ => Err(DataError::LayoutTooLarge),
        }
    }

    /// Rows per micro-batch (`train_micro_batch_size_per_gpu`).
    pub fn micro_batch(&self) -> usize {
        self.micro_batch
    }

    /// Predicted positions per row; a row holds `seq_len + 1` tokens.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Tokens per row: `seq_len + 1` (inputs are the first `seq_len`, targets the last).
    pub fn row_len(&self) -> usize {
        self.seq_len + 1
    }

    /// Micro-steps per optimizer step (`gradient_accumulation_steps`).
    pub fn grad_accum(&self) -> usize {
        self.grad_accum
    }

    /// Data-parallel ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Rows per optimizer step: `micro_batch * grad_accum * world` (`train_batch_size`).
    pub fn global_batch(&self) -> usize {
        self.micro_batch * self.grad_accum * self.world
    }

    /// The rows of the global batch that `rank` uses at `micro_step` (see the module docs).
    pub fn rows_of(&self, rank: usize, micro_step: usize) -> Result<Range<usize>, DataError> {
        if rank >= self.world {
            return Err(DataError::RankOutOfRange {
                rank,
                world: self.world,
            });
        }
        if micro_step >= self.grad_accum {
            return Err(DataError::MicroStepOutOfRange {
                micro_step,
                grad_accum: self.grad_accum,
            });
        }
        let start = rank * self.micro_batch * self.grad_accum + micro_step * self.micro_batch;
        Ok(start..start + self.micro_batch)
    }
}
