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
//! a large varied corpus. Offsets are not computed here (`encode_with_offsets` keeps the
//! crate's path).

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
    ) -> Result<Vec<u32>, String> {
        let model = tokenizer.get_model();
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        if special == AddSpecial::Yes {
            ids.extend_from_slice(&self.post.prefix);
        }
        cache::with(self.cache_key, |cache| {
            for segment in self.added.segments(text) {
                match segment {
                    added::Segment::Added(id) => ids.push(id),
                    added::Segment::Text(part, offset) => {
                        self.words.encode(part, offset, cache, model, &mut ids)?;
                    }
                }
            }
            Ok::<(), String>(())
        })?;
        if special == AddSpecial::Yes {
            ids.extend_from_slice(&self.post.suffix);
        }
        Ok(ids)
    }
}
