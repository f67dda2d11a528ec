//! The added tokens (`added_tokens` of `tokenizer.json`) found in a text as the crate's
//! `AddedVocabulary` finds them: leftmost-longest matches of the tokens that are not
//! normalized over the whole text, then of the normalized ones in the text between (the
//! tokenizers supported here have no normalizer). Only plain tokens are supported: no
//! `single_word`, `lstrip` or `rstrip`.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::AddedToken;

/// One part of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    /// An added token's id, and its byte span in the whole text.
    Added(u32, (usize, usize)),
    /// Text between added tokens, and its byte offset in the whole text.
    Text(&'a str, usize),
}

/// A leftmost-longest matcher of some added tokens, with their ids.
#[derive(Debug, Clone)]
struct Matcher {
    automaton: AhoCorasick,
    ids: Vec<u32>,
}

impl Matcher {
    fn new(tokens: &[(u32, String)]) -> Result<Option<Self>, String> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let automaton = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(_, content)| content))
            .map_err(|e| format!("the added tokens do not build a matcher: {e}"))?;
        Ok(Some(Self {
            automaton,
            ids: tokens.iter().map(|&(id, _)| id).collect(),
        }))
    }
}

/// Splits texts on the added tokens.
#[derive(Debug, Clone)]
pub struct AddedSplitter {
    raw: Option<Matcher>,
    normalized: Option<Matcher>,
}

impl AddedSplitter {
    /// The splitter of the tokens `(id, token)`, or why they are not supported.
    pub fn new(tokens: impl IntoIterator<Item = (u32, AddedToken)>) -> Result<Self, String> {
        let (mut raw, mut normalized) = (Vec::new(), Vec::new());
        for (id, token) in tokens {
            if token.single_word || token.lstrip || token.rstrip || token.content.is_empty() {
                return Err(format!(
                    "added token {:?} is single_word, lstrip, rstrip or empty",
                    token.content
                ));
            }
            let list = if token.normalized {
                &mut normalized
            } else {
                &mut raw
            };
            list.push((id, token.content));
        }
        for list in [&mut raw, &mut normalized] {
            list.sort();
            if list.windows(2).any(|pair| pair[0].1 == pair[1].1) {
                return Err("two added tokens have the same content".into());
            }
        }
        Ok(Self {
            raw: Matcher::new(&raw)?,
            normalized: Matcher::new(&normalized)?,
        })
    }

    /// The segments of `text`, in order; empty text between tokens is left out.
    pub fn segments<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        let mut first = Vec::new();
        split(self.raw.as_ref(), text, 0, &mut first);
        let Some(normalized) = &self.normalized else {
            return first;
        };
        let mut out = Vec::with_capacity(first.len());
        for segment in first {
            match segment {
                Segment::Text(piece, offset) => split(Some(normalized), piece, offset, &mut out),
                added => out.push(added),
            }
        }
        out
    }
}

/// Appends the segments of `text` (at `offset` in the whole text) split on `matcher`'s tokens.
/// The tokens are UTF-8, so every match starts and ends on a character boundary.
fn split<'a>(matcher: Option<&Matcher>, text: &'a str, offset: usize, out: &mut Vec<Segment<'a>>) {
    let mut start = 0;
    if let Some(matcher) = matcher {
        for found in matcher.automaton.find_iter(text) {
            if found.start() > start {
                out.push(Segment::Text(&text[start..found.start()], offset + start));
            }
            out.push(Segment::Added(
                matcher.ids[found.pattern().as_usize()],
                (offset + found.start(), offset + found.end()),
            ));
            start = found.end();
        }
    }
    if start < text.len() {
        out.push(Segment::Text(&text[start..], offset + start));
    }
}
