//! [`DataError`]: why training data could not be read or cut into batches.

use std::fmt;

/// What is wrong with an llm.c token file's header or size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmcProblem {
    /// Fewer bytes than the 1024-byte header.
    ShortHeader {
        /// Bytes in the file.
        bytes: usize,
    },
    /// The first header word is not a known magic number.
    BadMagic {
        /// The word found.
        found: i32,
    },
    /// The magic number is known but the version is not the one it goes with.
    BadVersion {
        /// The magic number.
        magic: i32,
        /// The version found.
        found: i32,
        /// The version that magic number goes with.
        expected: i32,
    },
    /// The header's token count is negative.
    NegativeCount {
        /// The count found.
        count: i32,
    },
    /// The file is not exactly header + count tokens long.
    SizeMismatch {
        /// Tokens the header declares.
        tokens: usize,
        /// Bytes that many tokens need, header included.
        expected_bytes: usize,
        /// Bytes in the file.
        actual_bytes: usize,
    },
}

impl fmt::Display for LlmcProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LlmcProblem::ShortHeader { bytes } => write!(
                f,
                "{bytes} bytes is shorter than the 1024-byte header (256 little-endian int32)"
            ),
            LlmcProblem::BadMagic { found } => write!(
                f,
                "magic number {found} is neither 20240520 (GPT-2, uint16 tokens) nor 20240801 \
                 (Llama 3, uint32 tokens)"
            ),
            LlmcProblem::BadVersion {
                magic,
                found,
                expected,
            } => write!(
                f,
                "version {found} does not go with magic {magic} (expected version {expected})"
            ),
            LlmcProblem::NegativeCount { count } => {
                write!(f, "the header declares a negative token count ({count})")
            }
            LlmcProblem::SizeMismatch {
                tokens,
                expected_bytes,
                actual_bytes,
            } => write!(
                f,
                "the header declares {tokens} tokens ({expected_bytes} bytes with the header) but \
                 the file has {actual_bytes} bytes"
            ),
        }
    }
}

