//! [`LabelledBatch`]: a micro-batch as Hugging Face's collators produce it (input ids, labels
//! with `-100`, optional `position_ids` and `attention_mask`), shaped for the model, and
//! [`LabelledSource`], where the training loop gets them. A [`TokenBatch`] is one too
//! (`labels = input_ids`, no mask), through [`TokenLabels`], so every source reaches the model
//! by one path; batches made outside the executor come in through [`OpenLabelled`].

use super::{BatchLayout, DataError, MicroBatchIndex, TokenBatch, TokenSource};
use crate::model::rope::Positions;
use crate::model::{BatchShape, LossDivisor, RowPositions, TrainingBatch};

/// A micro-batch `[rows, seq_len]` with its next-token targets and, where the collator gave
/// them, positions and a padding mask.
///
/// `targets[t]` is what position `t` predicts: Hugging Face's `labels[t + 1]` (the model shifts
/// `labels` by one; `None` where the label is `-100`), and `None` at the last position of every
/// row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelledBatch {
    /// Rows.
    pub rows: usize,
    /// Positions per row.
    pub seq_len: usize,
    /// Input ids `[rows, seq_len]`.
    pub input_ids: Vec<u32>,
    /// Next-token targets `[rows, seq_len]` (labels shifted left by one).
    pub targets: Vec<Option<u32>>,
    /// `position_ids` `[rows, seq_len]` (padding-free packing); `None`: `arange(seq_len)`.
    pub position_ids: Option<Vec<u32>>,
    /// `attention_mask` `[rows, seq_len]`, 1 a token, 0 padding; `None`: no padding.
    pub attention_mask: Option<Vec<u8>>,
}

impl LabelledBatch {
    /// The batch from unshifted Hugging Face `labels` (`[rows, seq_len]`, `None` for `-100`):
    /// position `t` predicts `labels[t + 1]`.
    pub fn from_labels(
        rows: usize,
        seq_len: usize,
        input_ids: Vec<u32>,
        labels: &[Option<u32>],
    ) -> Self {
        let targets = labels
            .chunks(seq_len.max(1))
            .flat_map(|row| row.iter().skip(1).copied().chain(std::iter::once(None)))
            .collect();
        Self {
            rows,
            seq_len,
            input_ids,
            targets,
            position_ids: None,
            attention_mask: None,
        }
    }

    /// The shape.
    pub fn shape(&self) -> BatchShape {
        BatchShape {
            batch: self.rows,
            seq_len: self.seq_len,
        }
    }

    /// Positions with a target (Hugging Face's count of `labels[..., 1:] != -100`).
    pub fn label_tokens(&self) -> usize {
        self.targets.iter().filter(|t| t.is_some()).count()
    }

    /// Tokens that are not padding.
    pub fn real_tokens(&self) -> usize {
        self.attention_mask
            .as_ref()
            .map_or(self.input_ids.len(), |mask| {
                mask.iter().filter(|&&m| m != 0).count()
            })
    }

    /// Whether the batch is plain causal rows at `arange(seq_len)`: what a [`TokenBatch`]
    /// gives and every backend takes.
    pub fn is_plain(&self) -> bool {
        self.position_ids.is_none() && self.attention_mask.is_none()
    }

    /// The batch as the model reads it, its loss divided as `divisor` says.
    pub fn training_batch(&self, divisor: LossDivisor) -> TrainingBatch<'_> {
        TrainingBatch {
            tokens: &self.input_ids,
            targets: &self.targets,
            positions: self
                .position_ids
                .as_deref()
                .map_or(Positions::Sequential, Positions::Given),
            padding: self.attention_mask.as_deref(),
            divisor,
        }
    }
}

impl From<TokenBatch> for LabelledBatch {
    /// Rows of `seq_len + 1` tokens: inputs are each row without its last token, targets each
    /// row without its first (every position has one).
    fn from(batch: TokenBatch) -> Self {
        Self {
            rows: batch.rows(),
            seq_len: batch.seq_len(),
            input_ids: batch.inputs(),
            targets: batch.targets().into_iter().map(Some).collect(),
            position_ids: None,
            attention_mask: None,
        }
    }
}

