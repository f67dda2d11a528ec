//! Micro-batches as TRL 1.16's `DataCollatorForLanguageModeling` builds them (README points 5
//! and 6): right padding to the micro-batch's longest row with the pad id, labels padded with
//! -100 and an attention mask; or, padding-free (forced by bfd packing), every row of the
//! micro-batch concatenated into one, position ids restarting at 0 for every document and the
//! first token of each document labelled -100. Labels are never shifted: the model shifts.

use crate::error::SftError;
use crate::prepare::{IGNORE, Packing, PrepareSettings, PreparedRow};
use crate::tokenizer::HfTokenizer;

/// How rows become a micro-batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collation {
    /// `[rows, longest]`, padded on the right with `pad_id`, with an attention mask.
    Padded {
        /// `tokenizer.pad_token_id` (TRL sets the pad token to EOS when there is none).
        pad_id: u32,
    },
    /// `[1, total]`: the rows concatenated, with position ids per document.
    PaddingFree,
}

impl Collation {
    /// The collation TRL picks: padding-free when packing with bfd, else right padding with
    /// the pad token, or EOS when the tokenizer has no pad token.
    pub fn for_run(tokenizer: &HfTokenizer, settings: &PrepareSettings) -> Result<Self, SftError> {
        if settings.packing == Packing::Bfd {
            return Ok(Collation::PaddingFree);
        }
        let special = tokenizer.special();
        let pad = special
            .pad
            .as_ref()
            .or(special.eos.as_ref())
            .ok_or_else(|| {
                SftError::in_file(
                    tokenizer
                        .dir()
                        .join("tokenizer_config.json")
                        .display()
                        .to_string(),
                    "the tokenizer has neither a pad_token nor an eos_token to pad with",
                )
            })?;
        Ok(Collation::Padded { pad_id: pad.id })
    }
}

/// One collated micro-batch, `[rows, seq_len]` row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MicroBatch {
    /// Rows (1 when padding-free).
    pub rows: usize,
    /// Tokens per row.
    pub seq_len: usize,
    /// Token ids.
    pub input_ids: Vec<u32>,
    /// Labels, -100 where no loss is taken; not shifted.
    pub labels: Vec<i64>,
    /// Position ids restarting per document (padding-free only).
    pub position_ids: Option<Vec<u32>>,
    /// 1 on tokens, 0 on padding (padded only).
    pub attention_mask: Option<Vec<u8>>,
    /// The prepared rows it holds, in order.
    pub sample_indices: Vec<usize>,
}

impl MicroBatch {
    /// The number of labels the loss counts: labels after the first position of a row that
    /// are not -100 (`labels[..., 1:] != -100`, TRL's `num_items_in_batch` share).
    pub fn label_tokens(&self) -> usize {
        self.labels
            .chunks(self.seq_len.max(1))
            .map(|row| row.iter().skip(1).filter(|&&l| l != IGNORE).count())
            .sum()
    }
}

/// Collates the prepared rows `indices` of `rows`.
pub fn collate(rows: &[PreparedRow], indices: &[usize], collation: Collation) -> MicroBatch {
    let chosen: Vec<&PreparedRow> = indices.iter().map(|&at| &rows[at]).collect();
    match collation {
        Collation::Padded { pad_id } => padded(&chosen, pad_id, indices),
        Collation::PaddingFree => padding_free(&chosen, indices),
    }
}

fn padded(rows: &[&PreparedRow], pad_id: u32, indices: &[usize]) -> MicroBatch {
    let seq_len = rows.iter().map(|row| row.len()).max().unwrap_or(0);
    let cells = rows.len() * seq_len;
    let mut batch = MicroBatch {
        rows: rows.len(),
        seq_len,
        input_ids: Vec::with_capacity(cells),
        labels: Vec::with_capacity(cells),
        position_ids: None,
        attention_mask: Some(Vec::with_capacity(cells)),
        sample_indices: indices.to_vec(),
    };
    let mut mask = Vec::with_capacity(cells);
    for row in rows {
        let padding = seq_len - row.len();
        batch.input_ids.extend(&row.input_ids);
        batch.input_ids.extend(std::iter::repeat_n(pad_id, padding));
        batch.labels.extend(row.labels.values(&row.input_ids));
        batch.labels.extend(std::iter::repeat_n(IGNORE, padding));
        mask.extend(std::iter::repeat_n(1u8, row.len()));
        mask.extend(std::iter::repeat_n(0u8, padding));
    }
    batch.attention_mask = Some(mask);
    batch
}

fn padding_free(rows: &[&PreparedRow], indices: &[usize]) -> MicroBatch {
    let total: usize = rows.iter().map(|row| row.len()).sum();
    let mut input_ids = Vec::with_capacity(total);
    let mut labels = Vec::with_capacity(total);
    let mut positions = Vec::with_capacity(total);
    for row in rows {
        input_ids.extend(&row.input_ids);
        let mut offset = 0;
        for &length in &row.seq_lengths {
            let document = &row.input_ids[offset..offset + length as usize];
            labels.extend(document.iter().enumerate().map(|(at, &id)| {
                if at > 0 && row.labels.is_trained(offset + at) {
                    i64::from(id)
                } else {
                    IGNORE
                }
            }));
            positions.extend(0..length);
            offset += length as usize;
        }
    }
    MicroBatch {
        rows: 1,
        seq_len: total,
        input_ids,
        labels,
        position_ids: Some(positions),
        attention_mask: None,
        sample_indices: indices.to_vec(),
    }
}
