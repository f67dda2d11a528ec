//! The batch triangle of a filled config, solved with DeepSpeed's own derivation
//! ([`crate::validate::batch::derive`]), each derived key with its arithmetic.

use serde::Serialize;
use serde_json::Value;

use super::provenance::Provenance;
use crate::diagnostics::{Code, Diagnostic};
use crate::validate::batch::{self, BatchError, GivenBatch};

/// The three batch sizes DeepSpeed trains with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Batch {
    /// `train_batch_size`.
    pub train_batch_size: u64,
    /// `train_micro_batch_size_per_gpu`.
    pub train_micro_batch_size_per_gpu: u64,
    /// `gradient_accumulation_steps`.
    pub gradient_accumulation_steps: u64,
}

/// The solved triangle and the provenance of each derived key.
pub(crate) type Solved = (Batch, Vec<(&'static str, Provenance)>);

/// Solves the triangle of `document` (whose batch keys are numbers or absent: the Trainer's
/// pass and validation ran first). Without a world size only a complete triple is accepted.
pub(crate) fn solve(document: &Value, world_size: Option<u64>) -> Result<Solved, Diagnostic> {
    let read = |pointer: &str| -> Option<i128> {
        let number = document.pointer(pointer)?.as_f64()?;
        (number.fract() == 0.0 && number.abs() < 1e30).then_some(number as i128)
    };
    let given = GivenBatch {
        train: read(batch::TRAIN_BATCH),
        micro: read(batch::MICRO_BATCH),
        accumulation: read(batch::GRAD_ACCUM),
    };
    let Some(world) = world_size else {
        return match (given.train, given.micro, given.accumulation) {
            (Some(train), Some(micro), Some(accumulation)) => {
                Ok((to_batch(train, micro, accumulation)?, Vec::new()))
            }
            _ => Err(Diagnostic::error(
                Code::BatchSizeMissing,
                "",
                "DeepSpeed derives the missing batch sizes from the data-parallel world size, which is not given",
            )
            .with_help("pass --world-size N")),
        };
    };
    match batch::derive(given, i128::from(world)) {
        Ok(solved) => {
            let derived = solved
                .derivations
                .iter()
                .map(|d| {
                    (
                        d.pointer,
                        Provenance::BatchDerivation {
                            formula: d.formula.clone(),
                        },
                    )
                })
                .collect();
            Ok((
                to_batch(solved.train, solved.micro, solved.accumulation)?,
                derived,
            ))
        }
        // Validation reports these with the arithmetic; this is a safety net.
        Err(BatchError::Missing) => Err(Diagnostic::error(
            Code::BatchSizeMissing,
            "",
            "neither `train_batch_size` nor `train_micro_batch_size_per_gpu` is given",
        )),
        Err(BatchError::NotPositive { pointer, message }) => Err(Diagnostic::error(
            Code::BatchSizeNotPositive,
            pointer,
            message,
        )),
        Err(BatchError::Mismatch(_)) => Err(Diagnostic::error(
            Code::BatchSizeMismatch,
            batch::TRAIN_BATCH,
            format!("the batch sizes do not add up at world size {world}"),
        )),
    }
}

fn to_batch(train: i128, micro: i128, accumulation: i128) -> Result<Batch, Diagnostic> {
    let positive = |value: i128, pointer: &str| {
        u64::try_from(value).ok().filter(|v| *v > 0).ok_or_else(|| {
            Diagnostic::error(
                Code::BatchSizeNotPositive,
                pointer,
                format!("{} is {value}; it must be at least 1", &pointer[1..]),
            )
        })
    };
    Ok(Batch {
        train_batch_size: positive(train, batch::TRAIN_BATCH)?,
        train_micro_batch_size_per_gpu: positive(micro, batch::MICRO_BATCH)?,
        gradient_accumulation_steps: positive(accumulation, batch::GRAD_ACCUM)?,
    })
}
