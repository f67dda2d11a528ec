//! The one way dsplan reads a file a user names: [`read`], [`read_text`] and [`open`].
//!
//! Every such file (a DeepSpeed config, a model's `config.json` or safetensors index, a
//! safetensors file's header, `--training-args`, a hostfile, `.deepspeed_env`, a checkpoint's
//! `latest`, a data or tokenizer file) is
//!
//! * looked at before it is opened: only a regular file (directly or through a symlink) is
//!   opened, so a FIFO, a device, a socket or a directory is refused by what it is, never
//!   read (which could block forever or never end);
//! * opened without blocking (`O_NONBLOCK`, `O_NOCTTY`: a path swapped for a FIFO between the
//!   look and the open cannot stall it) and looked at again through the open handle;
//! * read up to the limit of its [`FileKind`], one byte past it being an error, so a file that
//!   grows while it is read is still bounded.
//!
//! Errors are [`std::io::Error`]s whose message says what the path is and what to do
//! ([`ErrorKind::InvalidInput`] for a file that is not regular, [`ErrorKind::FileTooLarge`]
//! for one over its limit): callers put the path and the flag in front, as they did for any
//! I/O error.

use std::fs::{File, FileType, Metadata};
use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// What a user file is, which sets the most bytes dsplan reads from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// A DeepSpeed config (`ds_config.json`): a few kilobytes; 64 MiB at most.
    DeepSpeedConfig,
    /// A Hugging Face model's `config.json`: a few kilobytes; 16 MiB at most.
    ModelConfig,
    /// `model.safetensors.index.json`: one line per tensor; 64 MiB at most.
    WeightIndex,
    /// A safetensors file, whose header alone is read here; the format caps the header at
    /// 100 MB, the file itself is as large as the weights.
    Safetensors,
    /// `--training-args`: a `TrainingArguments` JSON; 16 MiB at most.
    TrainingArgs,
    /// A hostfile or `.deepspeed_env`: one line per host or variable; 1 MiB at most.
    HostList,
    /// A checkpoint directory's `latest`: one tag name; 4 KiB at most.
    LatestTag,
    /// A checkpoint's JSON (engine state, manifest): 64 MiB at most.
    CheckpointJson,
    /// A checkpoint's tensors: as large as the model and its optimizer state (1 TiB at most).
    CheckpointTensors,
    /// Training data (text, an llm.c `.bin`, safetensors): 1 TiB at most.
    Data,
    /// A tokenizer file (`tokenizer.json`, a vocabulary): 1 GiB at most.
    Tokenizer,
    /// A result dsplan saved (`report --show-check`): 16 MiB at most.
    SavedReport,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

impl FileKind {
    /// The most bytes a file of this kind may hold.
    pub const fn limit(self) -> u64 {
        match self {
            FileKind::DeepSpeedConfig | FileKind::WeightIndex | FileKind::CheckpointJson => {
                64 * MIB
            }
            FileKind::ModelConfig | FileKind::TrainingArgs | FileKind::SavedReport => 16 * MIB,
            FileKind::Safetensors | FileKind::CheckpointTensors | FileKind::Data => 1024 * GIB,
            FileKind::HostList => MIB,
            FileKind::LatestTag => 4 * KIB,
            FileKind::Tokenizer => GIB,
        }
    }

    /// What such a file is, for the message that refuses one that is too large.
    pub const fn what(self) -> &'static str {
        match self {
            FileKind::DeepSpeedConfig => "a DeepSpeed config",
            FileKind::ModelConfig => "a model's config.json",
            FileKind::WeightIndex => "a safetensors index",
            FileKind::Safetensors => "a safetensors file",
            FileKind::TrainingArgs => "a training-arguments file",
            FileKind::HostList => "a hostfile or environment file",
            FileKind::LatestTag => "a checkpoint's `latest`",
            FileKind::CheckpointJson => "a checkpoint's JSON file",
            FileKind::CheckpointTensors => "a checkpoint's tensor file",
            FileKind::Data => "a data file",
            FileKind::Tokenizer => "a tokenizer file",
            FileKind::SavedReport => "a saved report",
        }
    }
}

/// Human size of a limit (`64 MiB`).
fn size_name(bytes: u64) -> String {
    match bytes {
        b if b >= GIB && b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b >= MIB && b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b >= KIB && b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} bytes"),
    }
}

/// What a file that is not regular is, for messages (`a FIFO (named pipe)`, `a directory`).
pub fn describe(kind: &FileType) -> &'static str {
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
    } else if kind.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// A user file opened for reading: a regular file within its kind's limit.
#[derive(Debug)]
pub struct Opened {
    /// The open file, positioned at its start.
    pub file: File,
    /// Its length when it was opened.
    pub len: u64,
}

/// Whether `path` names something (a FIFO or a device included; a dangling symlink does not).
/// Use it, not `Path::is_file`, to decide whether a file a user may have given is there: a
/// FIFO where a file belongs is then refused by [`open`] as a FIFO, not reported missing.
pub fn exists(path: &Path) -> bool {
    std::fs::metadata(path).is_ok()
}

