//! Reading a config file's bytes, bounded: every command reads its config through
//! [`read_config`], so none of them hangs on a FIFO or `/dev/urandom`, exhausts memory on
//! `/dev/zero`, or loads a multi-gigabyte file.
//!
//! A config is a few kilobytes; [`MAX_CONFIG_BYTES`] (64 MiB) leaves room for anything a person
//! or a generator writes. Only regular files are read (a FIFO, a device or a directory is
//! refused before it is opened, so opening cannot block), except standard input, named `-` or
//! `/dev/stdin`, which is read up to the same bound.

use std::io::Read;
use std::path::Path;

use crate::diagnostics::{Code, Diagnostic};

/// The most bytes a config file may hold: 64 MiB.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024 * 1024;

/// Reads the config at `path` (`-` or `/dev/stdin`: standard input). An unreadable file, one
/// that is not a regular file, and one over [`MAX_CONFIG_BYTES`] become an
/// [`Code::UnreadableFile`] diagnostic naming the file and saying why.
pub fn read_config(path: &Path) -> Result<Vec<u8>, Diagnostic> {
    let shown = path.display();
    if is_stdin(path) {
        return read_bounded(std::io::stdin().lock(), &shown.to_string());
    }
    let metadata = std::fs::metadata(path).map_err(|error| {
        unreadable(format!("cannot read {shown}: {error}"))
            .with_help("check the path and the file's permissions")
    })?;
    if !metadata.is_file() {
        return Err(unreadable(format!(
            "cannot read {shown}: it is {}, not a regular file",
            kind_of(&metadata.file_type())
        ))
        .with_help("give the path of a config file (or `-` to read standard input)"));
    }
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(too_large(&shown.to_string(), Some(metadata.len())));
    }
    // Opened without blocking and looked at again through the handle: a path swapped for a
    // FIFO after the look above cannot stall the read.
    let opened = crate::user_file::open(path, crate::user_file::FileKind::DeepSpeedConfig)
        .map_err(|error| {
            unreadable(format!("cannot read {shown}: {error}"))
                .with_help("check the path and the file's permissions")
        })?;
    read_bounded(opened.file, &shown.to_string())
}

/// Whether `path` names standard input.
fn is_stdin(path: &Path) -> bool {
    path == Path::new("-") || path == Path::new("/dev/stdin")
}

/// Reads at most [`MAX_CONFIG_BYTES`] from `reader`; one more byte is a `too large` error.
fn read_bounded(reader: impl Read, shown: &str) -> Result<Vec<u8>, Diagnostic> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| unreadable(format!("cannot read {shown}: {error}")))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large(shown, None));
    }
    Ok(bytes)
}

fn too_large(shown: &str, size: Option<u64>) -> Diagnostic {
    let size = size.map_or_else(
        || "more than 64 MiB".to_string(),
        |bytes| format!("{bytes} bytes"),
    );
    unreadable(format!(
        "cannot read {shown}: it holds {size}; a config may hold at most {MAX_CONFIG_BYTES} bytes (64 MiB)"
    ))
    .with_help("a DeepSpeed config is a few kilobytes: check that this is the config file")
}

fn unreadable(message: String) -> Diagnostic {
    Diagnostic::error(Code::UnreadableFile, "", message)
}

/// What a non-regular file is, for the message.
fn kind_of(kind: &std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.json");
        std::fs::write(&path, b"{\"a\": 1}").expect("write");
        assert_eq!(read_config(&path).expect("read"), b"{\"a\": 1}");
    }

    #[test]
    fn a_directory_is_refused_by_kind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = read_config(dir.path()).expect_err("refused");
        assert_eq!(error.code, Code::UnreadableFile);
        assert!(
            error
                .message
                .ends_with("it is a directory, not a regular file"),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_big_sparse_file_is_refused_without_reading_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("big.json");
        let file = std::fs::File::create(&path).expect("create");
        file.set_len(MAX_CONFIG_BYTES + 1).expect("sparse");
        let error = read_config(&path).expect_err("refused");
        assert_eq!(error.code, Code::UnreadableFile);
        assert!(
            error.message.contains(&format!(
                "it holds {} bytes; a config may hold at most {MAX_CONFIG_BYTES} bytes (64 MiB)",
                MAX_CONFIG_BYTES + 1
            )),
            "{}",
            error.message
        );
    }

    #[test]
    fn a_stream_over_the_bound_is_cut_off() {
        let endless = std::io::repeat(b' ');
        let error = read_bounded(endless, "-").expect_err("refused");
        assert!(
            error.message.contains("more than 64 MiB"),
            "{}",
            error.message
        );
        let exact = std::io::repeat(b' ').take(16);
        assert_eq!(read_bounded(exact, "-").expect("read").len(), 16);
    }
}
