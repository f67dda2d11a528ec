//! Fatal parse errors as data, and how to name the token the parser found instead of what it
//! expected.

use super::lines::LineIndex;
use crate::diagnostics::{Code, Diagnostic};

/// The longest token text quoted in a message, in characters.
const MAX_QUOTED_CHARS: usize = 40;

/// A fatal problem at one byte offset. Lexing functions leave `pointer` empty; the parser
/// fills it with the path of the value it was reading.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError {
    /// Which fatal code.
    pub code: Code,
    /// Where, as a byte offset into the text.
    pub offset: usize,
    /// JSON pointer of the value being read (`""` for the document).
    pub pointer: String,
    /// What went wrong.
    pub message: String,
    /// How to fix it.
    pub help: Option<String>,
}

impl ParseError {
    /// A [`Code::SyntaxError`] at `offset`.
    pub fn syntax(offset: usize, message: impl Into<String>) -> Self {
        Self::new(Code::SyntaxError, offset, message)
    }

    /// An error of any code at `offset`.
    pub fn new(code: Code, offset: usize, message: impl Into<String>) -> Self {
        ParseError {
            code,
            offset,
            pointer: String::new(),
            message: message.into(),
            help: None,
        }
    }

    /// Attach a fix.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Attach the pointer of the value being read, unless one is already set.
    pub fn within(mut self, pointer: impl FnOnce() -> String) -> Self {
        if self.pointer.is_empty() {
            self.pointer = pointer();
        }
        self
    }

    /// The located diagnostic.
    pub fn into_diagnostic(self, text: &str, lines: &LineIndex) -> Diagnostic {
        let (line, column) = lines.line_col(text, self.offset);
        let diagnostic = Diagnostic::error(self.code, self.pointer, self.message).at(line, column);
        match self.help {
            Some(help) => diagnostic.with_help(help),
            None => diagnostic,
        }
    }
}

/// Characters that make up a bare word or number as a user would see it (`True`, `1e9`,
/// `-Infinity`, `1_000`).
pub(crate) fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '+' | '.')
}

/// The bare word starting at `offset` (empty when none does).
pub(crate) fn word_at(text: &str, offset: usize) -> &str {
    let rest = text.get(offset..).unwrap_or("");
    let end = rest
        .char_indices()
        .find(|&(_, c)| !is_word_char(c))
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// How a message names what starts at `offset`: `` `"stage"` ``, `` `True` ``, `` `;` `` or
/// `the end of the file`.
pub(crate) fn describe_found(text: &str, offset: usize) -> String {
    match token_at(text, offset) {
        "" => "the end of the file".to_owned(),
        token => quote(token),
    }
}

/// The token a user sees at `offset`: a string literal (to its closing quote or the end of
/// its line), a bare word or number, or a single character; empty at the end of the text.
pub(crate) fn token_at(text: &str, offset: usize) -> &str {
    let rest = text.get(offset..).unwrap_or("");
    match rest.chars().next() {
        None => "",
        Some('"') => string_literal_prefix(rest),
        Some(first) if is_word_char(first) => word_at(text, offset),
        Some(first) => &rest[..first.len_utf8()],
    }
}

/// A token in backticks, shortened when long, control characters escaped.
pub(crate) fn quote(token: &str) -> String {
    let mut shown: String = token
        .chars()
        .take(MAX_QUOTED_CHARS)
        .flat_map(|c| {
            if c.is_control() {
                c.escape_debug().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if token.chars().count() > MAX_QUOTED_CHARS {
        shown.push('…');
    }
    format!("`{shown}`")
}

/// A string literal from its opening quote to its closing quote, or to the end of the line
/// when it is not closed there.
fn string_literal_prefix(rest: &str) -> &str {
    let mut escaped = false;
    for (at, c) in rest.char_indices().skip(1) {
        match c {
            '\n' | '\r' => return &rest[..at],
            '"' if !escaped => return &rest[..at + 1],
            '\\' => escaped = !escaped,
            _ => escaped = false,
        }
    }
    rest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tokens_as_a_user_sees_them() {
        assert_eq!(describe_found("{}", 2), "the end of the file");
        assert_eq!(describe_found(r#"x "stage": 3"#, 2), r#"`"stage"`"#);
        assert_eq!(describe_found(r#""a\"b" "#, 0), r#"`"a\"b"`"#);
        assert_eq!(describe_found("\"open\n", 0), "`\"open`");
        assert_eq!(describe_found("True,", 0), "`True`");
        assert_eq!(describe_found("-Infinity}", 0), "`-Infinity`");
        assert_eq!(describe_found(";", 0), "`;`");
        assert_eq!(describe_found("\u{7}", 0), "`\\u{7}`");
        let long = format!("\"{}\"", "x".repeat(100));
        assert_eq!(describe_found(&long, 0), format!("`\"{}…`", "x".repeat(39)));
    }

    #[test]
    fn errors_become_located_diagnostics() {
        let text = "{\n  \"a\" 1\n}";
        let lines = LineIndex::new(text);
        let error = ParseError::syntax(text.find('1').expect("digit"), "expected `:`")
            .with_help("add `:`")
            .within(|| "/a".to_owned())
            .within(|| "/ignored".to_owned());
        let diagnostic = error.into_diagnostic(text, &lines);
        assert_eq!(diagnostic.code, Code::SyntaxError);
        assert_eq!(diagnostic.pointer, "/a");
        assert_eq!((diagnostic.line, diagnostic.column), (Some(2), Some(7)));
        assert_eq!(diagnostic.help.as_deref(), Some("add `:`"));
    }
}
