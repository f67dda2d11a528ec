//! [`ModelError`]: why a GPT-2 could not be built or could not run a batch.

use std::fmt;

use super::ConfigError;

/// Why a [`super::Gpt2`] could not be built, or a pass could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelError {
    /// The configuration does not describe a model.
    Config(ConfigError),
    /// The batch shape has a zero dimension.
    EmptyBatch,
    /// The sequence is longer than the position table.
    SequenceTooLong {
        /// Requested `T`.
        seq_len: usize,
        /// The model's `n_positions`.
        n_positions: usize,
    },
    /// The sequence is longer than the sliding attention window (only sequences inside the
    /// window are implemented: there sliding attention is causal attention).
    SlidingWindow {
        /// Requested `T`.
        seq_len: usize,
        /// `sliding_window`.
        window: usize,
    },
    /// The parameter buffer does not have the layout's length.
    ParamCount {
        /// Elements the layout needs.
        expected: usize,
        /// Elements given.
        found: usize,
    },
    /// The number of tokens or targets is not `B * T`.
    BatchLength {
        /// `"tokens"` or `"targets"`.
        what: &'static str,
        /// `B * T`.
        expected: usize,
        /// Length given.
        found: usize,
    },
    /// A token or target id is not below the vocabulary size.
    OutOfVocabulary {
        /// `"token"` or `"target"`.
        what: &'static str,
        /// Flat position `b * T + t`.
        position: usize,
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// Every target is absent, so the mean loss is undefined.
    NoTargets,
    /// `backward` was called without a preceding training `forward`.
    BackwardWithoutForward,
    /// The activation layout does not fill the arena the planner sizes
    /// (`planner::memory::cpu_arena`): the two formulas drifted apart.
    ArenaSize {
        /// Elements the planner gives the arena.
        planned: usize,
        /// Elements the layout needs.
        laid_out: usize,
    },
    /// A `position_ids` entry beyond the model's positions.
    PositionOutOfRange {
        /// Token index in the batch.
        index: usize,
        /// The position given.
        position: u32,
        /// Positions the model has (`max_position_embeddings`, or the rotary table's length).
        max_positions: usize,
    },
    /// An `attention_mask` entry other than 0 or 1.
    MaskValue {
        /// Token index in the batch.
        index: usize,
        /// The value given.
        value: u8,
    },
    /// The batch carries `position_ids` or an `attention_mask`, which this family's passes do
    /// not take.
    MaskingUnsupported {
        /// The family.
        family: &'static str,
    },
    /// The loss divisor given is not a positive finite number.
    LossDivisor {
        /// The value given.
        divisor: String,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Config(error) => error.fmt(f),
            ModelError::EmptyBatch => write!(f, "batch size and sequence length must be positive"),
            ModelError::SequenceTooLong {
                seq_len,
                n_positions,
            } => write!(
                f,
                "sequence length {seq_len} exceeds the model's n_positions ({n_positions})"
            ),
            ModelError::SlidingWindow { seq_len, window } => write!(
                f,
                "sequence length {seq_len} exceeds the model's sliding_window ({window}); attention outside the window is not implemented, use a sequence length of at most {window}"
            ),
            ModelError::ParamCount { expected, found } => write!(
                f,
                "parameter buffer has {found} elements, the model needs {expected}"
            ),
            ModelError::BatchLength {
                what,
                expected,
                found,
            } => write!(
                f,
                "got {found} {what}, the model is sized for batch * seq_len = {expected}"
            ),
            ModelError::OutOfVocabulary {
                what,
                position,
                id,
                vocab_size,
            } => write!(
                f,
                "{what} {id} at position {position} is outside the vocabulary (size {vocab_size})"
            ),
            ModelError::NoTargets => write!(f, "the batch has no targets, so there is no loss"),
            ModelError::BackwardWithoutForward => {
                write!(f, "backward needs a forward pass with targets first")
            }
            ModelError::ArenaSize { planned, laid_out } => write!(
                f,
                "the activation layout needs {laid_out} elements, the planner sizes the arena at {planned}"
            ),
            ModelError::PositionOutOfRange {
                index,
                position,
                max_positions,
            } => write!(
                f,
                "position id {position} at token {index} is beyond the model's {max_positions} positions (max_position_embeddings); pack or truncate rows to at most {max_positions} tokens per document"
            ),
            ModelError::MaskValue { index, value } => write!(
                f,
                "attention_mask entry {value} at token {index}: it must be 1 (a token) or 0 (padding)"
            ),
            ModelError::MaskingUnsupported { family } => write!(
                f,
                "{family} trains on plain causal rows only: this batch has position_ids or an attention_mask (padded or packed SFT batches need a Llama-family model)"
            ),
            ModelError::LossDivisor { divisor } => write!(
                f,
                "the loss divisor {divisor} is not a positive number of label tokens"
            ),
        }
    }
}

impl std::error::Error for ModelError {}

impl From<ConfigError> for ModelError {
    fn from(error: ConfigError) -> Self {
        ModelError::Config(error)
    }
}
