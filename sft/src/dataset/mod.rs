//! Datasets in TRL's three shapes, read from `.jsonl` / `.json` / `.parquet` files or a
//! directory of shards ([`files`]), a chunk of records at a time ([`records`]), each record
//! checked into an [`Example`] ([`example`]). [`DatasetReader`] streams the examples of all
//! the files in order: a file larger than memory is never held whole (except a `.json` array).
//! A bad record is an error naming its file and line, or a counted skip, per [`OnBadRow`].

pub mod example;
pub mod files;
pub mod records;

use std::path::{Path, PathBuf};

use rayon::prelude::*;

pub use example::{Example, Shape, ShapeChoice};
pub use files::{FileKind, dataset_files};
pub use records::{Chunk, RawRecord, Records};

use crate::error::{Location, Record, SftError};

/// What to do with a record that is not a valid example (malformed JSON, a missing field, a
/// field of the wrong type, an unknown role): `--on-bad-row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnBadRow {
    /// Stop with an error naming the file and line (the default: nothing is lost silently).
    #[default]
    Stop,
    /// Leave the record out and count it in [`BadRows`].
    Skip,
}

/// The records left out under [`OnBadRow::Skip`]: how many, and the first few with why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BadRows {
    /// How many records were skipped.
    pub count: u64,
    /// The first [`BadRows::KEPT`] of them.
    pub first: Vec<SftError>,
}

impl BadRows {
    /// How many skipped records are kept with their reason.
    pub const KEPT: usize = 10;

    /// Counts `error`, keeping it when fewer than [`BadRows::KEPT`] are kept.
    pub fn note(&mut self, error: SftError) {
        self.count += 1;
        if self.first.len() < Self::KEPT {
            self.first.push(error);
        }
    }
}

/// One example with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Sourced {
    /// Its file and line (or element, or row).
    pub location: Location,
    /// Its index among the dataset's records (all files, blank lines not counted), from 0:
    /// TRL's row index when no record is skipped.
    pub row: u64,
    /// The example.
    pub example: Example,
}

/// How to read a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetOptions {
    /// The shape, detected from the first record or forced (`--dataset-format`).
    pub shape: ShapeChoice,
    /// The field of language-modelling rows (`dataset_text_field`, default `"text"`).
    pub text_field: String,
    /// What to do with bad records.
    pub on_bad_row: OnBadRow,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        Self {
            shape: ShapeChoice::Detect,
            text_field: "text".to_string(),
            on_bad_row: OnBadRow::Stop,
        }
    }
}

/// The examples of a dataset, streamed a chunk at a time.
pub struct DatasetReader {
    shown: String,
    files: std::vec::IntoIter<(PathBuf, FileKind)>,
    current: Option<Records>,
    options: DatasetOptions,
    shape: Option<Shape>,
    rows: u64,
    examples: u64,
    bad: BadRows,
}

impl DatasetReader {
    /// Records parsed and checked per chunk (in parallel within a chunk).
    pub const CHUNK: usize = 4096;

    /// Opens the dataset `path` names (a file or a directory of shards).
    pub fn open(path: &Path, options: DatasetOptions) -> Result<Self, SftError> {
        let files = dataset_files(path)?;
        let shape = match options.shape {
            ShapeChoice::Forced(shape) => Some(shape),
            ShapeChoice::Detect => None,
        };
        Ok(Self {
            shown: path.display().to_string(),
            files: files.into_iter(),
            current: None,
            options,
            shape,
            rows: 0,
            examples: 0,
            bad: BadRows::default(),
        })
    }

    /// The dataset as the user named it.
    pub fn path(&self) -> &str {
        &self.shown
    }

    /// The shape, once known (forced, or detected from the first valid record).
    pub fn shape(&self) -> Option<Shape> {
        self.shape
    }

    /// The records skipped so far.
    pub fn bad_rows(&self) -> &BadRows {
        &self.bad
    }

