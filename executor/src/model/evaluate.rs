//! [`evaluate_batch`]: the loss of one batch under given parameters, with no optimizer state
//! (an eval batch, whatever its shape).

use super::masking::{RowPositions, TrainingBatch};
use super::owned::OwnedParams;
use super::units::UnitSpans;
use super::{BatchShape, ModelConfig, ModelCore, ModelError, Recompute};

/// The loss of `batch` (shape `shape`, positions as `positions` says) under `params` (laid out
/// as `config.layout()`), divided as `batch.divisor` says. A model is sized for the batch, so
/// batches of any shape can be evaluated one after another.
pub fn evaluate_batch(
    config: &ModelConfig,
    params: &[f32],
    shape: BatchShape,
    positions: RowPositions,
    batch: &TrainingBatch<'_>,
) -> Result<f32, ModelError> {
    let layout = config.layout();
    if params.len() != layout.num_params() {
        return Err(ModelError::ParamCount {
            expected: layout.num_params(),
            found: params.len(),
        });
    }
    let mut core = ModelCore::with_positions(*config, shape, Recompute::Nothing, positions)?;
    let spans = UnitSpans::new(&layout);
    let mut grads = vec![0.0f32; params.len()];
    let mut source = OwnedParams::new(&spans, params, &mut grads);
    core.forward_batch_with(&mut source, batch, 1.0)
}