/// Opens the user file `path` of kind `kind`: refused, with a message saying what it is, when it
/// is not a regular file or is over the kind's limit; never blocks.
pub fn open(path: &Path, kind: FileKind) -> std::io::Result<Opened> {
    let before = std::fs::metadata(path)?;
    check_regular(&before)?;
    let file = open_nonblocking(path)?;
    let meta = file.metadata()?;
    check_regular(&meta)?;
    check_size(meta.len(), kind)?;
    Ok(Opened {
        file,
        len: meta.len(),
    })
}

/// Reads the whole user file `path` of kind `kind` ([`open`], then at most the limit).
pub fn read(path: &Path, kind: FileKind) -> std::io::Result<Vec<u8>> {
    let opened = open(path, kind)?;
    read_bounded(opened.file, opened.len, kind)
}

/// Reads the whole user file `path` of kind `kind` as UTF-8 text.
pub fn read_text(path: &Path, kind: FileKind) -> std::io::Result<String> {
    String::from_utf8(read(path, kind)?).map_err(|error| {
        Error::new(
            ErrorKind::InvalidData,
            format!(
                "it is not UTF-8 text (byte {} is not); {} is text",
                error.utf8_error().valid_up_to(),
                kind.what()
            ),
        )
    })
}

/// Reads at most `kind`'s limit from `reader` (a pipe or standard input included); one byte
/// more is an error. `expected` sizes the buffer.
pub fn read_bounded(reader: impl Read, expected: u64, kind: FileKind) -> std::io::Result<Vec<u8>> {
    let limit = kind.limit();
    let mut bytes = Vec::with_capacity(expected.min(limit).min(64 * MIB) as usize);
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(None, kind));
    }
    Ok(bytes)
}

fn check_regular(meta: &Metadata) -> std::io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let help = if meta.is_dir() {
        "name a file in it"
    } else {
        "name a regular file (dsplan does not read pipes or devices, which may never end)"
    };
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "it is {}, not a regular file; {help}",
            describe(&meta.file_type())
        ),
    ))
}

fn check_size(len: u64, kind: FileKind) -> std::io::Result<()> {
    if len > kind.limit() {
        Err(too_large(Some(len), kind))
    } else {
        Ok(())
    }
}

fn too_large(len: Option<u64>, kind: FileKind) -> Error {
    let holds = len.map_or_else(
        || format!("more than {}", size_name(kind.limit())),
        |len| format!("{len} bytes"),
    );
    Error::new(
        ErrorKind::FileTooLarge,
        format!(
            "it holds {holds}; {} may hold at most {} (check that this is the right file)",
            kind.what(),
            size_name(kind.limit())
        ),
    )
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_is_read_whole_and_a_symlink_to_one_too() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts");
        std::fs::write(&path, b"node1 slots=2\n").expect("write");
        assert_eq!(
            read_text(&path, FileKind::HostList).expect("read"),
            "node1 slots=2\n"
        );
        #[cfg(unix)]
        {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&path, &link).expect("symlink");
            assert_eq!(
                read(&link, FileKind::HostList).expect("read"),
                b"node1 slots=2\n"
            );
        }
    }

    #[test]
    fn a_file_over_its_kinds_limit_is_refused_without_reading_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("latest");
        let file = File::create(&path).expect("create");
        file.set_len(FileKind::LatestTag.limit() + 1)
            .expect("sparse");
        let error = read(&path, FileKind::LatestTag).expect_err("too large");
        assert_eq!(error.kind(), ErrorKind::FileTooLarge);
        assert!(error.to_string().contains("at most 4 KiB"), "{error}");
        assert!(read(&path, FileKind::CheckpointJson).is_ok());
    }

    #[test]
    fn a_directory_is_refused_by_what_it_is() {
        let dir = tempfile::tempdir().expect("tempdir");
        let error = read(dir.path(), FileKind::ModelConfig).expect_err("a directory");
        assert_eq!(error.kind(), ErrorKind::InvalidInput);
        assert!(
            error.to_string().starts_with("it is a directory"),
            "{error}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn devices_and_fifos_are_refused_at_once() {
        for device in ["/dev/zero", "/dev/urandom", "/dev/null"] {
            let error = read(Path::new(device), FileKind::TrainingArgs).expect_err(device);
            assert!(
                error.to_string().contains("a character device"),
                "{device}: {error}"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        assert!(exists(&fifo));
        assert!(!fifo.is_file());
        let error = read(&fifo, FileKind::HostList).expect_err("a FIFO");
        assert!(error.to_string().contains("a FIFO (named pipe)"), "{error}");
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_with_its_offset() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("args.json");
        std::fs::write(&path, b"{\"a\": \xff}").expect("write");
        let error = read_text(&path, FileKind::TrainingArgs).expect_err("not UTF-8");
        assert!(error.to_string().contains("byte 6"), "{error}");
    }
}
