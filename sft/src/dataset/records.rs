//! The records of a dataset file, read a chunk at a time: [`Records`] yields each record's
//! location and either its JSON value or why it is not one. JSON Lines and Parquet are
//! streamed (a file larger than memory is read piece by piece); a `.json` array is parsed
//! whole.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use parquet::file::reader::SerializedFileReader;
use parquet::record::reader::RowIter;
use serde_json::Value;

use super::FileKind;
use crate::error::{Location, Record, SftError};

/// One record: where it is, and its value or the reason it could not be read.
pub type RawRecord = (Location, Result<Value, String>);

/// Records of one file.
pub struct Records {
    name: Arc<str>,
    source: Source,
    count: u64,
    /// The bytes of the last chunk of lines: the next one's buffer starts that large, so it is
    /// not grown (and copied) many times over.
    chunk_bytes: usize,
}

enum Source {
    /// Lines not yet parsed (they are parsed in parallel by the caller, see [`Records::next_chunk`]).
    Lines(BufReader<File>),
    Array(std::vec::IntoIter<Value>),
    Parquet(Box<RowIter<'static>>),
}

/// A chunk of records read from a file: JSON text still to parse, or values.
pub enum Chunk {
    /// Lines of a JSON Lines file.
    Lines(Lines),
    /// Records already parsed.
    Values(Vec<RawRecord>),
}

/// Lines of a JSON Lines file in one buffer (one allocation for a chunk, not one per line),
/// each with its line number; blank lines are left out.
#[derive(Debug, Default)]
pub struct Lines {
    text: String,
    lines: Vec<(u64, Range<usize>)>,
}

impl Lines {
    /// Appends line `number`, whose bytes are `bytes` (not UTF-8: kept lossily, as a line that
    /// cannot parse, reported or skipped with the others).
    fn push(&mut self, number: u64, bytes: &[u8]) {
        let start = self.text.len();
        match std::str::from_utf8(bytes) {
            Ok(text) => self.text.push_str(text),
            Err(_) => self.text.push_str(&String::from_utf8_lossy(bytes)),
        }
        if self.text[start..].trim().is_empty() {
            self.text.truncate(start);
        } else {
            self.lines.push((number, start..self.text.len()));
        }
    }

    /// The number of lines.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether it holds no line.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Line `at` of the chunk: its number in the file and its text.
    pub fn get(&self, at: usize) -> (u64, &str) {
        let (number, range) = &self.lines[at];
        (*number, &self.text[range.clone()])
    }
}

impl Records {
    /// Opens `path` as a file of `kind`.
    pub fn open(path: &Path, kind: FileKind) -> Result<Self, SftError> {
        let name: Arc<str> = Arc::from(path.display().to_string());
        let file = File::open(path).map_err(|e| SftError::in_file(&name, e.to_string()))?;
        let source = match kind {
            FileKind::JsonLines => Source::Lines(BufReader::with_capacity(1 << 20, file)),
            FileKind::Json => {
                let mut reader = BufReader::new(file);
                let starts_array = first_byte(&mut reader, &name)? == Some(b'[');
                if starts_array {
                    let mut text = String::new();
                    reader
                        .read_to_string(&mut text)
                        .map_err(|e| SftError::in_file(&name, e.to_string()))?;
                    match serde_json::from_str::<Value>(&text) {
                        Ok(Value::Array(items)) => Source::Array(items.into_iter()),
                        Ok(_) => {
                            return Err(SftError::in_file(
                                &name,
                                "starts with `[` but is not a JSON array",
                            ));
                        }
                        Err(e) => {
                            return Err(SftError::in_file(
                                &name,
                                format!(
                                    "is not a JSON array: {e} (line {}, column {})",
                                    e.line(),
                                    e.column()
                                ),
                            ));
                        }
                    }
                } else {
                    Source::Lines(reader)
                }
            }
            FileKind::Parquet => {
                let reader = SerializedFileReader::new(file).map_err(|e| {
                    SftError::in_file(&name, format!("is not a readable Parquet file: {e}"))
                })?;
                Source::Parquet(Box::new(reader.into_iter()))
            }
        };
        Ok(Self {
            name,
            source,
            count: 0,
            chunk_bytes: 0,
        })
    }

