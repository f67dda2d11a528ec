//! How the tokens of a training micro-batch see each other and where they sit: a
//! [`TrainingBatch`] (tokens, targets, `position_ids`, `attention_mask`, the loss divisor) as a
//! model reads it, and the [`TokenLayout`] a model keeps from its forward for its backward (and
//! for the recomputed forward under activation checkpointing).
//!
//! The rules are `transformers` 5.23's for eager attention:
//!
//! * no `position_ids` and no `attention_mask`: positions `arange(T)`, a causal mask;
//! * `attention_mask` (right padding): a causal mask without the padded keys; positions as given
//!   or `arange(T)`;
//! * `position_ids` and no `attention_mask` (padding-free packing): RoPE at the given positions
//!   and a block-diagonal causal mask, a new document starting wherever
//!   `position_ids[t] != position_ids[t - 1] + 1`.

use super::ModelError;
use super::attention::AttentionMask;
use super::classifier::LossDivisor;
use super::rope::Positions;

/// Where a model's rows get their positions, which decides how long a row may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPositions {
    /// `arange(T)`: a row is at most `max_position_embeddings` long.
    Arange,
    /// The batches give `position_ids` (packed documents restarting at 0): a row may be longer
    /// than `max_position_embeddings`, each position id may not.
    PositionIds,
}

/// One training micro-batch `(B, T)` as a model reads it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainingBatch<'a> {
    /// Input ids `(B*T)`.
    pub tokens: &'a [u32],
    /// What position `t` predicts (`labels[t + 1]`, `None` for `-100`), `(B*T)`.
    pub targets: &'a [Option<u32>],
    /// Each token's position.
    pub positions: Positions<'a>,
    /// `attention_mask` `(B*T)`, 1 for a token, 0 for padding; `None`: no padding.
    pub padding: Option<&'a [u8]>,
    /// What the summed token loss is divided by.
    pub divisor: LossDivisor,
}

impl<'a> TrainingBatch<'a> {
    /// Plain causal rows at positions `arange(T)`, the loss the mean over the batch's targets.
    pub fn causal(tokens: &'a [u32], targets: &'a [Option<u32>]) -> Self {
        Self {
            tokens,
            targets,
            positions: Positions::Sequential,
            padding: None,
            divisor: LossDivisor::TargetsInBatch,
        }
    }

    /// Whether the batch needs more than a causal mask at positions `arange(T)`.
    pub fn is_masked(&self) -> bool {
        self.padding.is_some() || matches!(self.positions, Positions::Given(_))
    }
}

/// What a model's last forward used: positions and attention mask, kept for its backward.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenLayout {
    /// `position_ids` `(B*T)`; empty: `arange(T)`.
    positions: Vec<u32>,
    /// Per token, where its document starts in its row; empty: causal over the whole row.
    first_key: Vec<u32>,
    /// `attention_mask` `(B*T)`; empty: no padding.
    keys: Vec<u8>,
}

impl TokenLayout {
    /// Plain causal rows (what an inference forward and a token batch use).
    pub fn causal() -> Self {
        Self::default()
    }

    /// The layout of `batch`, rows of `seq_len` tokens, for a model whose positions go up to
    /// `max_positions` (exclusive): position ids must be below it and `attention_mask` entries
    /// 0 or 1.
    pub fn of(
        batch: &TrainingBatch<'_>,
        seq_len: usize,
        max_positions: usize,
    ) -> Result<Self, ModelError> {
        let tokens = batch.tokens.len();
        let mut layout = Self::causal();
        if batch.positions == Positions::Sequential && seq_len > max_positions {
            return Err(ModelError::SequenceTooLong {
                seq_len,
                n_positions: max_positions,
            });
        }
        if let Positions::Given(ids) = batch.positions {
            check_len("position_ids", ids.len(), tokens)?;
            if let Some((index, &id)) = ids
                .iter()
                .enumerate()
                .find(|&(_, &id)| id as usize >= max_positions)
            {
                return Err(ModelError::PositionOutOfRange {
                    index,
                    position: id,
                    max_positions,
                });
            }
            layout.positions = ids.to_vec();
        }
        match batch.padding {
            Some(mask) => {
                check_len("attention_mask", mask.len(), tokens)?;
                if let Some(index) = mask.iter().position(|&m| m > 1) {
                    return Err(ModelError::MaskValue {
                        index,
                        value: mask[index],
                    });
                }
                layout.keys = mask.to_vec();
                layout.first_key = vec![0; tokens];
            }
            None if !layout.positions.is_empty() => {
                layout.first_key = document_starts(&layout.positions, seq_len);
            }
            None => {}
        }
        Ok(layout)
    }

