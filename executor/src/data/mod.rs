//! Training data: token batches for each optimizer step, rank and micro-step.
//!
//! A [`TokenSource`] hands out micro-batches of `[micro_batch, seq_len + 1]` tokens (inputs and
//! their shifted targets, see [`TokenBatch`]) for a [`MicroBatchIndex`] (step, rank,
//! micro-step). Every source first defines the *global batch* of a step (`micro_batch *
//! grad_accum * world` rows); the [`BatchLayout`] then gives each rank and micro-step its rows,
//! rank-major, exactly as DeepSpeed's reference runs split their data (see [`layout`]). Sources
//! are deterministic: every rank can build its own and they agree on every row.
//!
//! | source | file | tokens | order |
//! |---|---|---|---|
//! | [`StreamSource::from_text`] | any text | bytes (vocabulary 256) | windows of the stream, sequential or seeded shuffle ([`stream`]) |
//! | [`StreamSource::from_llmc`] | llm.c `*.bin` | uint16 / uint32 ([`llmc`]) | as above |
//! | [`StoredBatchSource`] | `*.safetensors` with `input_ids` `[steps, global_batch, seq_len + 1]` | any integer dtype | as stored, step by step ([`stored`]) |
//! | [`bundled_corpus`] | compiled in | bytes | as text |
//! | [`RecordedBatches`] | `batches[_rankR].safetensors` of collated `train.stepSS.microM.*` | `input_ids`, `labels` (`-100`), `attention_mask` or `position_ids` | as recorded ([`recorded`]) |
//!
//! The training loop reads every source as a [`LabelledSource`] of [`LabelledBatch`]es (token
//! sources through [`TokenLabels`]: `labels = input_ids`), so one path reaches the model.
//!
//! [`open`] picks the source for a path by its extension.

mod batch;
mod bundled;
mod error;
pub mod evaluation;
mod labelled;
pub mod layout;
pub mod llmc;
pub mod recorded;
mod rng;
pub mod stored;
pub mod stream;

use std::path::Path;

pub use batch::TokenBatch;
pub use bundled::{BUNDLED_CORPUS, BUNDLED_CORPUS_NAME, bundled_corpus};
pub use error::{DataError, LlmcProblem};
pub use evaluation::{EvalSchedule, EvalWeighting, Evaluation};
pub use labelled::{LabelledBatch, LabelledSource, OpenLabelled, SharedLabelled, TokenLabels};
pub use layout::{BatchLayout, MicroBatchIndex};
pub use llmc::{LlmcFormat, parse_llmc_tokens, write_llmc_tokens};
pub use recorded::{Collated, RecordedBatches, encode_rank};
pub use rng::{SplitMix64, mix64};
pub use stored::{DEFAULT_TENSOR, StoredBatchSource};
pub use stream::{BYTE_VOCAB, StreamSource, WindowOrder};

/// Where a training step's tokens come from.
pub trait TokenSource {
    /// How batches are shaped and split.
    fn layout(&self) -> &BatchLayout;

    /// Every token this source produces is below this bound (256 for byte-level text, one more
    /// than the largest stored id otherwise); a model's vocabulary must be at least this large.
    fn token_bound(&self) -> u32;

    /// How many steps the source holds (`None`: unbounded, it cycles through epochs).
    fn steps(&self) -> Option<u64>;

    /// Writes row `row` of step `step`'s global batch (`seq_len + 1` tokens) into `out`.
    fn fill_row(&mut self, step: u64, row: usize, out: &mut [u32]) -> Result<(), DataError>;

    /// The micro-batch `[micro_batch, seq_len + 1]` of rank `at.rank` at micro-step
    /// `at.micro_step` of step `at.step`: rows [`BatchLayout::rows_of`] of the global batch.
    fn micro_batch(&mut self, at: MicroBatchIndex) -> Result<TokenBatch, DataError> {
        let layout = *self.layout();
        let rows = layout.rows_of(at.rank, at.micro_step)?;
        self.rows(at.step, rows.start, rows.len())
    }

