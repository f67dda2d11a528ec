//! The fast encoder: the ids of `Tokenizer::encode` for the tokenizer shapes of [`shape`]
//! (byte-level BPE with GPT-2's, Llama 3's or Qwen 2's split pattern; SentencePiece-style
//! Metaspace BPE), computed without the crate's offset-tracking pipeline:
//!
//! 1. the added tokens are found first ([`added`]), as the crate finds them;
//! 2. the text between them is cut into the pre-tokenizer's pieces ([`words`], [`pattern`]);
//! 3. each piece's ids come from a per-thread cache ([`cache`]), or on a miss from the crate's
//!    own BPE model;
//! 4. the post-processor's special tokens go around them ([`post`]).
//!
//! The crate stays the oracle: `tests/fast_encoder.rs` compares every id with the crate's on
//! a large varied corpus, with the cache and without it. Offsets are computed for Metaspace
//! tokenizers ([`FastEncoder::encode_with_offsets`], also checked against the crate's);
//! byte-level ones keep the crate's path for them.

mod added;
mod bytes;
mod cache;
mod classes;
mod pattern;
mod post;
mod shape;
mod words;

use std::fmt;

use tokenizers::Tokenizer;

use super::AddSpecial;
use words::Sink;

pub use cache::Caching;

/// Why a tokenizer is not taken by the fast encoder (it keeps the crate's path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsupported {
    /// The reason, e.g. "it has a normalizer".
    pub reason: String,
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the fast encoder does not take this tokenizer: {}",
            self.reason
        )
    }
}

/// Token ids and each token's byte span in the text.
pub type IdsAndSpans = (Vec<u32>, Vec<(usize, usize)>);

/// A fast encoder of one tokenizer.
#[derive(Debug, Clone)]
pub struct FastEncoder {
    added: added::AddedSplitter,
    words: words::Words,
    post: post::Template,
    cache_key: usize,
}

impl FastEncoder {
    /// The encoder of `tokenizer`, when its shape is supported.
    pub fn new(tokenizer: &Tokenizer) -> Result<Self, Unsupported> {
        let shape = shape::read(tokenizer).map_err(|reason| Unsupported { reason })?;
        Ok(Self {
            added: shape.added,
            words: shape.words,
            post: shape.post,
            cache_key: cache::new_key(),
        })
    }

    /// The ids of `text`, equal to `tokenizer.encode(text, special)`'s; `tokenizer` must be
    /// the one the encoder was built from.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        special: AddSpecial,
        caching: Caching,
    ) -> Result<Vec<u32>, String> {
        let mut ids = Vec::with_capacity(text.len() / 2 + 8);
        self.run(tokenizer, text, special, caching, &mut ids, None)?;
        // The guess is generous (about four bytes make a token): the row keeps what it holds.
        ids.shrink_to_fit();
        Ok(ids)
    }

    /// Whether [`encode_with_offsets`](Self::encode_with_offsets) gives offsets (Metaspace
    /// tokenizers).
    pub fn gives_offsets(&self) -> bool {
        self.words.gives_offsets()
    }

    /// The ids of `text` and each token's byte span, equal to the crate's `encode` (the
    /// post-processor's tokens span `(0, 0)`), or `None` when this encoder does not give
    /// offsets ([`gives_offsets`](Self::gives_offsets)).
    pub fn encode_with_offsets(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        special: AddSpecial,
        caching: Caching,
    ) -> Result<Option<IdsAndSpans>, String> {
        if !self.gives_offsets() {
            return Ok(None);
        }
        let mut ids = Vec::with_capacity(text.len() / 2 + 8);
        let mut offsets = Vec::with_capacity(text.len() / 2 + 8);
        self.run(
            tokenizer,
            text,
            special,
            caching,
            &mut ids,
            Some(&mut offsets),
        )?;
        Ok(Some((ids, offsets)))
    }

    fn run(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        special: AddSpecial,
        caching: Caching,
        ids: &mut Vec<u32>,
        mut offsets: Option<&mut Vec<(usize, usize)>>,
    ) -> Result<(), String> {
        let model = tokenizer.get_model();
        if special == AddSpecial::Yes {
            ids.extend_from_slice(&self.post.prefix);
            if let Some(offsets) = offsets.as_deref_mut() {
                offsets.extend(self.post.prefix.iter().map(|_| (0, 0)));
            }
        }
        cache::with(self.cache_key, |cache| {
            let mut sink = Sink {
                ids: &mut *ids,
                offsets: offsets.as_deref_mut(),
                cache,
                caching,
            };
            for segment in self.added.segments(text) {
                match segment {
                    added::Segment::Added(id, span) => {
                        sink.ids.push(id);
                        if let Some(offsets) = sink.offsets.as_deref_mut() {
                            offsets.push(span);
                        }
                    }
                    added::Segment::Text(part, offset) => {
                        self.words.encode(part, offset, model, &mut sink)?;
                    }
                }
            }
            Ok::<(), String>(())
        })?;
        if special == AddSpecial::Yes {
            ids.extend_from_slice(&self.post.suffix);
            if let Some(offsets) = offsets {
                offsets.extend(self.post.suffix.iter().map(|_| (0, 0)));
            }
        }
        Ok(())
    }
}
