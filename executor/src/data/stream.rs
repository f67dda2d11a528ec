//! [`StreamSource`]: batches cut from one long token stream (a text file, an llm.c `.bin`).
//!
//! # Windows
//!
//! The stream of `n` tokens is cut into *windows* of `seq_len + 1` tokens with stride `seq_len`:
//! window `w` is tokens `[w * seq_len, w * seq_len + seq_len + 1)`, so consecutive windows share
//! one token (the last target of one is the first input of the next) and every token except the
//! first is predicted exactly once per pass. There are `(n - 1) / seq_len` windows; a stream
//! shorter than one global batch (`global_batch * seq_len + 1` tokens) is an error.
//!
//! # Order
//!
//! An *epoch* is `floor(windows / global_batch)` steps; the windows left over at the end of an
//! epoch are not used in it. Within epoch `e`, global row `g` of the epoch's step `b` reads slot
//! `b * global_batch + g` of the epoch's window order:
//!
//! * [`WindowOrder::Sequential`]: slot `i` is window `i` (every epoch the same), so a step reads
//!   a contiguous stretch of the stream, rank 0 first, like llm.c's loader;
//! * [`WindowOrder::Shuffled`]: the windows permuted by a Fisher–Yates shuffle driven by
//!   [`SplitMix64`] seeded with `mix64(seed ^ mix64(e))`: a different order every epoch, the same
//!   on every rank, machine and run.
//!
//! Global rows are then split among ranks and micro-steps by the rule in [`super::layout`].

use super::rng::{SplitMix64, mix64};
use super::{BatchLayout, DataError, LlmcFormat, TokenSource, parse_llmc_tokens};

/// The vocabulary of byte-level text: one token per byte value.
pub const BYTE_VOCAB: u32 = 256;

/// In what order an epoch visits the windows of a token stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WindowOrder {
    /// Stream order.
    #[default]
    Sequential,
    /// A seeded permutation per epoch.
    Shuffled {
        /// The seed.
        seed: u64,
    },
}

/// The tokens of a stream, kept in the width they were read in: byte-level text one byte a
/// token (a 4 GiB text file takes 4 GiB, not 16), token ids as `u32`.
#[derive(Debug, Clone)]
enum Tokens {
    /// Byte-level text.
    Bytes(Vec<u8>),
    /// Token ids.
    Ids(Vec<u32>),
}

impl Tokens {
    fn len(&self) -> usize {
        match self {
            Tokens::Bytes(bytes) => bytes.len(),
            Tokens::Ids(ids) => ids.len(),
        }
    }

    /// Copies tokens `start..start + out.len()` into `out`.
    fn copy_into(&self, start: usize, out: &mut [u32]) {
        let end = start + out.len();
        match self {
            Tokens::Bytes(bytes) => out
                .iter_mut()
                .zip(&bytes[start..end])
                .for_each(|(o, &b)| *o = u32::from(b)),
            Tokens::Ids(ids) => out.copy_from_slice(&ids[start..end]),
        }
    }
}

/// Batches cut from a token stream; see the [module documentation](self).
#[derive(Debug, Clone)]
pub struct StreamSource {
    origin: String,
    tokens: Tokens,
    token_bound: u32,
    layout: BatchLayout,
    order: WindowOrder,
    windows: usize,
    steps_per_epoch: u64,
    /// The window order of one epoch, kept while steps stay in it.
    epoch_order: Option<(u64, Vec<usize>)>,
}

impl StreamSource {
    /// Batches of `layout` from `tokens`; `origin` names the data in errors.
    ///
    /// Every token is below [`TokenSource::token_bound`], here one more than the largest id.
    pub fn new(
        origin: impl Into<String>,
        tokens: Vec<u32>,
        layout: BatchLayout,
        order: WindowOrder,
    ) -> Result<Self, DataError> {
        let bound = tokens.iter().max().map_or(0, |&max| max.saturating_add(1));
        Self::with_bound(origin.into(), Tokens::Ids(tokens), bound, layout, order)
    }

    /// Byte-level tokens of `text` (token = byte value, vocabulary [`BYTE_VOCAB`]).
    pub fn from_text(
        origin: impl Into<String>,
        text: &[u8],
        layout: BatchLayout,
        order: WindowOrder,
    ) -> Result<Self, DataError> {
        Self::from_text_bytes(origin, text.to_vec(), layout, order)
    }

