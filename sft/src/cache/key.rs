//! The key of a prepared-stream cache: a [`Fingerprint`] of everything that decides the rows:
//! the tokenizer (its `tokenizer.json`, special tokens and chat template), the preparation
//! settings, how the dataset is read, and every data file's name, size, modification time and
//! CRC-32 of its bytes (so an edit that keeps size and time still changes the key).

use std::io::Read;
use std::path::Path;

use crate::dataset::{DatasetOptions, dataset_files};
use crate::error::SftError;
use crate::hash::Fingerprint;
use crate::prepare::PrepareSettings;
use crate::tokenizer::HfTokenizer;

/// The fingerprint of a dataset `data` prepared with `tokenizer` and `settings`.
pub fn cache_key(
    data: &Path,
    options: &DatasetOptions,
    tokenizer: &HfTokenizer,
    settings: &PrepareSettings,
) -> Result<Fingerprint, SftError> {
    let mut key = Fingerprint::new();
    key.add(b"dsplan-sft prepared stream v1");
    key.combine(tokenizer.fingerprint());
    key.add(settings.key().as_bytes());
    key.add(format!("{options:?}").as_bytes());
    for (file, _) in dataset_files(data)? {
        let shown = file.display().to_string();
        let meta =
            std::fs::metadata(&file).map_err(|e| SftError::in_file(&shown, e.to_string()))?;
        key.add(
            file.file_name()
                .map(|n| n.as_encoded_bytes())
                .unwrap_or_default(),
        );
        key.add(&meta.len().to_le_bytes());
        let modified = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        key.add(&modified.to_le_bytes());
        key.add(&file_crc(&file, &shown)?.to_le_bytes());
    }
    Ok(key)
}

fn file_crc(path: &Path, shown: &str) -> Result<u32, SftError> {
    let mut file =
        std::fs::File::open(path).map_err(|e| SftError::in_file(shown, e.to_string()))?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file
            .read(&mut buffer)
            .map_err(|e| SftError::in_file(shown, e.to_string()))?;
        if read == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buffer[..read]);
    }
}
