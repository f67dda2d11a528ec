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
//!
//! Metaspace words can also give each token's byte span in the original text, as the crate's
//! `NormalizedString` alignments give it ([`Aligner`]): a replacement that stands for a space
//! spans that space, a prepended one spans the segment's first character, and a token ending
//! inside a character (byte fallback) spans the whole character.

use tokenizers::{Model, ModelWrapper};

use super::bytes::ByteChars;
use super::cache::{Caching, PieceTokens, WordCache};
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

/// The tokens the crate's model gives `word`.
fn model_tokens(model: &ModelWrapper, word: &str) -> Result<PieceTokens, String> {
    let tokens = model.tokenize(word).map_err(|e| e.to_string())?;
    let ids = tokens.iter().map(|token| token.id).collect();
    let ends = tokens
        .iter()
        .map(|token| u32::try_from(token.offsets.1).map_err(|e| e.to_string()))
        .collect::<Result<_, String>>()?;
    Ok(PieceTokens { ids, ends })
}

/// Where the encoder puts what it finds.
pub struct Sink<'a> {
    /// Token ids.
    pub ids: &'a mut Vec<u32>,
    /// Each token's byte span in the text, when asked for (Metaspace only).
    pub offsets: Option<&'a mut Vec<(usize, usize)>>,
    /// The per-thread cache.
    pub cache: &'a mut WordCache,
    /// Whether the cache is used.
    pub caching: Caching,
}

impl Words {
    /// Whether [`Sink::offsets`] can be filled (Metaspace words).
    pub fn gives_offsets(&self) -> bool {
        matches!(self, Words::Metaspace { .. })
    }

    /// Appends the ids of `segment` (at byte `offset` of the text) to `sink`, and their spans
    /// when it asks for them and [`gives_offsets`](Self::gives_offsets).
    pub fn encode(
        &self,
        segment: &str,
        offset: usize,
        model: &ModelWrapper,
        sink: &mut Sink<'_>,
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
                    sink.cache
                        .extend(sink.caching, piece.as_bytes(), sink.ids, || {
                            model_tokens(model, &bytes.map(piece))
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
                let (text, prepended) = metaspace_text(segment, offset, *replacement, *prepend);
                let mut aligner = Aligner {
                    text: &text,
                    segment,
                    base: offset,
                    replacement: *replacement,
                    prepended: if prepended { replacement.len_utf8() } else { 0 },
                    first: segment.chars().next().map_or(0, char::len_utf8),
                    normalized: 0,
                    original: 0,
                };
                let mut start = 0;
                let mut previous: Option<char> = None;
                for (at, c) in text.char_indices() {
                    let cuts = c == *replacement
                        && at > 0
                        && (*cut == MetaCut::EveryReplacement || previous != Some(*replacement));
                    if cuts {
                        meta_piece(&text, start..at, model, sink, &mut aligner)?;
                        start = at;
                    }
                    previous = Some(c);
                }
                meta_piece(&text, start..text.len(), model, sink, &mut aligner)
            }
        }
    }
}

/// Appends the tokens of the Metaspace piece `text[range]` to `sink`.
fn meta_piece(
    text: &str,
    range: std::ops::Range<usize>,
    model: &ModelWrapper,
    sink: &mut Sink<'_>,
    aligner: &mut Aligner<'_>,
) -> Result<(), String> {
    let start = range.start;
    let piece = &text[range];
    let Sink {
        ids,
        offsets,
        cache,
        caching,
    } = sink;
    cache.with(
        *caching,
        piece.as_bytes(),
        || model_tokens(model, piece),
        |found, ends| {
            ids.extend_from_slice(found);
            if let Some(offsets) = offsets {
                let mut from = start;
                for &end in ends {
                    let to = start + end as usize;
                    let first = aligner.at(from).0;
                    let last = aligner.at(to.saturating_sub(1).max(from)).1;
                    offsets.push((first, last));
                    from = to;
                }
            }
        },
    )
}

/// The original span of each byte of a Metaspace text, walked forward (tokens come in order).
struct Aligner<'a> {
    /// The Metaspace text.
    text: &'a str,
    /// The segment it was made from.
    segment: &'a str,
    /// The segment's offset in the whole text.
    base: usize,
    replacement: char,
    /// The bytes of the prepended replacement (0 when none was).
    prepended: usize,
    /// The bytes of the segment's first character.
    first: usize,
    /// The character of `text` the walk is at, and where it stands in `segment`.
    normalized: usize,
    original: usize,
}

impl Aligner<'_> {
    /// The original span (in the whole text) of the character holding byte `at` of the text;
    /// `at` must not be before the previous call's.
    fn at(&mut self, at: usize) -> (usize, usize) {
        loop {
            let (width, span, advance) = if self.normalized < self.prepended {
                (self.prepended, (0, self.first), 0)
            } else {
                let Some(c) = self.text[self.normalized..].chars().next() else {
                    let end = self.base + self.original;
                    return (end, end);
                };
                let o = self.original;
                let width = c.len_utf8();
                if c == self.replacement && self.segment.as_bytes().get(o) == Some(&b' ') {
                    (width, (o, o + 1), 1)
                } else {
                    (width, (o, o + width), width)
                }
            };
            if at < self.normalized + width {
                return (self.base + span.0, self.base + span.1);
            }
            self.normalized += width;
            self.original += advance;
        }
    }
}

/// `segment` with its spaces replaced and the replacement prepended per `prepend`, and
/// whether it was.
fn metaspace_text(
    segment: &str,
    offset: usize,
    replacement: char,
    prepend: Prepend,
) -> (String, bool) {
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
    (text, prepended)
}
