//! The files of a dataset: `--data` names one `.jsonl` / `.json` / `.parquet` file or a
//! directory of shards, read in name order (as `datasets` sorts `data_files` globs).

use std::path::{Path, PathBuf};

use crate::error::SftError;

/// The kinds of dataset file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// JSON Lines (`.jsonl`): one object a line.
    JsonLines,
    /// `.json`: a top-level array of objects, or JSON Lines (as `datasets`' json loader reads).
    Json,
    /// Apache Parquet.
    Parquet,
}

impl FileKind {
    /// The kind a path's extension names, if it is a dataset file.
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => Some(FileKind::JsonLines),
            Some("json") => Some(FileKind::Json),
            Some("parquet") => Some(FileKind::Parquet),
            _ => None,
        }
    }

    /// Whether `path` names a dataset file (what `--data` takes for fine-tuning).
    pub fn is_dataset(path: &Path) -> bool {
        Self::of(path).is_some() || path.is_dir()
    }
}

/// The dataset files `path` names: itself, or the dataset files of a directory (not
/// recursive, hidden files and dsplan's caches skipped), sorted by name.
pub fn dataset_files(path: &Path) -> Result<Vec<(PathBuf, FileKind)>, SftError> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| SftError::in_file(&shown, e.to_string()))?;
    if meta.is_file() {
        let kind = FileKind::of(path)
            .ok_or_else(|| SftError::in_file(&shown, "is not a .jsonl, .json or .parquet file"))?;
        return Ok(vec![(path.to_path_buf(), kind)]);
    }
    if !meta.is_dir() {
        return Err(SftError::in_file(
            shown,
            "is neither a regular file nor a directory of dataset shards",
        ));
    }
    let entries = std::fs::read_dir(path).map_err(|e| SftError::in_file(&shown, e.to_string()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| SftError::in_file(&shown, e.to_string()))?;
        let file = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if let Some(kind) = FileKind::of(&file).filter(|_| !hidden && file.is_file()) {
            files.push((file, kind));
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    if files.is_empty() {
        return Err(SftError::in_file(
            shown,
            "holds no .jsonl, .json or .parquet file",
        ));
    }
    let kinds = |k: FileKind| files.iter().any(|(_, kind)| *kind == k);
    if kinds(FileKind::Parquet) && (kinds(FileKind::JsonLines) || kinds(FileKind::Json)) {
        return Err(SftError::in_file(
            shown,
            "mixes Parquet and JSON shards; a dataset's shards are of one format",
        ));
    }
    Ok(files)
}