    /// The file's name as shown in messages.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Up to `limit` further records (`None` at the end of the file).
    pub fn next_chunk(&mut self, limit: usize) -> Result<Option<Chunk>, SftError> {
        match &mut self.source {
            Source::Lines(reader) => {
                let mut lines = Lines {
                    text: String::with_capacity(self.chunk_bytes + self.chunk_bytes / 8),
                    lines: Vec::with_capacity(limit),
                };
                let mut buffer = Vec::new();
                while lines.len() < limit {
                    buffer.clear();
                    let read = reader
                        .read_until(b'\n', &mut buffer)
                        .map_err(|e| SftError::in_file(&self.name, e.to_string()))?;
                    if read == 0 {
                        break;
                    }
                    self.count += 1;
                    lines.push(self.count, &buffer);
                }
                self.chunk_bytes = lines.text.len();
                Ok((!lines.is_empty() || read_more(reader)).then_some(Chunk::Lines(lines)))
            }
            Source::Array(items) => {
                let mut values = Vec::new();
                for value in items.by_ref().take(limit) {
                    self.count += 1;
                    values.push((
                        Location::record(&self.name, Record::Element(self.count)),
                        Ok(value),
                    ));
                }
                Ok((!values.is_empty()).then_some(Chunk::Values(values)))
            }
            Source::Parquet(rows) => {
                let mut values = Vec::new();
                for row in rows.by_ref().take(limit) {
                    self.count += 1;
                    let location = Location::record(&self.name, Record::Row(self.count));
                    match row {
                        Ok(row) => values.push((location, Ok(row.to_json_value()))),
                        // A page that cannot be decoded ends the file: nothing after it is readable.
                        Err(e) => {
                            return Err(SftError::new(location, format!("cannot be decoded: {e}")));
                        }
                    }
                }
                Ok((!values.is_empty()).then_some(Chunk::Values(values)))
            }
        }
    }
}

/// Whether a reader has bytes left (a chunk of only blank lines is not the end).
fn read_more(reader: &mut BufReader<File>) -> bool {
    reader.fill_buf().is_ok_and(|b| !b.is_empty())
}

/// The first non-whitespace byte of a reader, left unread.
fn first_byte(reader: &mut BufReader<File>, name: &str) -> Result<Option<u8>, SftError> {
    loop {
        let buffer = reader
            .fill_buf()
            .map_err(|e| SftError::in_file(name, e.to_string()))?;
        if buffer.is_empty() {
            return Ok(None);
        }
        match buffer.iter().position(|b| !b.is_ascii_whitespace()) {
            Some(at) => return Ok(Some(buffer[at])),
            None => {
                let len = buffer.len();
                reader.consume(len);
            }
        }
    }
}

/// Parses line `line` (its text `text`) of a [`Chunk::Lines`] of file `name` into a record.
pub fn parse_line(name: &Arc<str>, (line, text): (u64, &str)) -> RawRecord {
    let location = Location::record(name, Record::Line(line));
    let value = serde_json::from_str::<Value>(text)
        .map_err(|e| format!("is not valid JSON: {e} (column {})", e.column()));
    (location, value)
}

/// The string field `field` of a JSON object line, parsed without building the object: keys
/// are borrowed, other values are skipped (still checked as JSON). `None` unless the line is
/// one JSON object whose last `field` entry (the one a parsed object keeps) is a string; the
/// caller then parses the line whole, so every message about a bad line stays the same.
pub fn text_field(line: &str, field: &str) -> Option<String> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    use std::borrow::Cow;

    struct Field<'f>(&'f str);

    impl<'de> Visitor<'de> for Field<'_> {
        type Value = Option<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found: Option<Value> = None;
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if key == self.0 {
                    found = Some(map.next_value::<Value>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(match found {
                Some(Value::String(text)) => Some(text),
                _ => None,
            })
        }
    }

    impl<'de> DeserializeSeed<'de> for Field<'_> {
        type Value = Option<String>;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }

    let mut reader = serde_json::Deserializer::from_str(line);
    let text = Field(field).deserialize(&mut reader).ok()??;
    reader.end().ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed parse gives what the whole parse gives, and gives up (`None`) wherever the
    /// whole parse would not yield a string field.
    #[test]
    fn text_field_agrees_with_the_whole_parse() {
        let lines = [
            r#"{"text": "plain"}"#,
            r#"{"id": 3, "text": "with \"escapes\" \u00e9", "x": [1, {"text": 2}]}"#,
            r#"{"te\u0078t": "escaped key"}"#,
            r#"{"text": "first", "text": "last wins"}"#,
            r#"{"text": "first", "text": 5}"#,
            r#"{"text": 5}"#,
            r#"{"other": "no text"}"#,
            r#"["text", "an array"]"#,
            r#"{"text": "trailing"} x"#,
            r#"{"text": "broken"#,
            r#"  {"text": "spaced"}  "#,
        ];
        let mut taken = 0;
        for line in lines {
            let whole = serde_json::from_str::<Value>(line)
                .ok()
                .and_then(|v| v.get("text").and_then(Value::as_str).map(str::to_owned));
            let fast = text_field(line, "text");
            assert_eq!(fast, whole, "{line}");
            taken += usize::from(fast.is_some());
        }
        assert_eq!(taken, 5);
    }
}
