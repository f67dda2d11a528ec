//! One writer per checkpoint directory: [`DirLock`], an advisory lock file `DIR/.dsplan.lock`
//! holding its owner's pid and host, taken before a run's first save and released when the
//! run ends.
//!
//! The lock is the file's `flock` (released by the kernel when its process dies) and the
//! owner written in it. A second run that finds the file locked is refused, naming the owner.
//! A lock file of this host that nobody holds (its run is gone, as after `kill -9`) is taken
//! over, and the caller is told whose it was. One whose owner is on
//! another host is refused even when no lock is held, since `flock` may not reach across
//! hosts on a network file system; the message says how to remove it once that run is over.
//!
//! Release removes the file first and unlocks it second; a run that locked a file another
//! released in between sees that the path no longer names its file and locks again.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The lock file's name in a checkpoint directory.
pub const LOCK_FILE: &str = ".dsplan.lock";

/// Who holds (or held) a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its process id.
    pub pid: u32,
    /// The host it runs on.
    pub host: String,
}

impl Owner {
    /// This process on this host.
    pub fn this_process() -> Self {
        Self {
            pid: std::process::id(),
            host: host_name(),
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let pid = words.next()?.strip_prefix("pid=")?.parse().ok()?;
        let host = words.next()?.strip_prefix("host=")?.to_string();
        Some(Self { pid, host })
    }

    fn line(&self) -> String {
        format!("pid={} host={}\n", self.pid, self.host)
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} on host {}", self.pid, self.host)
    }
}

/// Why a checkpoint directory could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// Another run holds it.
    Held {
        /// The lock file.
        path: PathBuf,
        /// Its owner, as written in the file (`None`: unreadable, the run is starting).
        owner: Option<Owner>,
    },
    /// The lock file names a run on another host, whose lock this host cannot see.
    OtherHost {
        /// The lock file.
        path: PathBuf,
        /// Its owner.
        owner: Owner,
    },
    /// The lock file could not be made or read.
    Io {
        /// The lock file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { path, owner } => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let owner = owner
                    .as_ref()
                    .map_or("another run (starting)".to_string(), Owner::to_string);
                write!(
                    f,
                    "{} is being written by {owner} (its lock {}); one run writes a checkpoint \
                     directory at a time, --overwrite included: wait for it to end or name \
                     another directory",
                    dir.display(),
                    path.display()
                )
            }
            LockError::OtherHost { path, owner } => write!(
                f,
                "{} is locked by {owner}, which this host cannot check; if that run has \
                 ended, remove {} and run again",
                path.parent().unwrap_or(Path::new(".")).display(),
                path.display()
            ),
            LockError::Io { path, message } => {
                write!(
                    f,
                    "cannot lock {}: {message}; name a writable directory",
                    path.display()
                )
            }
        }
    }
}

impl std::error::Error for LockError {}

/// A checkpoint directory locked by this process; released on drop.
#[derive(Debug)]
pub struct DirLock {
    path: PathBuf,
    file: Option<File>,
    /// The owner of the stale lock this one took over, if any.
    pub took_over: Option<Owner>,
}

impl DirLock {
    /// Locks `dir` (which must exist) for this process.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |e: std::io::Error| LockError::Io {
            path: path.clone(),
            message: e.to_string(),
        };
        // A few tries: each lost one means another run released the file in between.
        for _ in 0..8 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Err(LockError::Held {
                        owner: read_owner(&mut file),
                        path,
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            if !names_file(&path, &file) {
                continue;
            }
            let previous = read_owner(&mut file);
            let me = Owner::this_process();
            let took_over = match previous {
                Some(owner) if owner.host != me.host => {
                    return Err(LockError::OtherHost { path, owner });
                }
                // Nobody holds the flock, so the run that wrote this has ended (a pid that
                // runs again now is another process).
                Some(owner) if owner.pid != me.pid => Some(owner),
                _ => None,
            };
            file.set_len(0)
                .and_then(|()| file.seek(SeekFrom::Start(0)).map(|_| ()))
                .and_then(|()| file.write_all(me.line().as_bytes()))
                .and_then(|()| file.sync_all())
                .map_err(io)?;
            return Ok(Self {
                path,
                file: Some(file),
                took_over,
            });
        }
        Err(LockError::Held { path, owner: None })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(file) = self.file.take() {
            if names_file(&self.path, &file) {
                let _ = std::fs::remove_file(&self.path);
            }
            let _ = file.unlock();
        }
    }
}

/// The owner written in a lock file (`None` when empty or unreadable).
fn read_owner(file: &mut File) -> Option<Owner> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(4096).read_to_string(&mut text).ok()?;
    Owner::parse(&text)
}

/// Whether `path` still names the open `file` (not removed or replaced since it was opened).
#[cfg(unix)]
fn names_file(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::symlink_metadata(path), file.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn names_file(path: &Path, _: &File) -> bool {
    path.exists()
}

/// This host's name (`uname -n`).
pub fn host_name() -> String {
    #[cfg(unix)]
    {
        rustix::system::uname()
            .nodename()
            .to_string_lossy()
            .into_owned()
    }
    #[cfg(not(unix))]
    {
        std::env::var("COMPUTERNAME").unwrap_or_else(|_| "localhost".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_owner_and_release_removes_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let lock = DirLock::acquire(dir.path()).expect("first");
        assert!(lock.took_over.is_none());
        let text = std::fs::read_to_string(lock.path()).expect("lock file");
        assert_eq!(text, Owner::this_process().line());
        // flock is per open file: a second open in this process conflicts like another run.
        match DirLock::acquire(dir.path()) {
            Err(LockError::Held { owner, .. }) => {
                assert_eq!(owner, Some(Owner::this_process()));
            }
            other => panic!("expected a held lock, got {other:?}"),
        }
        let path = lock.path().to_path_buf();
        drop(lock);
        assert!(!path.exists());
        DirLock::acquire(dir.path()).expect("free again");
    }

    #[test]
    fn a_stale_lock_of_this_host_is_taken_over_and_another_hosts_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(LOCK_FILE);
        let host = host_name();
        // PIDs above the kernel's largest pid_max (2^22) never run.
        std::fs::write(&path, format!("pid=99999999 host={host}\n")).expect("stale");
        let lock = DirLock::acquire(dir.path()).expect("taken over");
        assert_eq!(
            lock.took_over,
            Some(Owner {
                pid: 99_999_999,
                host
            })
        );
        drop(lock);
        std::fs::write(&path, "pid=99999999 host=elsewhere.invalid\n").expect("remote");
        let error = DirLock::acquire(dir.path()).expect_err("another host");
        assert!(matches!(error, LockError::OtherHost { .. }), "{error}");
        assert!(error.to_string().contains("elsewhere.invalid"), "{error}");
        assert!(path.exists(), "a refused lock leaves the file alone");
    }
}