    /// The positions RoPE rotates by.
    pub fn positions(&self) -> Positions<'_> {
        if self.positions.is_empty() {
            Positions::Sequential
        } else {
            Positions::Given(&self.positions)
        }
    }

    /// The attention mask.
    pub fn mask(&self) -> AttentionMask<'_> {
        if self.first_key.is_empty() {
            AttentionMask::Causal
        } else {
            AttentionMask::Documents {
                first_key: &self.first_key,
                keys: (!self.keys.is_empty()).then_some(&self.keys[..]),
            }
        }
    }
}

fn check_len(what: &'static str, found: usize, expected: usize) -> Result<(), ModelError> {
    if found == expected {
        Ok(())
    } else {
        Err(ModelError::BatchLength {
            what,
            expected,
            found,
        })
    }
}

/// Per token of rows of `seq_len`, the row position where its document starts: a document
/// starts at every row start and wherever `positions[t] != positions[t - 1] + 1`.
fn document_starts(positions: &[u32], seq_len: usize) -> Vec<u32> {
    let mut starts = Vec::with_capacity(positions.len());
    for row in positions.chunks(seq_len.max(1)) {
        let mut start = 0u32;
        for (t, &position) in row.iter().enumerate() {
            if t > 0 && position != row[t - 1].wrapping_add(1) {
                start = t as u32;
            }
            starts.push(start);
        }
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_start_where_positions_restart_and_padding_keeps_the_causal_window() {
        let tokens = [5u32; 8];
        let targets = [Some(1u32); 8];
        let positions = [0u32, 1, 2, 0, 1, 0, 1, 2];
        let packed = TrainingBatch {
            positions: Positions::Given(&positions),
            ..TrainingBatch::causal(&tokens, &targets)
        };
        // Two rows of 4: the second row starts a document at its own position 0.
        let layout = TokenLayout::of(&packed, 4, 16).expect("valid");
        assert_eq!(layout.first_key, [0, 0, 0, 3, 0, 1, 1, 1]);
        assert_eq!(layout.positions(), Positions::Given(&positions));

        let mask = [1u8, 1, 0, 0, 1, 1, 1, 1];
        let padded = TrainingBatch {
            padding: Some(&mask),
            ..TrainingBatch::causal(&tokens, &targets)
        };
        let layout = TokenLayout::of(&padded, 4, 16).expect("valid");
        assert_eq!(
            layout.mask(),
            AttentionMask::Documents {
                first_key: &[0; 8],
                keys: Some(&mask)
            }
        );
        assert_eq!(layout.positions(), Positions::Sequential);

        let too_far = TrainingBatch {
            positions: Positions::Given(&[0, 1, 2, 3, 4, 5, 6, 16]),
            ..TrainingBatch::causal(&tokens, &targets)
        };
        let error = TokenLayout::of(&too_far, 8, 16).expect_err("position 16 of 16");
        assert!(error.to_string().contains("16"), "{error}");
        assert_eq!(
            TokenLayout::of(&TrainingBatch::causal(&tokens, &targets), 8, 16)
                .expect("valid")
                .mask(),
            AttentionMask::Causal
        );
    }
}
