//! llm.c's token files (`*.bin`, written by `dev/data/data_common.py::write_datafile`).
//!
//! Layout, all little-endian:
//!
//! | bytes | contents |
//! |---|---|
//! | `0..4` | magic, int32: `20240520` (GPT-2 tokenizer) or `20240801` (Llama 3 tokenizer) |
//! | `4..8` | version, int32: `1` with magic 20240520 (tokens are uint16), `7` with 20240801 (uint32) |
//! | `8..12` | token count `n`, int32 |
//! | `12..1024` | zero (the header is always 256 int32) |
//! | `1024..` | `n` tokens, uint16 or uint32 as the version says; nothing after them |
//!
//! The file must be exactly `1024 + n * width` bytes, as llm.c's loader requires.

use super::LlmcProblem;

/// Bytes of the header.
pub const HEADER_BYTES: usize = 1024;

/// The token formats llm.c writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlmcFormat {
    /// Magic 20240520, version 1: uint16 tokens (GPT-2's 50257-token vocabulary).
    Gpt2,
    /// Magic 20240801, version 7: uint32 tokens (Llama 3's 128256-token vocabulary).
    Llama3,
}

impl LlmcFormat {
    /// The header's magic number.
    pub const fn magic(self) -> i32 {
        match self {
            LlmcFormat::Gpt2 => 20240520,
            LlmcFormat::Llama3 => 20240801,
        }
    }

    /// The header's version.
    pub const fn version(self) -> i32 {
        match self {
            LlmcFormat::Gpt2 => 1,
            LlmcFormat::Llama3 => 7,
        }
    }

    /// Bytes per token.
    pub const fn token_bytes(self) -> usize {
        match self {
            LlmcFormat::Gpt2 => 2,
            LlmcFormat::Llama3 => 4,
        }
    }

    fn from_magic(magic: i32) -> Option<Self> {
        [LlmcFormat::Gpt2, LlmcFormat::Llama3]
            .into_iter()
            .find(|format| format.magic() == magic)
    }
}

/// Reads the tokens of an llm.c token file.
pub fn parse_llmc_tokens(bytes: &[u8]) -> Result<(LlmcFormat, Vec<u32>), LlmcProblem> {
    let word = |index: usize| {
        let at = index * 4;
        bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_le_bytes)
    };
    let (Some(magic), Some(version), Some(count), true) =
        (word(0), word(1), word(2), bytes.len() >= HEADER_BYTES)
    else {
        return Err(LlmcProblem::ShortHeader { bytes: bytes.len() });
    };
    let format = LlmcFormat::from_magic(magic).ok_or(LlmcProblem::BadMagic { found: magic })?;
    if version != format.version() {
        return Err(LlmcProblem::BadVersion {
            magic,
            found: version,
            expected: format.version(),
        });
    }
    let tokens = usize::try_from(count).map_err(|_| LlmcProblem::NegativeCount { count })?;
    let width = format.token_bytes();
    let expected_bytes = HEADER_BYTES + tokens * width;
    if bytes.len() != expected_bytes {
        return Err(LlmcProblem::SizeMismatch {
            tokens,
            expected_bytes,
            actual_bytes: bytes.len(),
        });
    }
    let body = &bytes[HEADER_BYTES..];
    let ids = match format {
        LlmcFormat::Gpt2 => body
            .chunks_exact(2)
            .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
            .collect(),
        LlmcFormat::Llama3 => body
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    };
    Ok((format, ids))
}

/// An llm.c token file holding `tokens` (the inverse of [`parse_llmc_tokens`]); tokens that do
/// not fit the format's width are an error (returned as the first offending index).
pub fn write_llmc_tokens(format: LlmcFormat, tokens: &[u32]) -> Result<Vec<u8>, usize> {
    let count = i32::try_from(tokens.len()).map_err(|_| tokens.len())?;
    let mut bytes = vec![0u8; HEADER_BYTES];
    for (index, value) in [format.magic(), format.version(), count]
        .into_iter()
        .enumerate()
    {
        bytes[index * 4..index * 4 + 4].copy_from_slice(&value.to_le_bytes());
    }
    bytes.reserve(tokens.len() * format.token_bytes());
    for (index, &token) in tokens.iter().enumerate() {
        match format {
            LlmcFormat::Gpt2 => {
                let narrow = u16::try_from(token).map_err(|_| index)?;
                bytes.extend_from_slice(&narrow.to_le_bytes());
            }
            LlmcFormat::Llama3 => bytes.extend_from_slice(&token.to_le_bytes()),
        }
    }
    Ok(bytes)
}