/// Why training data could not be read or cut into batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataError {
    /// A count of the batch layout is zero.
    InvalidLayout {
        /// `micro_batch`, `seq_len`, `grad_accum` or `world`.
        field: &'static str,
        /// The value given.
        value: usize,
    },
    /// The layout's global batch does not fit in memory-addressable sizes.
    LayoutTooLarge,
    /// A rank outside the layout's world.
    RankOutOfRange {
        /// The rank asked for.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A micro-step outside the layout's accumulation steps.
    MicroStepOutOfRange {
        /// The micro-step asked for.
        micro_step: usize,
        /// Micro-steps per optimizer step.
        grad_accum: usize,
    },
    /// A file could not be read.
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// A token stream is too short for one global batch.
    TooSmall {
        /// Where the tokens came from.
        origin: String,
        /// Tokens available.
        tokens: usize,
        /// Tokens one global batch needs: `global_batch * seq_len + 1`.
        needed: usize,
        /// Rows per global batch.
        global_batch: usize,
        /// Predicted positions per row.
        seq_len: usize,
    },
    /// An llm.c `.bin` token file is malformed.
    Llmc {
        /// The file.
        origin: String,
        /// What is wrong.
        problem: LlmcProblem,
    },
    /// A safetensors file could not be parsed.
    Safetensors {
        /// The file.
        origin: String,
        /// The parser's message.
        message: String,
    },
    /// The tensor holding the batches is not in the file.
    MissingTensor {
        /// The file.
        origin: String,
        /// The tensor looked for.
        name: String,
        /// The tensors the file has.
        available: Vec<String>,
    },
    /// The batch tensor is not an integer tensor.
    UnsupportedDtype {
        /// The file.
        origin: String,
        /// The tensor.
        name: String,
        /// Its dtype, as safetensors names it.
        dtype: String,
    },
    /// The batch tensor has neither shape `[steps, global_batch, row]` nor `[global_batch, row]`.
    WrongShape {
        /// The file.
        origin: String,
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// The stored rows are not `seq_len + 1` tokens long.
    RowLength {
        /// The file.
        origin: String,
        /// Tokens per stored row.
        stored: usize,
        /// `seq_len + 1` of the layout.
        expected: usize,
    },
    /// The stored global batch does not match `micro_batch * grad_accum * world`.
    GlobalBatch {
        /// The file.
        origin: String,
        /// Rows per stored step.
        stored: usize,
        /// Rows the layout needs.
        expected: usize,
    },
    /// A stored token id is negative or does not fit in 32 bits.
    InvalidToken {
        /// The file.
        origin: String,
        /// Flat index of the element.
        index: usize,
        /// Its value.
        value: i128,
    },
    /// A step beyond the last stored batch.
    StepOutOfRange {
        /// The step asked for.
        step: u64,
        /// Steps stored.
        steps: u64,
    },
    /// A row index beyond the global batch.
    RowOutOfRange {
        /// The row asked for.
        row: usize,
        /// Rows per global batch.
        global_batch: usize,
    },
    /// A file of recorded micro-batches (`train.stepSS.microM.*`, `eval.batchBB.*`) that does
    /// not hold what its name promises.
    Recorded {
        /// The file.
        origin: String,
        /// The tensor (or the tensor name's prefix) at fault.
        tensor: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The output buffer for a row has the wrong length.
    RowBuffer {
        /// Its length.
        found: usize,
        /// `seq_len + 1`.
        expected: usize,
    },
}

impl fmt::Display for DataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataError::InvalidLayout { field, value } => {
                write!(f, "batch layout: `{field}` must be at least 1, got {value}")
            }
            DataError::LayoutTooLarge => write!(f, "batch layout: the global batch is too large"),
            DataError::RankOutOfRange { rank, world } => {
                write!(f, "rank {rank} is outside a data-parallel world of {world}")
            }
            DataError::MicroStepOutOfRange {
                micro_step,
                grad_accum,
            } => write!(
                f,
                "micro-step {micro_step} is outside the {grad_accum} accumulation steps of an \
                 optimizer step"
            ),
            DataError::Io { path, message } => write!(f, "cannot read `{path}`: {message}"),
            DataError::TooSmall {
                origin,
                tokens,
                needed,
                global_batch,
                seq_len,
            } => write!(
                f,
                "`{origin}` has {tokens} tokens, fewer than the {needed} that one global batch of \
                 {global_batch} rows x {seq_len} positions needs (global batch x seq_len + 1)"
            ),
            DataError::Llmc { origin, problem } => {
                write!(f, "`{origin}` is not an llm.c token file: {problem}")
            }
            DataError::Safetensors { origin, message } => {
                write!(
                    f,
                    "`{origin}` is not a readable safetensors file: {message}"
                )
            }
            DataError::MissingTensor {
                origin,
                name,
                available,
            } => write!(
                f,
                "`{origin}` has no tensor `{name}` (it has: {})",
                available.join(", ")
            ),
            DataError::UnsupportedDtype {
                origin,
                name,
                dtype,
            } => write!(
                f,
                "`{origin}`: tensor `{name}` has dtype {dtype}; token ids must be an integer \
                 dtype (I64, I32, I16, I8, U64, U32, U16, U8)"
            ),
            DataError::WrongShape {
                origin,
                name,
                shape,
            } => write!(
                f,
                "`{origin}`: tensor `{name}` has shape {shape:?}; expected [steps, global_batch, \
                 seq_len + 1] or [global_batch, seq_len + 1] with no zero dimension"
            ),
            DataError::RowLength {
                origin,
                stored,
                expected,
            } => write!(
                f,
                "`{origin}` stores rows of {stored} tokens, but seq_len + 1 = {expected}; set \
                 seq_len to {}",
                stored.saturating_sub(1)
            ),
            DataError::GlobalBatch {
                origin,
                stored,
                expected,
            } => write!(
                f,
                "`{origin}` stores global batches of {stored} rows, but micro_batch x grad_accum \
                 x world = {expected}"
            ),
            DataError::InvalidToken {
                origin,
                index,
                value,
            } => write!(
                f,
                "`{origin}`: element {index} is {value}, not a token id (0 ..= 4294967295)"
            ),
            DataError::StepOutOfRange { step, steps } => write!(
                f,
                "step {step} is past the end of the stored batches ({steps} steps, 0..{steps})"
            ),
            DataError::RowOutOfRange { row, global_batch } => {
                write!(
                    f,
                    "row {row} is outside a global batch of {global_batch} rows"
                )
            }
            DataError::Recorded {
                origin,
                tensor,
                message,
            } => write!(f, "`{origin}`: `{tensor}`: {message}"),
            DataError::RowBuffer { found, expected } => write!(
                f,
                "a row buffer of {found} tokens was given for rows of {expected} tokens"
            ),
        }
    }
}

impl std::error::Error for DataError {}