    /// [`StreamSource::from_text`], keeping `text` (one byte a token) rather than a copy.
    pub fn from_text_bytes(
        origin: impl Into<String>,
        text: Vec<u8>,
        layout: BatchLayout,
        order: WindowOrder,
    ) -> Result<Self, DataError> {
        Self::with_bound(
            origin.into(),
            Tokens::Bytes(text),
            BYTE_VOCAB,
            layout,
            order,
        )
    }

    /// The tokens of an llm.c token file (see [`super::llmc`]).
    pub fn from_llmc(
        origin: impl Into<String>,
        bytes: &[u8],
        layout: BatchLayout,
        order: WindowOrder,
    ) -> Result<(LlmcFormat, Self), DataError> {
        let origin = origin.into();
        match parse_llmc_tokens(bytes) {
            Ok((format, tokens)) => Ok((format, Self::new(origin, tokens, layout, order)?)),
            Err(problem) => Err(DataError::Llmc { origin, problem }),
        }
    }

    fn with_bound(
        origin: String,
        tokens: Tokens,
        token_bound: u32,
        layout: BatchLayout,
        order: WindowOrder,
    ) -> Result<Self, DataError> {
        let seq_len = layout.seq_len();
        let global_batch = layout.global_batch();
        let windows = tokens.len().saturating_sub(1) / seq_len;
        if windows < global_batch {
            return Err(DataError::TooSmall {
                origin,
                tokens: tokens.len(),
                needed: global_batch.saturating_mul(seq_len).saturating_add(1),
                global_batch,
                seq_len,
            });
        }
        Ok(StreamSource {
            origin,
            tokens,
            token_bound,
            layout,
            order,
            windows,
            steps_per_epoch: (windows / global_batch) as u64,
            epoch_order: None,
        })
    }

    /// Where the tokens came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Tokens in the stream.
    pub fn token_count(&self) -> usize {
        self.tokens.len()
    }

    /// Windows of `seq_len + 1` tokens in the stream.
    pub fn windows(&self) -> usize {
        self.windows
    }

    /// Optimizer steps per pass over the windows.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The window that feeds global row `row` of step `step`.
    pub fn window_of(&mut self, step: u64, row: usize) -> Result<usize, DataError> {
        let global_batch = self.layout.global_batch();
        if row >= global_batch {
            return Err(DataError::RowOutOfRange { row, global_batch });
        }
        let epoch = step / self.steps_per_epoch;
        // `slot < steps_per_epoch * global_batch <= windows`, so it fits in usize.
        let slot = (step % self.steps_per_epoch) as usize * global_batch + row;
        Ok(match self.order {
            WindowOrder::Sequential => slot,
            WindowOrder::Shuffled { seed } => self.epoch_order(seed, epoch)[slot],
        })
    }

    fn epoch_order(&mut self, seed: u64, epoch: u64) -> &[usize] {
        let windows = self.windows;
        let cached = self
            .epoch_order
            .get_or_insert_with(|| (epoch, shuffled(windows, seed, epoch)));
        if cached.0 != epoch {
            *cached = (epoch, shuffled(windows, seed, epoch));
        }
        &cached.1
    }
}

/// `0..windows` shuffled for `epoch`.
fn shuffled(windows: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..windows).collect();
    SplitMix64::new(mix64(seed ^ mix64(epoch))).shuffle(&mut order);
    order
}

impl TokenSource for StreamSource {
    fn layout(&self) -> &BatchLayout {
        &self.layout
    }

    fn token_bound(&self) -> u32 {
        self.token_bound
    }

    fn steps(&self) -> Option<u64> {
        None
    }

    fn fill_row(&mut self, step: u64, row: usize, out: &mut [u32]) -> Result<(), DataError> {
        let row_len = self.layout.row_len();
        if out.len() != row_len {
            return Err(DataError::RowBuffer {
                found: out.len(),
                expected: row_len,
            });
        }
        let start = self.window_of(step, row)? * self.layout.seq_len();
        self.tokens.copy_into(start, out);
        Ok(())
    }
}
