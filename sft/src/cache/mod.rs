//! The prepared token stream kept on disk so that a second run starts at once: one file per
//! key ([`key::cache_key`]), in `.dsplan-cache/` next to the data (or in a given directory),
//! written atomically (a temporary file in the same directory, then a rename), read back only
//! when its checksum holds. A cache is derived data: a damaged file is never used, but
//! prepared again and replaced, and the damage is reported ([`CacheUse::Replaced`]). So the
//! write is not synced to the disk (syncing cost a tenth of a 100 MB preparation): a file
//! cut short by a crash fails its checksum and is rebuilt.

pub mod format;
pub mod key;

use std::path::{Path, PathBuf};

pub use key::cache_key;

use crate::error::SftError;
use crate::hash::Fingerprint;
use crate::prepare::{HeldOut, PreparedSet};

/// Where caches go.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CacheDir {
    /// `.dsplan-cache/` in the data's directory (a directory of shards: inside it).
    #[default]
    NextToData,
    /// This directory.
    At(PathBuf),
    /// No cache.
    Off,
}

/// The cache file of dataset `data` under `key`, or `None` when caching is off.
pub fn cache_path(data: &Path, dir: &CacheDir, key: Fingerprint) -> Option<PathBuf> {
    let stem = data
        .file_name()
        .map_or_else(|| "data".into(), |n| n.to_string_lossy().into_owned());
    let folder = match dir {
        CacheDir::Off => return None,
        CacheDir::At(folder) => folder.clone(),
        CacheDir::NextToData if data.is_dir() => data.join(".dsplan-cache"),
        CacheDir::NextToData => data.parent().map_or_else(
            || PathBuf::from(".dsplan-cache"),
            |p| p.join(".dsplan-cache"),
        ),
    };
    Some(folder.join(format!("{stem}.{}.sftcache", key.hex())))
}

/// What a cache file held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No file.
    Missing,
    /// The prepared set.
    Set(PreparedSet),
    /// A file that is not a valid cache of this key: why.
    Damaged(SftError),
}

/// The prepared set cached at `path` under `key`; an error only when the file cannot be read.
pub fn load(path: &Path, key: Fingerprint) -> Result<Loaded, SftError> {
    let shown = path.display().to_string();
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Loaded::Missing),
        Err(e) => return Err(SftError::in_file(shown, e.to_string())),
    };
    Ok(match format::decode(&bytes) {
        Err(why) => Loaded::Damaged(SftError::in_file(&shown, why)),
        Ok((stored, _)) if stored != key.value() => Loaded::Damaged(SftError::in_file(
            &shown,
            format!("holds the rows of key {stored:016x}, not of {}", key.hex()),
        )),
        Ok((_, set)) => Loaded::Set(set),
    })
}

/// Writes `set` to `path` under `key`, atomically.
pub fn save(path: &Path, key: Fingerprint, set: &PreparedSet) -> Result<(), SftError> {
    let shown = path.display().to_string();
    let fail =
        |e: std::io::Error| SftError::in_file(&shown, format!("cannot write the token cache: {e}"));
    let folder = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder).map_err(fail)?;
    let temporary = folder.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id()
    ));
    // Not synced (see the module docs).
    let written = std::fs::File::create(&temporary).and_then(|file| write_file(&file, key, set));
    if let Err(e) = written.and_then(|()| std::fs::rename(&temporary, path)) {
        let _ = std::fs::remove_file(&temporary);
        return Err(fail(e));
    }
    Ok(())
}

/// Writes the cache file of `set` under `key` into `file`: on Unix each block at its offset
/// from the thread that encoded it ([`format::write_with`]).
fn write_file(file: &std::fs::File, key: Fingerprint, set: &PreparedSet) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        format::write_with(key.value(), set, |offset, part| {
            file.write_all_at(part, offset)
        })
    }
    #[cfg(not(unix))]
    {
        use std::io::Write;
        let mut file = file;
        file.write_all(&format::encode(key.value(), set))
    }
}

/// Whether a prepared set came from the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheUse {
    /// Read from the cache file.
    Hit,
    /// Prepared from the data and written to the cache.
    Written,
    /// Prepared from the data and written over a damaged cache file: what was wrong with it.
    Replaced(SftError),
    /// Prepared from the data; caching is off.
    Off,
}

/// The dataset `data` prepared with `tokenizer` and `settings`: from its cache when there is a
/// current one, else prepared (in parallel) and cached.
pub fn open_prepared(
    data: &Path,
    options: &crate::dataset::DatasetOptions,
    tokenizer: &crate::tokenizer::HfTokenizer,
    settings: &crate::prepare::PrepareSettings,
    dir: &CacheDir,
) -> Result<(PreparedSet, CacheUse), SftError> {
    let prepare = || {
        let reader = crate::dataset::DatasetReader::open(data, options.clone())?;
        crate::prepare::prepare_dataset(reader, tokenizer, settings, options.on_bad_row)
    };
    if *dir == CacheDir::Off {
        return Ok((prepare()?, CacheUse::Off));
    }
    let key = cache_key(data, options, tokenizer, settings)?;
    let Some(path) = cache_path(data, dir, key) else {
        return Ok((prepare()?, CacheUse::Off));
    };
    let how = match load(&path, key)? {
        Loaded::Set(set) => return Ok((set, CacheUse::Hit)),
        Loaded::Missing => CacheUse::Written,
        Loaded::Damaged(why) => CacheUse::Replaced(why),
    };
    let set = prepare()?;
    save(&path, key, &set)?;
    Ok((set, how))
}

/// The dataset `data` prepared and split as `held_out` says ([`crate::prepare::prepare_split`]):
/// the train set and the eval set, each cached under the data's key and its side of the split.
pub fn open_split(
    data: &Path,
    options: &crate::dataset::DatasetOptions,
    tokenizer: &crate::tokenizer::HfTokenizer,
    settings: &crate::prepare::PrepareSettings,
    dir: &CacheDir,
    held_out: HeldOut,
) -> Result<((PreparedSet, PreparedSet), CacheUse), SftError> {
    let prepare = || {
        let reader = crate::dataset::DatasetReader::open(data, options.clone())?;
        crate::prepare::prepare_split(reader, tokenizer, settings, options.on_bad_row, held_out)
    };
    if *dir == CacheDir::Off {
        return Ok((prepare()?, CacheUse::Off));
    }
    let whole = cache_key(data, options, tokenizer, settings)?;
    let side = |name: &str| {
        let mut key = whole;
        key.add(format!("held out {} {name}", held_out.fraction()).as_bytes());
        key
    };
    let (train_key, eval_key) = (side("train"), side("eval"));
    let (Some(train_path), Some(eval_path)) = (
        cache_path(data, dir, train_key),
        cache_path(data, dir, eval_key),
    ) else {
        return Ok((prepare()?, CacheUse::Off));
    };
    let how = match (load(&train_path, train_key)?, load(&eval_path, eval_key)?) {
        (Loaded::Set(train), Loaded::Set(eval)) => return Ok(((train, eval), CacheUse::Hit)),
        (Loaded::Damaged(why), _) | (_, Loaded::Damaged(why)) => CacheUse::Replaced(why),
        _ => CacheUse::Written,
    };
    let (train, eval) = prepare()?;
    save(&train_path, train_key, &train)?;
    save(&eval_path, eval_key, &eval)?;
    Ok(((train, eval), how))
}
