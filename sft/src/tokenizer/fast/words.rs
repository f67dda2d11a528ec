//! The text between added tokens to ids: cut into the pre-tokenizer's pieces, each piece's
//! ids from the [`WordCache`] or, on a miss, from the crate's own BPE model (so merges, byte
//! fallback and unknown tokens are the crate's).
//!
//! * [`Words::ByteLevel`]: the pieces of a [`Splitter`] pattern (after `add_prefix_space`'s
//!   space), each mapped byte by byte ([`ByteChars`]) for the model.
//! * [`Words::Metaspace`]: spaces replaced by the replacement character (`▁`), which is
//!   prepended per `prepend_scheme`; with `split` the pieces start at each `▁`, as the crate
//!   cuts them. Without `split` the crate gives the model the whole text as one word; it is cut
//!   here before each `▁` that follows another character, which changes nothing when no
//!   vocabulary token holds a character followed by `▁` (checked when the encoder is built):
//!   no merge can then cross such a cut, and BPE on each side runs the same merges in the same
//!   order as on the whole.

use tokenizers::{Model, ModelWrapper};

use super::bytes::ByteChars;
use super::cache::WordCache;
use super::pattern::Splitter;

/// Metaspace's `prepend_scheme`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepend {
    /// Before every text segment that does not start with the replacement.
    Always,
    /// Only before the segment at the start of the text.
    First,
    /// Never.
    Never,
}

/// Where Metaspace pieces are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaCut {
    /// Before every replacement character (`split: true`).
    EveryReplacement,
    /// Before a replacement character that follows another character (`split: false`, see
    /// the module docs).
    AfterOtherChar,
}

/// How a text segment becomes pieces.
#[derive(Debug, Clone)]
pub enum Words {
    /// `ByteLevel` (alone or after a `Split`).
    ByteLevel {
        /// The split pattern.
        splitter: Box<Splitter>,
        /// The byte map.
        bytes: Box<ByteChars>,
        /// `add_prefix_space`: a space before a segment that lacks one.
        prefix_space: bool,
    },
    /// `Metaspace`.
    Metaspace {
        /// The replacement character.
        replacement: char,
        /// `prepend_scheme`.
        prepend: Prepend,
        /// The cuts.
        cut: MetaCut,
    },
}

/// The ids the crate's model gives `word`.
fn model_ids(model: &ModelWrapper, word: &str) -> Result<Vec<u32>, String> {
    model
        .tokenize(word)
        .map(|tokens| tokens.iter().map(|token| token.id).collect())
        .map_err(|e| e.to_string())
}

impl Words {
    /// Appends the ids of `segment` (at byte `offset` of the text) to `ids`.
    pub fn encode(
        &self,
        segment: &str,
        offset: usize,
        cache: &mut WordCache,
        model: &ModelWrapper,
        ids: &mut Vec<u32>,
    ) -> Result<(), String> {
        match self {
            Words::ByteLevel {
                splitter,
                bytes,
                prefix_space,
            } => {
                let spaced;
                let segment = if *prefix_space && !segment.starts_with(' ') {
                    spaced = format!(" {segment}");
                    spaced.as_str()
                } else {
                    segment
                };
                let mut at = 0;
                while at < segment.len() {
                    let end = splitter.piece_end(segment, at);
                    let piece = &segment[at..end];
                    cache.extend(piece.as_bytes(), ids, || {
                        model_ids(model, &bytes.map(piece))
                    })?;
                    at = end;
                }
                Ok(())
            }
            Words::Metaspace {
                replacement,
                prepend,
                cut,
            } => {
                let text = metaspace_text(segment, offset, *replacement, *prepend);
                let mut start = 0;
                let mut previous: Option<char> = None;
                for (at, c) in text.char_indices() {
                    let cuts = c == *replacement
                        && at > 0
                        && (*cut == MetaCut::EveryReplacement || previous != Some(*replacement));
                    if cuts {
                        let piece = &text[start..at];
                        cache.extend(piece.as_bytes(), ids, || model_ids(model, piece))?;
                        start = at;
                    }
                    previous = Some(c);
                }
                let piece = &text[start..];
                cache.extend(piece.as_bytes(), ids, || model_ids(model, piece))
            }
        }
    }
}

/// `segment` with its spaces replaced and the replacement prepended per `prepend`.
fn metaspace_text(segment: &str, offset: usize, replacement: char, prepend: Prepend) -> String {
    let mut text = String::with_capacity(segment.len() + 8);
    let starts = segment.starts_with(' ') || segment.starts_with(replacement);
    let prepended = match prepend {
        Prepend::Always => !starts,
        Prepend::First => !starts && offset == 0,
        Prepend::Never => false,
    };
    if prepended {
        text.push(replacement);
    }
    for (n, part) in segment.split(' ').enumerate() {
        if n > 0 {
            text.push(replacement);
        }
        text.push_str(part);
    }
    text
}
