//! Reading a config file: lenient JSON (comments, trailing commas) with byte spans for every
//! value, so diagnostics can name a line and column.
//!
//! DeepSpeed loads a config file with hjson, which accepts `//`, `/* */` and `#` comments and
//! trailing commas, and DeepSpeed rejects duplicate keys. The Hugging Face Trainer and
//! accelerate read the same file with strict `json.loads`. [`SourceFile::parse`] accepts JSON
//! plus those comments and trailing commas (and a leading byte-order mark), warns once per file
//! about them ([`Code::NonStrictJson`](crate::Code::NonStrictJson)), reports duplicate keys
//! ([`Code::DuplicateKey`](crate::Code::DuplicateKey)) and records where every key and value is,
//! so any later diagnostic can be located by its JSON pointer ([`SourceFile::locate`]).
//!
//! The rest of hjson (bare keys, unquoted strings, `'''` strings, optional commas, a root
//! object without braces) is not JSON to any other reader and is a syntax error here, with a
//! help that says how to write it.
//!
//! The reader is a small hand-written recursive-descent parser: linear in the size of the
//! file, nesting limited to [`MAX_DEPTH`] levels (checked before recursing), and it never
//! panics on any input.

mod cursor;
mod decode;
mod error;
mod lines;
mod number;
mod parser;
mod read;
mod spans;
mod strictness;
mod string;

#[cfg(test)]
mod tests;

use crate::diagnostics::Diagnostic;
use lines::LineIndex;
use spans::SpanNode;

pub use parser::MAX_DEPTH;
pub use read::{MAX_CONFIG_BYTES, read_config};

/// A range of bytes in [`SourceFile::text`]: `start` inclusive, `end` exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    /// Byte offset of the first byte.
    pub start: usize,
    /// Byte offset just past the last byte.
    pub end: usize,
}

impl Span {
    /// The text this span covers (`""` when it does not fit `text`).
    pub fn slice<'t>(&self, text: &'t str) -> &'t str {
        text.get(self.start..self.end).unwrap_or("")
    }
}

/// Where one value sits in the text: the value itself and, for an object member, its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Located {
    /// The key (quotes included) when the value is an object member; `None` for the root and
    /// for array items.
    pub key: Option<Span>,
    /// The value: a whole string with its quotes, a whole number, `{...}` or `[...]`.
    pub value: Span,
}

impl Located {
    /// The span a diagnostic about this value points at: the key of an object member, the
    /// value otherwise.
    pub fn anchor(&self) -> Span {
        self.key.unwrap_or(self.value)
    }
}

/// A parsed config file: its text, its JSON value and the position of every value in it.
#[derive(Debug, Clone)]
pub struct SourceFile {
    path: String,
    text: String,
    value: serde_json::Value,
    spans: SpanNode,
    lines: LineIndex,
}

impl SourceFile {
    /// Parse bytes read from `path` (`path` is only for display), for a command that goes on to
    /// use the config: a duplicate key is fatal, as it is to DeepSpeed (which raises on one),
    /// so `resolve`, `schedule`, `estimate`, `plan` and `run` all refuse such a file.
    ///
    /// `Ok` holds the document and the non-fatal diagnostics (non-strict JSON,
    /// [`Code::NonStrictJson`](crate::Code::NonStrictJson), at most one per file). `Err` holds
    /// every diagnostic of a file that cannot be used: each duplicate key
    /// ([`Code::DuplicateKey`](crate::Code::DuplicateKey)) with the other findings, or the
    /// one fatal diagnostic of [`parse_with_duplicates`](Self::parse_with_duplicates).
    pub fn parse(
        path: &str,
        bytes: &[u8],
    ) -> Result<(SourceFile, Vec<Diagnostic>), Vec<Diagnostic>> {
        let (file, diagnostics) = Self::parse_with_duplicates(path, bytes)?;
        if diagnostics.iter().any(Diagnostic::is_error) {
            return Err(diagnostics);
        }
        Ok((file, diagnostics))
    }

