//! An eval set the trainer scores while it trains: every rank's eval batches, how the Trainer
//! weighs them ([`EvalWeighting`]), and when ([`EvalSchedule`]: after the last step, and
//! every `eval_steps` steps as the Trainer's `eval_strategy` says). The data that carries one
//! ([`super::OpenLabelled::evaluation`]) hands it to the one training loop, which scores the
//! consolidated fp32 parameters when one is due.

use std::sync::Arc;

use super::LabelledBatch;

/// How the Trainer weighs the eval batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalWeighting {
    /// `per_device_eval_batch_size`.
    pub per_device_batch: usize,
    /// Ranks.
    pub world: usize,
    /// Rows of the prepared eval set (bins when packed).
    pub rows: usize,
}

/// When the eval loss is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalSchedule {
    /// After the last step only (`eval_strategy` `"no"`, then `trainer.evaluate()`).
    AtEnd,
    /// After every `n`-th optimizer step (`eval_strategy` `"steps"` with `eval_steps`, or
    /// `"epoch"` with the steps of an epoch), and after the last.
    Every(u64),
}

impl EvalSchedule {
    /// Whether an eval follows the `done`-th step (from 1) of a run of `total`.
    pub fn due(self, done: u64, total: u64) -> bool {
        done == total || matches!(self, EvalSchedule::Every(n) if n > 0 && done.is_multiple_of(n))
    }
}

/// The eval set of a run and when to score it.
#[derive(Debug, Clone)]
pub struct Evaluation {
    /// Per rank, its eval batches in order.
    pub batches: Arc<Vec<Vec<LabelledBatch>>>,
    /// How the Trainer weighs them.
    pub weighting: EvalWeighting,
    /// When.
    pub schedule: EvalSchedule,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_eval_is_due_every_n_steps_and_after_the_last() {
        let due = |schedule: EvalSchedule| -> Vec<u64> {
            (1..=7).filter(|&done| schedule.due(done, 7)).collect()
        };
        assert_eq!(due(EvalSchedule::AtEnd), vec![7]);
        assert_eq!(due(EvalSchedule::Every(2)), vec![2, 4, 6, 7]);
        assert_eq!(due(EvalSchedule::Every(7)), vec![7]);
        assert_eq!(due(EvalSchedule::Every(0)), vec![7]);
    }
}