    /// The next examples (`None` after the last one; an error at the first bad record under
    /// [`OnBadRow::Stop`], or when the dataset turns out to hold no example at all).
    pub fn next_chunk(&mut self) -> Result<Option<Vec<Sourced>>, SftError> {
        loop {
            if self.current.is_none() {
                match self.files.next() {
                    Some((path, kind)) => self.current = Some(Records::open(&path, kind)?),
                    None => return self.finish().map(|()| None),
                }
            }
            let Some(records) = self.current.as_mut() else {
                continue;
            };
            let Some(chunk) = records.next_chunk(Self::CHUNK)? else {
                self.current = None;
                continue;
            };
            let examples = match (chunk, self.shape) {
                // Text rows of a known shape: the text field is taken without building the
                // object (a line it does not take is parsed whole, as below).
                (Chunk::Lines(lines), Some(Shape::Text)) => {
                    let name = &std::sync::Arc::clone(records.name());
                    let field = &self.options.text_field;
                    let checked = (0..lines.len())
                        .into_par_iter()
                        .map(|at| lines.get(at))
                        .map(|line| match records::text_field(line.1, field) {
                            Some(text) => (
                                Location::record(name, Record::Line(line.0)),
                                Ok(Example::Text(text)),
                            ),
                            None => {
                                let (location, value) = records::parse_line(name, line);
                                let example = value.and_then(|v| Shape::Text.example(v, field));
                                (location, example)
                            }
                        })
                        .collect();
                    self.keep(checked)?
                }
                (Chunk::Lines(lines), _) => {
                    let name = &std::sync::Arc::clone(records.name());
                    let raw = (0..lines.len())
                        .into_par_iter()
                        .map(|at| records::parse_line(name, lines.get(at)))
                        .collect();
                    self.check(raw)?
                }
                (Chunk::Values(values), _) => self.check(values)?,
            };
            if !examples.is_empty() {
                return Ok(Some(examples));
            }
        }
    }

    /// Reads every remaining example.
    pub fn read_all(&mut self) -> Result<Vec<Sourced>, SftError> {
        let mut all = Vec::new();
        while let Some(chunk) = self.next_chunk()? {
            all.extend(chunk);
        }
        Ok(all)
    }

    fn check(&mut self, raw: Vec<RawRecord>) -> Result<Vec<Sourced>, SftError> {
        if self.shape.is_none() {
            self.shape = raw.iter().find_map(|(_, value)| {
                let object = value.as_ref().ok()?.as_object()?;
                Shape::detect(object, &self.options.text_field)
            });
        }
        let Some(shape) = self.shape else {
            // No record of this chunk shows a shape: each is bad (or the chunk is all bad).
            for (location, value) in raw {
                self.rows += 1;
                let reason = match value {
                    Err(reason) => reason,
                    Ok(_) => example::undetected(&self.options.text_field),
                };
                self.bad_record(SftError::new(location, reason))?;
            }
            return Ok(Vec::new());
        };
        let text_field = &self.options.text_field;
        let checked: Vec<(Location, Result<Example, String>)> = raw
            .into_par_iter()
            .map(|(location, value)| {
                let example = value.and_then(|v| shape.example(v, text_field));
                (location, example)
            })
            .collect();
        self.keep(checked)
    }

    /// The valid examples of a chunk of checked records, numbered; each bad one is an error or
    /// a counted skip.
    fn keep(
        &mut self,
        checked: Vec<(Location, Result<Example, String>)>,
    ) -> Result<Vec<Sourced>, SftError> {
        let first_row = self.rows;
        self.rows += checked.len() as u64;
        let mut examples = Vec::with_capacity(checked.len());
        for (offset, (location, example)) in checked.into_iter().enumerate() {
            match example {
                Ok(example) => examples.push(Sourced {
                    location,
                    row: first_row + offset as u64,
                    example,
                }),
                Err(reason) => self.bad_record(SftError::new(location, reason))?,
            }
        }
        self.examples += examples.len() as u64;
        Ok(examples)
    }

    fn bad_record(&mut self, error: SftError) -> Result<(), SftError> {
        match self.options.on_bad_row {
            OnBadRow::Stop => Err(error.with_help(
                "fix the record, or pass --on-bad-row skip to leave bad records out with a count",
            )),
            OnBadRow::Skip => {
                self.bad.note(error);
                Ok(())
            }
        }
    }

    fn finish(&self) -> Result<(), SftError> {
        if self.examples > 0 {
            return Ok(());
        }
        let message = if self.bad.count > 0 {
            format!(
                "holds no valid example: all {} records were bad (the first: {})",
                self.bad.count,
                self.bad
                    .first
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )
        } else {
            "holds no example: the dataset is empty".to_string()
        };
        Err(SftError::in_file(&self.shown, message))
    }
}