/// Where a run's labelled micro-batches come from.
pub trait LabelledSource {
    /// The shape of every micro-batch (the model is sized for it).
    fn shape(&self) -> BatchShape;

    /// Whether the batches give `position_ids` (rows may then be longer than the model's
    /// positions).
    fn positions(&self) -> RowPositions;

    /// Every token id is below this bound.
    fn token_bound(&self) -> u32;

    /// How many optimizer steps the source holds (`None`: unbounded).
    fn steps(&self) -> Option<u64>;

    /// Checks that the run's ranks and accumulation steps are the ones the batches were made
    /// for (a token source cuts its batches for any layout).
    fn check_layout(&self, layout: &BatchLayout) -> Result<(), DataError> {
        let _ = layout;
        Ok(())
    }

    /// Rank `at.rank`'s micro-batch `at.micro_step` of step `at.step`.
    fn micro_batch(&mut self, at: MicroBatchIndex) -> Result<LabelledBatch, DataError>;
}

/// A [`TokenSource`] as a [`LabelledSource`]: every micro-batch converted by
/// `From<TokenBatch>`.
pub struct TokenLabels(pub Box<dyn TokenSource + Send>);

impl TokenLabels {
    fn layout(&self) -> &BatchLayout {
        self.0.layout()
    }
}

impl LabelledSource for TokenLabels {
    fn shape(&self) -> BatchShape {
        let layout = self.layout();
        BatchShape {
            batch: layout.micro_batch(),
            seq_len: layout.seq_len(),
        }
    }

    fn positions(&self) -> RowPositions {
        RowPositions::Arange
    }

    fn token_bound(&self) -> u32 {
        self.0.token_bound()
    }

    fn steps(&self) -> Option<u64> {
        self.0.steps()
    }

    fn micro_batch(&mut self, at: MicroBatchIndex) -> Result<LabelledBatch, DataError> {
        self.0.micro_batch(at).map(LabelledBatch::from)
    }
}

/// Labelled micro-batches made outside the executor (`dsplan run --data train.jsonl`: the
/// fine-tuning data `dsplan-sft` prepares), opened once per run.
pub trait OpenLabelled: Send + Sync {
    /// The data as printed and recorded in checkpoints.
    fn name(&self) -> String;

    /// The order of the batches as recorded in checkpoints (a resumed run must read the same).
    fn order(&self) -> String;

    /// The size recorded in checkpoints (a resumed run must read the same): the bytes of the
    /// prepared rows' token ids, so that other data, another tokenizer or other preparation
    /// settings are told apart.
    fn bytes(&self) -> u64;

    /// A source of the run's micro-batches.
    fn open(&self) -> Box<dyn LabelledSource + Send>;

    /// The eval set the trainer scores, and when (`None`: no eval data).
    fn evaluation(&self) -> Option<super::Evaluation> {
        None
    }
}

/// An [`OpenLabelled`] that a [`crate::train::DataChoice`] can hold: two are equal when they
/// are the same data.
#[derive(Clone)]
pub struct SharedLabelled(pub std::sync::Arc<dyn OpenLabelled>);

impl std::fmt::Debug for SharedLabelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedLabelled")
            .field(&self.0.name())
            .finish()
    }
}

impl PartialEq for SharedLabelled {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedLabelled {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_rows_and_hf_labels_give_the_same_targets() {
        let batch = TokenBatch::from_parts(2, 4, vec![1, 2, 3, 4, 5, 6, 7, 8]);
        let labelled = LabelledBatch::from(batch);
        assert_eq!(labelled.input_ids, [1, 2, 3, 5, 6, 7]);
        assert_eq!(
            labelled.targets,
            [Some(2), Some(3), Some(4), Some(6), Some(7), Some(8)]
        );
        // The same rows as the Trainer sees them (labels = input_ids, one position longer):
        // the last position of each row predicts nothing.
        let hf = LabelledBatch::from_labels(
            2,
            3,
            vec![1, 2, 3, 5, 6, 7],
            &[None, Some(2), Some(3), Some(5), None, Some(7)],
        );
        assert_eq!(hf.targets, [Some(2), Some(3), None, None, Some(7), None]);
        assert_eq!(hf.label_tokens(), 3);
        assert!(hf.is_plain());
    }
}
