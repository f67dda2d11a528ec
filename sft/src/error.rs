//! [`SftError`]: why a tokenizer, a template or a dataset could not be used, with the file (and
//! the line or row) it concerns and what to do about it.

use std::fmt;
use std::sync::Arc;

/// Where in the user's files a problem is: a file, and within it a line (JSONL), an array index
/// (JSON) or a row (Parquet), counted from 1 like an editor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file as the user named it (shared: every record of a file names it).
    pub file: Arc<str>,
    /// The line, element or row (from 1), when the problem is in one record.
    pub record: Option<Record>,
}

/// One record of a dataset file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// Line `n` of a JSONL file.
    Line(u64),
    /// Element `n` of a JSON array file.
    Element(u64),
    /// Row `n` of a Parquet file.
    Row(u64),
}

impl Location {
    /// The file `file` as a whole.
    pub fn file(file: impl AsRef<str>) -> Self {
        Self {
            file: Arc::from(file.as_ref()),
            record: None,
        }
    }

    /// Record `record` of `file`.
    pub fn record(file: &Arc<str>, record: Record) -> Self {
        Self {
            file: Arc::clone(file),
            record: Some(record),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.record {
            None => write!(f, "{}", self.file),
            Some(Record::Line(n)) => write!(f, "{}:{n}", self.file),
            Some(Record::Element(n)) => write!(f, "{} element {n}", self.file),
            Some(Record::Row(n)) => write!(f, "{} row {n}", self.file),
        }
    }
}

/// Why fine-tuning data could not be read, tokenized or prepared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftError {
    /// Where.
    pub location: Location,
    /// What is wrong.
    pub message: String,
    /// What to do about it, when there is something to say.
    pub help: Option<String>,
}

impl SftError {
    /// A problem at `location`.
    pub fn new(location: Location, message: impl Into<String>) -> Self {
        Self {
            location,
            message: message.into(),
            help: None,
        }
    }

    /// A problem with the whole of `file`.
    pub fn in_file(file: impl AsRef<str>, message: impl Into<String>) -> Self {
        Self::new(Location::file(file), message)
    }

    /// The same, with advice.
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
}

impl fmt::Display for SftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

impl std::error::Error for SftError {}
