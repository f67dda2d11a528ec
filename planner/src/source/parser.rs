//! The recursive-descent reader: builds the `serde_json::Value` and the span tree side by
//! side, one pass, nesting checked before every descent.

use super::cursor::Cursor;
use super::decode::ByteOrderMark;
use super::error::{ParseError, describe_found, token_at, word_at};
use super::lines::LineIndex;
use super::number::parse_number;
use super::spans::{Children, SpanNode};
use super::strictness::{Leniency, NonStrictTally};
use super::string::parse_string;
use super::{Located, Span};
use crate::capped::{Tally, and_more};
use crate::diagnostics::{Code, Diagnostic, Severity};
use crate::json_pointer;
use serde_json::{Map, Value};
use std::collections::HashMap;

/// The deepest nesting of objects and arrays accepted (the top-level object is level 1).
pub const MAX_DEPTH: usize = 128;

/// A successfully read document.
pub(crate) struct Parsed {
    /// The document (always an object).
    pub value: Value,
    /// Where each of its values is.
    pub spans: SpanNode,
    /// Comments, trailing commas and byte-order mark seen.
    pub non_strict: NonStrictTally,
    /// One error per repeated key, located at the repetition.
    pub duplicates: Vec<Diagnostic>,
}

/// One step of the path from the root to the value being read.
#[derive(Debug, Clone, Copy)]
enum PathStep {
    /// An object member, by the span of its key literal (decoded only when a message needs it).
    Key(Span),
    /// An array item.
    Index(usize),
}

/// Which bracket closes a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Container {
    /// `{ ... }`.
    Object,
    /// `[ ... ]`.
    Array,
}

impl Container {
    fn close(self) -> char {
        match self {
            Container::Object => '}',
            Container::Array => ']',
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Container::Object => "object",
            Container::Array => "array",
        }
    }
}

/// Read a whole document: it must be one object, with nothing but trivia after it.
pub(crate) fn parse_document(
    text: &str,
    lines: &LineIndex,
    byte_order_mark: ByteOrderMark,
) -> Result<Parsed, ParseError> {
    let mut parser = Parser {
        cursor: Cursor::new(text, NonStrictTally::new(byte_order_mark)),
        lines,
        path: Vec::new(),
        duplicates: Vec::new(),
        tally: Tally::default(),
    };
    let (value, spans) = parser
        .parse_root()
        .map_err(|error| error.within(|| parser.pointer()))?;
    let mut duplicates = parser.duplicates;
    let omitted = parser.tally.omitted(Code::DuplicateKey, Severity::Error);
    if let Some(last) = duplicates.last().filter(|_| omitted > 0) {
        let summary = and_more(last, omitted);
        duplicates.push(summary);
    }
    Ok(Parsed {
        value,
        spans,
        non_strict: parser.cursor.non_strict,
        duplicates,
    })
}

/// The reader's state: where it is, the path it took to get there, what it found on the way.
struct Parser<'t> {
    cursor: Cursor<'t>,
    lines: &'t LineIndex,
    /// The path to the value being read; left as it was when an error returns early, so the
    /// error can name its pointer.
    path: Vec<PathStep>,
    duplicates: Vec<Diagnostic>,
    /// Duplicates past the cap are only counted ([`crate::capped`]).
    tally: Tally,
}