    /// Parse bytes read from `path` (`path` is only for display), keeping a document with
    /// duplicate keys so that `validate` can report every other problem in the same run.
    ///
    /// `Ok` holds the document and the non-fatal diagnostics, located and in document order:
    /// duplicate keys ([`Code::DuplicateKey`](crate::Code::DuplicateKey), an error; the last
    /// value is kept as Python's `dict` would) and non-strict JSON
    /// ([`Code::NonStrictJson`](crate::Code::NonStrictJson), at most one per file). `Err`
    /// holds the fatal diagnostic (empty file, not UTF-8, syntax error, too deep, number out
    /// of range, root not an object), with its line and column.
    ///
    /// A leading UTF-8 byte-order mark is skipped (hjson skips it too; strict JSON rejects it,
    /// so it counts as non-strict); [`text`](Self::text) and every offset exclude it.
    pub fn parse_with_duplicates(
        path: &str,
        bytes: &[u8],
    ) -> Result<(SourceFile, Vec<Diagnostic>), Vec<Diagnostic>> {
        let decoded = decode::decode(bytes).map_err(|diagnostic| vec![*diagnostic])?;
        let text = decoded.text.to_owned();
        let lines = LineIndex::new(&text);
        let parsed = parser::parse_document(&text, &lines, decoded.byte_order_mark)
            .map_err(|error| vec![error.into_diagnostic(&text, &lines)])?;
        let mut diagnostics = parsed.duplicates;
        diagnostics.extend(parsed.non_strict.summary(&text, &lines));
        diagnostics.sort_by_key(|d| (d.line, d.column));
        let file = SourceFile {
            path: path.to_owned(),
            text,
            value: parsed.value,
            spans: parsed.spans,
            lines,
        };
        Ok((file, diagnostics))
    }

    /// The path given to [`parse`](Self::parse), for display.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The text of the file (without a leading byte-order mark); all spans index into it.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The parsed document (always an object).
    pub fn value(&self) -> &serde_json::Value {
        &self.value
    }

    /// Where the value at `pointer` (RFC 6901; `""` for the root) is, if it exists. Array
    /// indices must be canonical (`/0`, `/12`; not `/01` or `/-`).
    pub fn span_of(&self, pointer: &str) -> Option<&Located> {
        self.spans.find(pointer)
    }

    /// The span a diagnostic at `pointer` points at: the key for an object member, the value
    /// otherwise; for a pointer that does not exist (a missing key), the same for its nearest
    /// existing ancestor (at worst the root object).
    pub fn anchor_span(&self, pointer: &str) -> Span {
        self.spans.nearest(pointer).anchor()
    }

    /// 1-based line and column (counted in characters) of a byte offset. Offsets past the end
    /// are clamped to the end; offsets inside a character count as that character.
    pub fn line_col(&self, byte_offset: usize) -> (usize, usize) {
        self.lines.line_col(&self.text, byte_offset)
    }

    /// The byte offset of a 1-based line and column (in characters, as in diagnostics);
    /// `None` past the end of the line. Fast on ASCII lines, however long.
    pub fn offset_of(&self, line: usize, column: usize) -> Option<usize> {
        self.lines.offset_of(&self.text, line, column)
    }

    /// The text of a 1-based line, without its line ending.
    pub fn line_text(&self, line: usize) -> Option<&str> {
        self.lines.line_text(&self.text, line)
    }

    /// The byte range of a 1-based line, without its line ending.
    pub fn line_span(&self, line: usize) -> Option<Span> {
        self.lines.line_span(&self.text, line)
    }

    /// Fill `line`/`column` of a diagnostic from its pointer: the key's position for an
    /// object member, the value's otherwise; for a pointer that does not exist (a missing
    /// key), the nearest existing ancestor. A diagnostic that already has a line keeps it
    /// (the parser's own diagnostics are located where the problem is, which a pointer cannot
    /// always say: a comment, the second of two duplicate keys).
    pub fn locate(&self, diagnostic: &mut Diagnostic) {
        if diagnostic.line.is_some() {
            return;
        }
        let (line, column) = self.line_col(self.anchor_span(&diagnostic.pointer).start);
        diagnostic.line = Some(line);
        diagnostic.column = Some(column);
    }

    /// [`locate`](Self::locate) every diagnostic.
    pub fn locate_all(&self, diagnostics: &mut [Diagnostic]) {
        for diagnostic in diagnostics {
            self.locate(diagnostic);
        }
    }
}
