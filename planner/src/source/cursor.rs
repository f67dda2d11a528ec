//! A position in the text, and skipping what lies between tokens: JSON whitespace and the
//! three comment styles hjson accepts (`// ...`, `# ...`, `/* ... */`), each counted as
//! non-strict.

use super::error::ParseError;
use super::strictness::{Leniency, NonStrictTally};

/// A byte position in the text being parsed. It only ever stops on ASCII bytes or at the end,
/// so slicing the text at it is always valid.
pub(crate) struct Cursor<'t> {
    text: &'t str,
    pos: usize,
    /// The non-strict syntax seen so far.
    pub non_strict: NonStrictTally,
}

impl<'t> Cursor<'t> {
    /// A cursor at the start of `text`.
    pub fn new(text: &'t str, non_strict: NonStrictTally) -> Self {
        Cursor {
            text,
            pos: 0,
            non_strict,
        }
    }

    /// The whole text.
    pub fn text(&self) -> &'t str {
        self.text
    }

    /// The current byte offset.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// The byte at the cursor, `None` at the end.
    pub fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    /// The byte `ahead` bytes past the cursor.
    pub fn peek_at(&self, ahead: usize) -> Option<u8> {
        self.text.as_bytes().get(self.pos + ahead).copied()
    }

    /// Whether the text at the cursor starts with `prefix`.
    pub fn starts_with(&self, prefix: &str) -> bool {
        self.text.as_bytes()[self.pos..].starts_with(prefix.as_bytes())
    }

    /// Move forward `count` bytes (the caller knows they are there and end on a boundary).
    pub fn advance(&mut self, count: usize) {
        self.pos = (self.pos + count).min(self.text.len());
    }

    /// Move forward while `keep` holds for the byte at the cursor.
    pub fn advance_while(&mut self, keep: impl Fn(u8) -> bool) {
        let bytes = self.text.as_bytes();
        while self.pos < bytes.len() && keep(bytes[self.pos]) {
            self.pos += 1;
        }
    }

    /// Skip whitespace and comments. Fails only on a `/*` that is never closed.
    pub fn skip_trivia(&mut self) -> Result<(), ParseError> {
        loop {
            match (self.peek(), self.peek_at(1)) {
                (Some(b' ' | b'\t' | b'\n' | b'\r'), _) => self.pos += 1,
                (Some(b'#'), _) | (Some(b'/'), Some(b'/')) => {
                    self.non_strict.record(Leniency::Comment, self.pos);
                    self.advance_while(|byte| byte != b'\n');
                }
                (Some(b'/'), Some(b'*')) => {
                    self.non_strict.record(Leniency::Comment, self.pos);
                    let body = self.pos + 2;
                    match self.text[body..].find("*/") {
                        Some(end) => self.pos = body + end + 2,
                        None => {
                            return Err(ParseError::syntax(
                                self.pos,
                                "this `/*` comment is never closed",
                            )
                            .with_help("close the comment with `*/`"));
                        }
                    }
                }
                _ => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::decode::ByteOrderMark;

    fn cursor(text: &str) -> Cursor<'_> {
        Cursor::new(text, NonStrictTally::new(ByteOrderMark::Absent))
    }

    #[test]
    fn skips_whitespace_without_counting_it() {
        let mut at = cursor(" \t\r\n{");
        at.skip_trivia().expect("trivia");
        assert_eq!(at.peek(), Some(b'{'));
        assert!(at.non_strict.is_empty());
    }

    #[test]
    fn skips_and_counts_all_three_comment_styles() {
        let mut at = cursor("// a\n# b\n/* c\n * d */ /**/{");
        at.skip_trivia().expect("trivia");
        assert_eq!(at.peek(), Some(b'{'));
        assert!(at.non_strict.has_comments());
        let text = "// a\n# b\n/* c\n * d */ /**/{";
        let summary = at
            .non_strict
            .summary(text, &crate::source::lines::LineIndex::new(text))
            .expect("warning");
        assert!(
            summary.message.ends_with("4 comments"),
            "{}",
            summary.message
        );
    }

    #[test]
    fn a_lone_slash_is_not_trivia() {
        let mut at = cursor("/x");
        at.skip_trivia().expect("trivia");
        assert_eq!(at.pos(), 0);
    }

    #[test]
    fn an_unclosed_block_comment_is_an_error_at_its_start() {
        let mut at = cursor("  /* never closed *");
        let error = at.skip_trivia().expect_err("unclosed");
        assert_eq!(error.offset, 2);
        assert!(error.message.contains("never closed"));
    }

    #[test]
    fn a_line_comment_may_end_the_file() {
        let mut at = cursor("# last");
        at.skip_trivia().expect("trivia");
        assert_eq!(at.peek(), None);
    }
}