impl Parser<'_> {
    fn text(&self) -> &str {
        self.cursor.text()
    }

    fn parse_root(&mut self) -> Result<(Value, SpanNode), ParseError> {
        self.cursor.skip_trivia()?;
        match self.cursor.peek() {
            None => return Err(self.empty_file()),
            Some(b'{') => {}
            Some(_) => return Err(self.root_not_object()),
        }
        let (value, spans) = self.parse_value(0)?;
        self.cursor.skip_trivia()?;
        if self.cursor.peek().is_some() {
            return Err(self.content_after_root(spans.located.value));
        }
        Ok((value, spans))
    }

    /// Read the value at the cursor; `depth` objects/arrays enclose it.
    fn parse_value(&mut self, depth: usize) -> Result<(Value, SpanNode), ParseError> {
        let start = self.cursor.pos();
        let (value, children) = match self.cursor.peek() {
            Some(b'{') => {
                self.check_depth(depth)?;
                self.parse_object(depth + 1)?
            }
            Some(b'[') => {
                self.check_depth(depth)?;
                self.parse_array(depth + 1)?
            }
            Some(b'"') => (
                Value::String(parse_string(&mut self.cursor)?),
                Children::Scalar,
            ),
            Some(b'-' | b'0'..=b'9') => (
                Value::Number(parse_number(&mut self.cursor)?),
                Children::Scalar,
            ),
            _ => (self.parse_literal()?, Children::Scalar),
        };
        let value_span = Span {
            start,
            end: self.cursor.pos(),
        };
        let located = Located {
            key: None,
            value: value_span,
        };
        Ok((value, SpanNode { located, children }))
    }

    fn check_depth(&self, depth: usize) -> Result<(), ParseError> {
        if depth < MAX_DEPTH {
            return Ok(());
        }
        Err(ParseError::new(
            Code::TooDeep,
            self.cursor.pos(),
            format!("objects and arrays are nested more than {MAX_DEPTH} levels deep here"),
        )
        .with_help("a DeepSpeed config needs only a few levels; look for unbalanced brackets"))
    }

    /// `true`, `false`, `null`, or an error naming what is there instead.
    fn parse_literal(&mut self) -> Result<Value, ParseError> {
        let at = self.cursor.pos();
        let word = word_at(self.text(), at);
        let value = match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            _ => return Err(self.expected_value(at, word)),
        };
        self.cursor.advance(word.len());
        Ok(value)
    }

    fn parse_object(&mut self, depth: usize) -> Result<(Value, Children), ParseError> {
        let open = self.cursor.pos();
        self.cursor.advance(1);
        let mut map = Map::new();
        let mut members: HashMap<String, SpanNode> = HashMap::new();
        // The first key span of each key seen twice (only those, to keep memory small).
        let mut first_of_repeated: HashMap<String, usize> = HashMap::new();
        self.cursor.skip_trivia()?;
        if self.cursor.peek() == Some(b'}') {
            self.cursor.advance(1);
            return Ok((Value::Object(map), Children::Object(members)));
        }
        loop {
            if self.cursor.peek() != Some(b'"') {
                return Err(self.expected_key(open));
            }
            let key_start = self.cursor.pos();
            let key = parse_string(&mut self.cursor)?;
            let key_span = Span {
                start: key_start,
                end: self.cursor.pos(),
            };
            self.path.push(PathStep::Key(key_span));
            self.cursor.skip_trivia()?;
            if self.cursor.peek() != Some(b':') {
                return Err(self.expected_colon(&key));
            }
            self.cursor.advance(1);
            self.cursor.skip_trivia()?;
            let (value, mut node) = self.parse_value(depth)?;
            node.located.key = Some(key_span);
            let value_end = node.located.value.end;
            if let Some(previous) = members.get(&key) {
                let previous_start = previous.located.key.map_or(key_start, |span| span.start);
                let first = *first_of_repeated
                    .entry(key.clone())
                    .or_insert(previous_start);
                if self.tally.admit(Code::DuplicateKey, Severity::Error) {
                    let duplicate = self.duplicate_key(&key, key_start, first);
                    self.duplicates.push(duplicate);
                }
            }
            map.insert(key.clone(), value);
            members.insert(key.clone(), node);
            match self.separator(b'}')? {
                Some(Next::Another) => {}
                Some(Next::End) => break,
                None => {
                    let after = format!("after the value of `{key}`");
                    return Err(self.expected_separator(
                        Container::Object,
                        &after,
                        value_end,
                        open,
                    ));
                }
            }
        }
        Ok((Value::Object(map), Children::Object(members)))
    }

    /// After a member or item: a comma (and another member, or a trailing comma before
    /// `close`, which is recorded as non-strict JSON), or `close` itself. `None`: neither, the
    /// caller reports the missing separator. Either way the member's path step is popped.
    fn separator(&mut self, close: u8) -> Result<Option<Next>, ParseError> {
        self.cursor.skip_trivia()?;
        match self.cursor.peek() {
            Some(b',') => {
                let comma = self.cursor.pos();
                self.cursor.advance(1);
                self.path.pop();
                self.cursor.skip_trivia()?;
                if self.cursor.peek() == Some(close) {
                    self.cursor
                        .non_strict
                        .record(Leniency::TrailingComma, comma);
                    self.cursor.advance(1);
                    return Ok(Some(Next::End));
                }
                Ok(Some(Next::Another))
            }
            Some(byte) if byte == close => {
                self.path.pop();
                self.cursor.advance(1);
                Ok(Some(Next::End))
            }
            _ => Ok(None),
        }
    }

    fn parse_array(&mut self, depth: usize) -> Result<(Value, Children), ParseError> {
        let open = self.cursor.pos();
        self.cursor.advance(1);
        let mut values = Vec::new();
        let mut items = Vec::new();
        self.cursor.skip_trivia()?;
        if self.cursor.peek() == Some(b']') {
            self.cursor.advance(1);
            return Ok((Value::Array(values), Children::Array(items)));
        }
        loop {
            let index = values.len();
            self.path.push(PathStep::Index(index));
            let (value, node) = self.parse_value(depth)?;
            let value_end = node.located.value.end;
            values.push(value);
            items.push(node);
            match self.separator(b']')? {
                Some(Next::Another) => {}
                Some(Next::End) => break,
                None => {
                    let after = format!("after item {index}");
                    return Err(self.expected_separator(Container::Array, &after, value_end, open));
                }
            }
        }
        Ok((Value::Array(values), Children::Array(items)))
    }

    // ----- names and pointers -------------------------------------------------------------

    /// The decoded key whose literal is at `span`.
    fn key_at(&self, span: Span) -> String {
        let literal = span.slice(self.text());
        let mut cursor = Cursor::new(literal, NonStrictTally::default());
        parse_string(&mut cursor).unwrap_or_default()
    }

    /// The JSON pointer of the current path.
    fn pointer(&self) -> String {
        self.path
            .iter()
            .fold(String::new(), |pointer, step| match step {
                PathStep::Key(span) => json_pointer::child(&pointer, &self.key_at(*span)),
                PathStep::Index(index) => json_pointer::index(&pointer, *index),
            })
    }

    /// How a message names the value at the end of `steps`: `zero_optimization`, `betas[1]`;
    /// `None` for the document itself.
    fn label(&self, steps: &[PathStep]) -> Option<String> {
        let (last, parents) = steps.split_last()?;
        Some(match last {
            PathStep::Key(span) => self.key_at(*span),
            PathStep::Index(index) => {
                format!("{}[{index}]", self.label(parents).unwrap_or_default())
            }
        })
    }

    /// ` in `zero_optimization`` or ` at the top level` for the container being read, given
    /// that the last path step is the member inside it.
    fn where_member(&self) -> String {
        let parents = &self.path[..self.path.len().saturating_sub(1)];
        match self.label(parents) {
            Some(label) => format!("in `{label}`"),
            None => "at the top level".to_owned(),
        }
    }

    fn line_of(&self, offset: usize) -> usize {
        self.lines.line_of(offset)
    }

    // ----- diagnostics --------------------------------------------------------------------

    fn duplicate_key(&self, key: &str, at: usize, first: usize) -> Diagnostic {
        let (line, column) = self.lines.line_col(self.text(), at);
        Diagnostic::error(
            Code::DuplicateKey,
            self.pointer(),
            format!(
                "duplicate key `{key}` {}: first defined on line {}",
                self.where_member(),
                self.line_of(first)
            ),
        )
        .with_help(
            "DeepSpeed rejects a file with duplicate keys; other readers silently keep the \
             last value (dsplan does too): keep only one",
        )
        .at(line, column)
    }

    fn empty_file(&self) -> ParseError {
        let what = if self.text().is_empty() {
            "the file is empty"
        } else if self.cursor.non_strict.has_comments() {
            "the file holds only comments"
        } else {
            "the file holds only whitespace"
        };
        ParseError::new(Code::EmptyFile, 0, what)
            .with_help("a DeepSpeed config is a JSON object, such as `{\"train_batch_size\": 8}`")
    }

    fn root_not_object(&self) -> ParseError {
        let at = self.cursor.pos();
        let text = self.text();
        let token = token_at(text, at);
        let kind = match token.as_bytes().first() {
            Some(b'[') => Some("an array"),
            Some(b'"') => Some("a string"),
            Some(b'-' | b'0'..=b'9') => Some("a number"),
            _ => match token {
                "true" | "false" => Some("a boolean"),
                "null" => Some("`null`"),
                _ => None,
            },
        };
        let Some(kind) = kind else {
            return ParseError::syntax(
                at,
                format!(
                    "expected `{{` at the start of the config, found {}",
                    describe_found(text, at)
                ),
            )
            .with_help(
                "a DeepSpeed config is a JSON object: it starts with `{` and ends with `}`",
            );
        };
        let braceless =
            token.starts_with('"') && text[at + token.len()..].trim_start().starts_with(':');
        let help = if braceless {
            "wrap the keys and values in `{` and `}`"
        } else {
            "a DeepSpeed config is a JSON object, such as `{\"train_batch_size\": 8}`"
        };
        ParseError::new(
            Code::RootNotObject,
            at,
            format!("a DeepSpeed config must be a JSON object, but this file holds {kind}"),
        )
        .with_help(help)
    }

    fn content_after_root(&self, root: Span) -> ParseError {
        let at = self.cursor.pos();
        let closed = self.line_of(root.end.saturating_sub(1));
        let help = if self.cursor.peek() == Some(b'}') {
            format!(
                "the top-level object already ended on line {closed}: remove this `}}` or \
                 look for an extra one earlier"
            )
        } else {
            format!(
                "the top-level object already ended on line {closed}: move this inside it, \
                 or look for an extra `}}` earlier"
            )
        };
        ParseError::syntax(
            at,
            format!(
                "expected the end of the file after the top-level object, found {}",
                describe_found(self.text(), at)
            ),
        )
        .with_help(help)
    }

    fn expected_key(&self, open: usize) -> ParseError {
        let at = self.cursor.pos();
        let text = self.text();
        let found = describe_found(text, at);
        let word = word_at(text, at);
        let (message, help) = match self.cursor.peek() {
            None => (
                format!("expected a key or `}}`, found {found}"),
                format!(
                    "the object opened on line {} is never closed: add `}}`",
                    self.line_of(open)
                ),
            ),
            Some(b'\'') => (
                format!("expected a key in double quotes, found {found}"),
                "JSON strings use double quotes `\"`, not single quotes".to_owned(),
            ),
            Some(b',') => (
                format!("expected a key, found {found}"),
                "remove the extra comma".to_owned(),
            ),
            Some(_) if typographic_quote_help(text, at).is_some() => (
                format!("expected a key in double quotes, found {found}"),
                typographic_quote_help(text, at).unwrap_or_default(),
            ),
            Some(_) if !word.is_empty() => (
                format!("expected a key in double quotes, found {found}"),
                format!(
                    "put the key in double quotes: `\"{word}\"` (DeepSpeed's hjson loader \
                     accepts a bare key, strict JSON readers do not)"
                ),
            ),
            Some(_) => (
                format!("expected a key in double quotes or `}}`, found {found}"),
                "each member of an object is `\"key\": value`".to_owned(),
            ),
        };
        ParseError::syntax(at, message).with_help(help)
    }

    fn expected_colon(&self, key: &str) -> ParseError {
        let at = self.cursor.pos();
        let found = describe_found(self.text(), at);
        let help = match self.cursor.peek() {
            Some(b'=') => "use `:` instead of `=`",
            _ => "separate a key from its value with `:`",
        };
        ParseError::syntax(
            at,
            format!("expected `:` after the key `{key}`, found {found}"),
        )
        .with_help(help)
    }

    /// After a member or item, neither `,` nor the closing bracket follows. A missing comma
    /// (the next member or item starts right away) is reported where the comma belongs.
    fn expected_separator(
        &self,
        container: Container,
        after: &str,
        value_end: usize,
        open: usize,
    ) -> ParseError {
        let at = self.cursor.pos();
        let close = container.close();
        let found = describe_found(self.text(), at);
        let within = match self.label(&self.path[..self.path.len().saturating_sub(1)]) {
            Some(label) if container == Container::Array => format!(" of `{label}`"),
            _ => String::new(),
        };
        let message = format!("expected `,` or `{close}` {after}{within}, found {found}");
        let opened = self.line_of(open);
        let next_starts_member = match container {
            Container::Object => self.cursor.peek() == Some(b'"'),
            Container::Array => matches!(
                self.cursor.peek(),
                Some(b'"' | b'{' | b'[' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
            ),
        };
        if next_starts_member {
            return ParseError::syntax(value_end, message).with_help("add a comma here");
        }
        let help = match self.cursor.peek() {
            None => format!(
                "the {} opened on line {opened} is never closed: add `{close}`",
                container.noun()
            ),
            Some(b'}' | b']') => format!(
                "the {} opened on line {opened} must be closed with `{close}`",
                container.noun()
            ),
            Some(_) => format!(
                "separate items with `,` and close the {} with `{close}`",
                container.noun()
            ),
        };
        ParseError::syntax(at, message).with_help(help)
    }

    fn expected_value(&self, at: usize, word: &str) -> ParseError {
        let text = self.text();
        let found = describe_found(text, at);
        let message = match self.path.last() {
            Some(PathStep::Key(span)) => {
                format!(
                    "expected a value for `{}`, found {found}",
                    self.key_at(*span)
                )
            }
            _ => format!("expected a value, found {found}"),
        };
        let help = match word {
            "True" | "TRUE" => Some("JSON booleans are lowercase: `true`".to_owned()),
            "False" | "FALSE" => Some("JSON booleans are lowercase: `false`".to_owned()),
            "None" | "NULL" | "Null" | "nil" => {
                Some("JSON writes an empty value as `null`".to_owned())
            }
            "NaN" | "nan" | "Infinity" | "inf" | "+Infinity" => {
                Some("JSON has no NaN or infinity: write a finite number".to_owned())
            }
            _ if word.starts_with('+') => {
                Some("JSON numbers have no `+` sign: remove it".to_owned())
            }
            _ if word.starts_with('.') => Some(format!("write the leading zero: `0{word}`")),
            "" => match self.cursor.peek() {
                Some(b'\'') => {
                    Some("JSON strings use double quotes `\"`, not single quotes".to_owned())
                }
                Some(b',') => Some("remove the extra comma".to_owned()),
                Some(b'}' | b']') => Some("a value is missing before it".to_owned()),
                None => Some("the file ends in the middle of the config".to_owned()),
                _ => typographic_quote_help(text, at),
            },
            _ => Some(format!("put text in double quotes: `\"{word}\"`")),
        };
        let error = ParseError::syntax(at, message);
        match help {
            Some(help) => error.with_help(help),
            None => error,
        }
    }
}

/// Help for a typographic quote (`“stage”`, often pasted from a web page or a word processor).
fn typographic_quote_help(text: &str, at: usize) -> Option<String> {
    let quote = text.get(at..)?.chars().next()?;
    matches!(
        quote,
        '\u{201C}' | '\u{201D}' | '\u{2018}' | '\u{2019}' | '\u{201E}' | '\u{00AB}'
    )
    .then(|| format!("`{quote}` is a typographic quote: JSON needs a plain `\"`"))
}

/// What follows a member or item once its separator is read.
enum Next {
    /// Another member or item.
    Another,
    /// The container closed.
    End,
}
