//! A dataset prepared as TRL 1.16's `SFTTrainer._prepare_dataset` prepares it: every example
//! tokenized and labelled ([`row`]), in parallel a chunk at a time as the
//! [`DatasetReader`] streams them (the next chunk is read while the current one is
//! prepared), then packed when [`Packing::Bfd`] is on ([`crate::pack`]); or split first into
//! a train set and an eval set ([`prepare_split`], [`HeldOut`]), each packed on its own.

pub mod labels;
pub mod row;
pub mod settings;
pub mod split;

use rayon::prelude::*;

pub use labels::Labels;
pub use row::{IGNORE, Outcome, PreparedRow, prepare_example};
pub use settings::{AssistantLoss, CompletionLoss, OverLength, Packing, PrepareSettings};
pub use split::HeldOut;

use crate::dataset::{BadRows, DatasetReader, OnBadRow, Shape};
use crate::error::SftError;
use crate::tokenizer::HfTokenizer;

/// A prepared dataset and what was left out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedSet {
    /// The rows, in dataset order (bins in creation order when packed).
    pub rows: Vec<PreparedRow>,
    /// The dataset's shape.
    pub shape: Shape,
    /// Rows dropped because no label was left (TRL drops them in non-packed runs).
    pub dropped_all_masked: u64,
    /// Records skipped as bad (reading or preparing them failed, under [`OnBadRow::Skip`]).
    pub bad: BadRows,
}

/// Reads and prepares every example of `reader`.
pub fn prepare_dataset(
    reader: DatasetReader,
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    on_bad_row: OnBadRow,
) -> Result<PreparedSet, SftError> {
    let (rows, read) = prepare_rows(reader, tokenizer, settings, on_bad_row)?;
    read.finish(rows, settings)
}

/// Reads and prepares every example of `reader`, then splits the records as `held_out` says:
/// the train set and the eval set, each packed on its own when packing is on. Rows dropped
/// and records skipped are counted in the train set's figures.
pub fn prepare_split(
    reader: DatasetReader,
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    on_bad_row: OnBadRow,
    held_out: HeldOut,
) -> Result<(PreparedSet, PreparedSet), SftError> {
    let (rows, read) = prepare_rows(reader, tokenizer, settings, on_bad_row)?;
    let first_eval = held_out
        .first_eval_record(read.records)
        .map_err(|message| {
            SftError::in_file(&read.shown, message)
                .with_help("hold out a smaller fraction, or give --eval-data")
        })?;
    let (train, eval): (Vec<PreparedRow>, Vec<PreparedRow>) = rows
        .into_iter()
        .partition(|row| row.source_rows.first().is_some_and(|&r| r < first_eval));
    let eval = PreparedSet {
        rows: pack(eval, settings),
        shape: read.shape,
        dropped_all_masked: 0,
        bad: BadRows::default(),
    };
    if eval.rows.is_empty() {
        return Err(SftError::in_file(
            &read.shown,
            format!(
                "the eval split (records {first_eval} to {}) holds no row with a label",
                read.records
            ),
        )
        .with_help("hold out a larger fraction, or give --eval-data"));
    }
    Ok((read.finish(train, settings)?, eval))
}

/// What reading a dataset's rows found besides them: its shape and what was left out.
struct Read {
    shape: Shape,
    dropped_all_masked: u64,
    bad: BadRows,
    /// The records read: one more than the largest record index seen.
    records: u64,
    /// The dataset as named in messages.
    shown: String,
}

impl Read {
    /// The set of `rows` (some or all of those read), packed when packing is on; an error
    /// when none is left.
    fn finish(
        self,
        rows: Vec<PreparedRow>,
        settings: &PrepareSettings,
    ) -> Result<PreparedSet, SftError> {
        if rows.is_empty() {
            return Err(SftError::in_file(
                self.shown,
                format!(
                    "no row is left to train on ({} had no label after truncation to \
                     max_length, {} were bad)",
                    self.dropped_all_masked, self.bad.count
                ),
            )
            .with_help("raise max_length, or check the completion / assistant masks"));
        }
        Ok(PreparedSet {
            rows: pack(rows, settings),
            shape: self.shape,
            dropped_all_masked: self.dropped_all_masked,
            bad: self.bad,
        })
    }
}

/// `rows` packed when packing is on, else as they are.
fn pack(rows: Vec<PreparedRow>, settings: &PrepareSettings) -> Vec<PreparedRow> {
    match (settings.packing, settings.max_length) {
        (Packing::Bfd, Some(max_length)) => crate::pack::pack_bfd(rows, max_length),
        _ => rows,
    }
}

/// Reads and prepares every example of `reader`: the rows, unpacked, and what else was read.
fn prepare_rows(
    mut reader: DatasetReader,
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
    on_bad_row: OnBadRow,
) -> Result<(Vec<PreparedRow>, Read), SftError> {
    check_settings(tokenizer, settings)?;
    let mut rows = Vec::new();
    let mut dropped_all_masked = 0;
    let mut bad = BadRows::default();
    let mut records = 0;
    let mut next = reader.next_chunk();
    while let Some(chunk) = next? {
        records = chunk.iter().map(|s| s.row + 1).fold(records, u64::max);
        // The reading of the next chunk (mostly serial) overlaps the preparing of this one;
        // this chunk's outcomes are still looked at before the next chunk's read error.
        let (outcomes, read): (Vec<Outcome>, _) = rayon::join(
            || {
                chunk
                    .par_iter()
                    .map(|sourced| prepare_example(tokenizer, settings, sourced))
                    .collect()
            },
            || reader.next_chunk(),
        );
        next = read;
        for outcome in outcomes {
            match outcome {
                Outcome::Kept(row) => rows.push(row),
                Outcome::AllMasked => dropped_all_masked += 1,
                Outcome::Bad(error) => match on_bad_row {
                    OnBadRow::Stop => return Err(error),
                    OnBadRow::Skip => bad.note(error),
                },
            }
        }
    }
    let shown = reader.path().to_string();
    let shape = reader.shape().ok_or_else(|| {
        SftError::in_file(&shown, "no shape could be detected").with_help("pass --dataset-format")
    })?;
    let read_bad = reader.bad_rows();
    bad.count += read_bad.count;
    let room = BadRows::KEPT.saturating_sub(bad.first.len());
    bad.first.extend(read_bad.first.iter().take(room).cloned());
    let read = Read {
        shape,
        dropped_all_masked,
        bad,
        records,
        shown,
    };
    Ok((rows, read))
}

/// Refuses settings the tokenizer cannot honour before any row is read.
fn check_settings(tokenizer: &HfTokenizer, settings: &PrepareSettings) -> Result<(), SftError> {
    let config = tokenizer
        .dir()
        .join("tokenizer_config.json")
        .display()
        .to_string();
    if settings.assistant_loss == AssistantLoss::AssistantOnly
        && !tokenizer
            .chat_template()
            .is_some_and(|template| template.has_generation_blocks())
    {
        return Err(SftError::in_file(
            config,
            "assistant_only_loss needs a chat template with {% generation %} ... \
             {% endgeneration %} around the assistant's text, and this tokenizer's has none",
        )
        .with_help("add the markers to the template, or set assistant_only_loss to false"));
    }
    if settings.packing == Packing::Bfd && settings.max_length.is_none() {
        return Err(SftError::in_file(
            "the SFT settings",
            "packing needs a max_length: it is the length of every packed bin",
        )
        .with_help("set max_length (TRL's default is 1024)"));
    }
    Ok(())
}
