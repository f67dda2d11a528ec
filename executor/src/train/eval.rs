//! The eval loss as the Hugging Face Trainer reports it (`trainer.evaluate()` under
//! accelerate), from each rank's eval batches.
//!
//! Each eval batch's loss is its own token mean (summed NLL over its own count of
//! `labels[..., 1:] != -100`). The Trainer repeats that value `per_device_eval_batch_size`
//! times, gathers the ranks' values round by round (rank 0's batch `i`, rank 1's batch `i`,
//! ...), and `gather_for_metrics` cuts the last round to `rows % (batch x world)` values when
//! that is not 0 (`rows`: prepared eval rows, a packed bin counting as one). `eval_loss` is the
//! mean of what is left: batches weighted by rows, a short last round weighing less.

pub use crate::data::EvalWeighting;
use crate::data::LabelledBatch;
use crate::model::{LossDivisor, ModelConfig, ModelError, RowPositions, evaluate_batch};

/// An eval run's result.
#[derive(Debug, Clone, PartialEq)]
pub struct EvalLoss {
    /// What the Trainer logs as `eval_loss`.
    pub loss: f64,
    /// Each rank's batch losses (token means), in order.
    pub batch_losses: Vec<Vec<f64>>,
}

/// The loss of each of `batches` (one list per rank) under `params`, and the Trainer's
/// `eval_loss` of them ([`trainer_eval_loss`]).
pub fn eval_loss(
    model: &ModelConfig,
    params: &[f32],
    batches: &[Vec<LabelledBatch>],
    weighting: EvalWeighting,
) -> Result<EvalLoss, ModelError> {
    let batch_losses = batches
        .iter()
        .map(|rank| {
            rank.iter()
                .map(|batch| {
                    let positions = match batch.position_ids {
                        Some(_) => RowPositions::PositionIds,
                        None => RowPositions::Arange,
                    };
                    let view = batch.training_batch(LossDivisor::TargetsInBatch);
                    evaluate_batch(model, params, batch.shape(), positions, &view).map(f64::from)
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(EvalLoss {
        loss: trainer_eval_loss(&batch_losses, weighting),
        batch_losses,
    })
}

/// The Trainer's `eval_loss` of per-rank batch losses (see the [module documentation](self)).
pub fn trainer_eval_loss(batch_losses: &[Vec<f64>], weighting: EvalWeighting) -> f64 {
    let batch = weighting.per_device_batch.max(1);
    let rounds = batch_losses.iter().map(Vec::len).max().unwrap_or(0);
    let mut gathered: Vec<f64> = Vec::new();
    for round in 0..rounds {
        for rank in batch_losses {
            if let Some(&loss) = rank.get(round) {
                gathered.extend(std::iter::repeat_n(loss, batch));
            }
        }
    }
    let per_round = batch * weighting.world.max(1);
    let remainder = weighting.rows % per_round;
    if remainder > 0 && rounds > 0 {
        gathered.truncate((rounds - 1) * per_round + remainder);
    }
    if gathered.is_empty() {
        return f64::NAN;
    }
    gathered.iter().sum::<f64>() / gathered.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_weigh_by_rows_and_the_last_round_is_cut() {
        // One rank, 20 rows in batches of 8: weights 8, 8, 4.
        let one = trainer_eval_loss(
            &[vec![1.0, 2.0, 4.0]],
            EvalWeighting {
                per_device_batch: 8,
                world: 1,
                rows: 20,
            },
        );
        assert!((one - (8.0 + 16.0 + 16.0) / 20.0).abs() < 1e-12, "{one}");
        // Two ranks, 20 rows: round 0 both ranks (16 values), round 1 cut to 4 of rank 0's.
        let two = trainer_eval_loss(
            &[vec![1.0, 3.0], vec![2.0, 100.0]],
            EvalWeighting {
                per_device_batch: 8,
                world: 2,
                rows: 20,
            },
        );
        assert!((two - (8.0 + 16.0 + 12.0) / 20.0).abs() < 1e-12, "{two}");
    }
}
