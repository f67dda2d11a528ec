//! The eval set of a fine-tuning run, as the Trainer scores it: the eval set's batches
//! (sequential, `per_device_eval_batch_size` rows, sharded over the ranks) each scored at its
//! own shape, weighted by the rows it holds ([`dsplan_executor::train::eval_loss`]), after
//! every `eval_steps` steps (or every epoch) and after the last, as `eval_strategy` says. The
//! trainer scores it ([`Evaluation`], carried by the run's data).

use std::sync::Arc;

use dsplan_executor::data::{EvalSchedule, EvalWeighting, Evaluation};
use dsplan_sft::SftData;

use super::source::collated;
use crate::cli::sft_config::EvalStrategy;

/// The eval set of `data` over `world` ranks, scored as `strategy` says (`None` without eval
/// data).
pub(super) fn evaluation(
    data: &SftData,
    eval_batch_size: usize,
    world: usize,
    strategy: EvalStrategy,
) -> Option<Evaluation> {
    let rows = data.eval.as_ref()?.rows.len();
    let batches = (0..world)
        .map(|rank| {
            data.eval_batches(rank)
                .iter()
                .map(|batch| collated(batch).batch())
                .collect()
        })
        .collect();
    let schedule = match strategy {
        EvalStrategy::AtEnd => EvalSchedule::AtEnd,
        EvalStrategy::EverySteps(n) => EvalSchedule::Every(n),
        EvalStrategy::EveryEpoch => EvalSchedule::Every(data.order.steps_per_epoch() as u64),
    };
    Some(Evaluation {
        batches: Arc::new(batches),
        weighting: EvalWeighting {
            per_device_batch: eval_batch_size,
            world,
            rows,
        },
        schedule,
    })
}
