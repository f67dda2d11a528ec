//! The eval loss of a fine-tuning run, as the Trainer computes it: the eval set's batches
//! (sequential, `per_device_eval_batch_size` rows, sharded over the ranks) each scored at its
//! own shape, weighted by the rows it holds ([`dsplan_executor::train::eval_loss`]).

use dsplan_executor::data::LabelledBatch;
use dsplan_executor::model::ModelConfig;
use dsplan_executor::train::{EvalWeighting, eval_loss};
use dsplan_sft::SftData;

use super::source::collated;

/// The eval set of a run, collated once.
pub(in crate::cli::run) struct EvalSet {
    /// Per rank, its batches.
    batches: Vec<Vec<LabelledBatch>>,
    weighting: EvalWeighting,
}

impl EvalSet {
    /// The eval batches of `data` over `world` ranks (`None` without eval data).
    pub fn of(data: &SftData, eval_batch_size: usize, world: usize) -> Option<Self> {
        let rows = data.eval.as_ref()?.rows.len();
        let batches = (0..world)
            .map(|rank| {
                data.eval_batches(rank)
                    .iter()
                    .map(|batch| collated(batch).batch())
                    .collect()
            })
            .collect();
        Some(Self {
            batches,
            weighting: EvalWeighting {
                per_device_batch: eval_batch_size,
                world,
                rows,
            },
        })
    }

    /// The Trainer's `eval_loss` of `params`.
    pub fn loss(&self, model: &ModelConfig, params: &[f32]) -> Result<f64, String> {
        eval_loss(model, params, &self.batches, self.weighting)
            .map(|evaluated| evaluated.loss)
            .map_err(|e| format!("the eval loss cannot be computed: {e}"))
    }
}
