//! Writing the files a command produces (`run --save-model`, `--metrics`, `recommend
//! --output`, a checkpoint's `latest`) without ever destroying what the path names.
//!
//! [`OutputTarget::of`] decides, once, how a path is written:
//!
//! * a regular file, or a path with nothing there ([`OutputKind::Replace`]): replaced
//!   atomically, through a temporary file `.NAME.PID.tmp` in the same directory and a rename
//!   ([`write_output`]), or streamed into directly ([`open_stream`]); a symlink to a regular file
//!   replaces the file it points to and keeps the link;
//! * a FIFO or a character device (`/dev/null`, `/dev/stdout`, a terminal), directly or through
//!   a symlink ([`OutputKind::WriteThrough`]): opened and written, never renamed over, so a
//!   FIFO's reader gets the bytes and a device stays a device (`/dev/full` reports its error);
//! * anything else (a directory, a block device, a socket): refused with a message naming it.
//!
//! Temporary files of this kind left by a killed process (its PID no longer running) are swept
//! when the next write to the same path begins.

use std::fs::{File, OpenOptions};
use std::io::{Error, ErrorKind, Write};
use std::path::{Path, PathBuf};

use super::process::process_alive;

/// How a path is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A regular file or nothing: replaced atomically (or truncated and streamed into).
    Replace,
    /// A FIFO or a character device: opened and written, never replaced.
    WriteThrough,
}

/// A path checked for writing, and how to write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTarget {
    /// The path to write (a symlink to a regular file resolved to that file).
    pub path: PathBuf,
    /// How.
    pub kind: OutputKind,
}

impl OutputTarget {
    /// How `path` is to be written; an error (kind `InvalidInput`) saying what it is when it
    /// must not be written at all.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let link = match std::fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Ok(Self {
                    path: path.to_path_buf(),
                    kind: OutputKind::Replace,
                });
            }
            Err(e) => return Err(e),
        };
        let is_link = link.file_type().is_symlink();
        let meta = if is_link {
            match std::fs::metadata(path) {
                Ok(meta) => meta,
                // A dangling link: writing creates what it points to, the link stays.
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    return Ok(Self {
                        path: path.to_path_buf(),
                        kind: OutputKind::WriteThrough,
                    });
                }
                Err(e) => return Err(e),
            }
        } else {
            link
        };
        if meta.is_file() {
            let path = if is_link {
                std::fs::canonicalize(path)?
            } else {
                path.to_path_buf()
            };
            return Ok(Self {
                path,
                kind: OutputKind::Replace,
            });
        }
        if is_stream_device(&meta) {
            return Ok(Self {
                path: path.to_path_buf(),
                kind: OutputKind::WriteThrough,
            });
        }
        Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it is {}, not a file; name a regular file (or a FIFO or character device to \
                 write through)",
                describe(&meta)
            ),
        ))
    }
}

#[cfg(unix)]
fn is_stream_device(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    kind.is_fifo() || kind.is_char_device()
}

#[cfg(not(unix))]
fn is_stream_device(_: &std::fs::Metadata) -> bool {
    false
}

fn describe(meta: &std::fs::Metadata) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        let kind = meta.file_type();
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if meta.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// Writes `bytes` to `path` as [`OutputTarget::of`] decides: a regular file (or nothing) is
/// replaced atomically, holding either its old content or all of the new; a FIFO or character
/// device is written through.
pub fn write_output(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = OutputTarget::of(path)?;
    match target.kind {
        OutputKind::Replace => replace_atomically(&target.path, bytes),
        OutputKind::WriteThrough => {
            let mut file = OpenOptions::new().write(true).open(&target.path)?;
            file.write_all(bytes)?;
            file.flush()
        }
    }
}

/// Replaces the directory entry `path` by a regular file holding `bytes`, through a temporary
/// file and a rename, whatever `path` is now (a regular file, a symlink, a FIFO): for files a
/// program owns, such as a checkpoint's `latest`. Nothing `path` points to is ever opened, so a
/// symlink's target is left untouched; a directory there is an error.
pub fn replace_entry(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_atomically(path, bytes)
}

/// Opens `path` for writing a stream of lines as [`OutputTarget::of`] decides: a regular file
/// (or nothing) is created or truncated and written in place, so that what was written before
/// a crash stays; a FIFO or character device is opened for writing.
pub fn open_stream(path: &Path) -> std::io::Result<File> {
    let target = OutputTarget::of(path)?;
    match target.kind {
        OutputKind::Replace => File::create(&target.path),
        OutputKind::WriteThrough => OpenOptions::new().write(true).open(&target.path),
    }
}

/// The temporary file of this process for `path` (and the prefix and suffix of every
/// process's).
fn temp_parts(path: &Path) -> (PathBuf, String, &'static str) {
    let dir = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    (dir, format!(".{name}."), ".tmp")
}

/// Writes `bytes` to the regular file (or missing path) `path` through a temporary file in the
/// same directory and a rename.
fn replace_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let (dir, prefix, suffix) = temp_parts(path);
    sweep_stale_temps(&dir, &prefix, suffix);
    let temp = dir.join(format!("{prefix}{}{suffix}", std::process::id()));
    let result = (|| {
        // `create_new`: a symlink or anything else at the temporary name is never followed.
        let _ = std::fs::remove_file(&temp);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Removes `dir/{prefix}{PID}{suffix}` files whose PID is no longer running (left by a killed
/// write).
fn sweep_stale_temps(dir: &Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|n| n.strip_suffix(suffix))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !process_alive(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("listed")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_regular_file_is_replaced_whole() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("out.txt");
        write_output(&path, b"first").expect("write");
        write_output(&path, b"second").expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), b"second");
        assert_eq!(entries(dir.path()), ["out.txt"]);
    }

    #[test]
    fn a_symlink_to_a_file_keeps_the_link() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("real.txt");
        std::fs::write(&file, b"old").expect("write");
        let link = dir.path().join("link.txt");
        std::os::unix::fs::symlink(&file, &link).expect("symlink");
        write_output(&link, b"new").expect("write");
        assert!(
            std::fs::symlink_metadata(&link)
                .expect("meta")
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&file).expect("read"), b"new");
    }

    #[test]
    fn replacing_an_entry_replaces_a_symlink_and_leaves_its_target_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("precious.json");
        std::fs::write(&target, b"precious").expect("write");
        let latest = dir.path().join("latest");
        std::os::unix::fs::symlink(&target, &latest).expect("symlink");
        replace_entry(&latest, b"global_step2").expect("replaced");
        assert_eq!(std::fs::read(&target).expect("read"), b"precious");
        let meta = std::fs::symlink_metadata(&latest).expect("meta");
        assert!(meta.file_type().is_file());
        assert_eq!(std::fs::read(&latest).expect("read"), b"global_step2");
    }

    #[test]
    fn a_directory_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let error = write_output(dir.path(), b"x").expect_err("a directory");
        assert_eq!(error.kind(), ErrorKind::InvalidInput);
        assert!(error.to_string().contains("a directory"), "{error}");
    }

    #[test]
    fn stale_temporary_files_of_dead_processes_are_swept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("model.safetensors");
        // PIDs above the kernel's pid_max (2^22) never run.
        let stale = dir.path().join(".model.safetensors.99999999.tmp");
        std::fs::write(&stale, b"half").expect("write");
        let other = dir.path().join(".other.99999999.tmp");
        std::fs::write(&other, b"not ours").expect("write");
        write_output(&path, b"whole").expect("write");
        assert_eq!(
            entries(dir.path()),
            [".other.99999999.tmp", "model.safetensors"]
        );
    }
}