    /// The whole global batch of `step`, `[global_batch, seq_len + 1]`.
    fn global_batch(&mut self, step: u64) -> Result<TokenBatch, DataError> {
        let rows = self.layout().global_batch();
        self.rows(step, 0, rows)
    }

    /// Rows `first .. first + count` of `step`'s global batch.
    fn rows(&mut self, step: u64, first: usize, count: usize) -> Result<TokenBatch, DataError> {
        let row_len = self.layout().row_len();
        let mut tokens = vec![0u32; count * row_len];
        for (offset, out) in tokens.chunks_exact_mut(row_len).enumerate() {
            self.fill_row(step, first + offset, out)?;
        }
        Ok(TokenBatch::from_parts(count, row_len, tokens))
    }
}

/// The kinds of data file [`open`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// Byte-level text.
    Text,
    /// An llm.c token file.
    LlmcBin,
    /// A safetensors file of stored batches (tensor [`DEFAULT_TENSOR`]).
    Safetensors,
}

impl DataFormat {
    /// The format a path's extension names: `.bin` is llm.c, `.safetensors` is stored batches,
    /// anything else is read as text.
    pub fn from_path(path: &Path) -> Self {
        match path.extension().and_then(|ext| ext.to_str()) {
            Some("bin") => DataFormat::LlmcBin,
            Some("safetensors") => DataFormat::Safetensors,
            _ => DataFormat::Text,
        }
    }
}

/// Checks that `path` is a regular file (directly or through a symlink) and returns its size:
/// a FIFO, a device (`/dev/urandom`) or a directory is refused before anything reads it, as
/// reading one would block forever or never end.
pub fn check_data_file(path: &Path) -> Result<u64, DataError> {
    let origin = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|error| DataError::Io {
        path: origin.clone(),
        message: error.to_string(),
    })?;
    if !meta.is_file() {
        return Err(DataError::Io {
            path: origin,
            message: format!(
                "it is {}, not a regular file (a FIFO, a device or a directory cannot be \
                 trained on: its reads block or never end); name a data file",
                dsplan_planner::user_file::describe(&meta.file_type())
            ),
        });
    }
    Ok(meta.len())
}

/// The bytes of the data file `path`, after [`check_data_file`].
pub fn read_data_file(path: &Path) -> Result<Vec<u8>, DataError> {
    check_data_file(path)?;
    dsplan_planner::user_file::read(path, dsplan_planner::user_file::FileKind::Data).map_err(
        |error| DataError::Io {
            path: path.display().to_string(),
            message: error.to_string(),
        },
    )
}

/// Bytes the data file of `size` bytes in the format of `path` occupies in memory at its peak
/// (while it is read): text is kept as read (one byte a token), an llm.c or safetensors file is
/// read and widened to `u32` tokens (up to three times its size).
pub fn resident_bytes(path: &Path, size: u64) -> u64 {
    match DataFormat::from_path(path) {
        DataFormat::Text => size,
        DataFormat::LlmcBin | DataFormat::Safetensors => size.saturating_mul(3),
    }
}

/// Opens the training data at `path` in the format its extension names.
///
/// `order` applies to token streams (text, llm.c); stored batches are always used as stored.
pub fn open(
    path: &Path,
    layout: BatchLayout,
    order: WindowOrder,
) -> Result<Box<dyn TokenSource + Send>, DataError> {
    let origin = path.display().to_string();
    let bytes = read_data_file(path)?;
    Ok(match DataFormat::from_path(path) {
        DataFormat::Text => Box::new(StreamSource::from_text_bytes(origin, bytes, layout, order)?),
        DataFormat::LlmcBin => Box::new(StreamSource::from_llmc(origin, &bytes, layout, order)?.1),
        DataFormat::Safetensors => Box::new(StoredBatchSource::from_safetensors(
            origin,
            &bytes,
            DEFAULT_TENSOR,
            layout,
        )?),
    })
}
