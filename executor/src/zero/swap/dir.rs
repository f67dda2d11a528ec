//! [`SwapDir`]: a rank's swap directory under `nvme_path`, removed when dropped; the
//! `dsplan-PID` directories of killed runs (PID no longer running) are swept when the next run
//! creates its own ([`sweep_stale_swap_dirs`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::SwapError;

/// Distinguishes the swap directories made by one process (several runs, several ranks).
static NEXT: AtomicU64 = AtomicU64::new(0);

/// `<nvme_path>/dsplan-<pid>/rank<R>.<n>/`, created empty and removed (with its files) on drop;
/// the `dsplan-<pid>` directory goes with the last of them.
#[derive(Debug)]
pub struct SwapDir {
    path: PathBuf,
    process_dir: PathBuf,
}

impl SwapDir {
    /// Creates rank `rank`'s directory under `nvme_path`, which must exist and be writable (it
    /// is not created: a missing drive is a mistake worth reporting, not a directory to make on
    /// the root file system). `pointer` names the config value in errors.
    pub fn create(nvme_path: &Path, rank: usize, pointer: &'static str) -> Result<Self, SwapError> {
        match std::fs::metadata(nvme_path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(SwapError::invalid(
                    pointer,
                    nvme_path,
                    "nvme_path is not a directory",
                ));
            }
            Err(e) => {
                return Err(SwapError::io(pointer, nvme_path, "use nvme_path", &e));
            }
        }
        sweep_stale_swap_dirs(nvme_path);
        let process_dir = nvme_path.join(format!("dsplan-{}", std::process::id()));
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = process_dir.join(format!("rank{rank}.{n}"));
        // Another rank of this process may remove `dsplan-<pid>` between our two creations
        // (it removes it when it was the last one there): try again.
        let mut attempts = 0;
        loop {
            let made =
                std::fs::create_dir_all(&process_dir).and_then(|()| std::fs::create_dir(&path));
            match made {
                Ok(()) => break,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => {
                    attempts += 1;
                }
                Err(e) => {
                    let _ = std::fs::remove_dir(&process_dir);
                    return Err(SwapError::io(
                        pointer,
                        &path,
                        "create the swap directory",
                        &e,
                    ));
                }
            }
        }
        Ok(Self { path, process_dir })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file name inside it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// Removes the `dsplan-PID` directories under `nvme_path` whose process no longer runs
/// (swap files of a killed run); other entries, and those of running processes, stay.
pub fn sweep_stale_swap_dirs(nvme_path: &Path) {
    let Ok(entries) = std::fs::read_dir(nvme_path) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("dsplan-"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !crate::io::process_alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for SwapDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        // Fails while other ranks' directories are still there; the last one removes it.
        let _ = std::fs::remove_dir(&self.process_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_lives_as_long_as_the_guard() {
        let base = tempfile::tempdir().expect("temp dir");
        let a = SwapDir::create(base.path(), 0, "/x").expect("created");
        let b = SwapDir::create(base.path(), 1, "/x").expect("created");
        std::fs::write(a.file("f"), b"data").expect("written");
        assert!(a.path().is_dir() && b.path().is_dir());
        assert_ne!(a.path(), b.path());
        drop(a);
        assert!(b.path().is_dir());
        drop(b);
        let left: Vec<_> = std::fs::read_dir(base.path()).expect("listed").collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn swap_directories_of_dead_processes_are_swept() {
        let base = tempfile::tempdir().expect("temp dir");
        // A PID above the kernel's pid_max (2^22) never runs; this process does.
        let stale = base.path().join("dsplan-99999999");
        std::fs::create_dir_all(stale.join("rank0.0")).expect("created");
        std::fs::write(stale.join("rank0.0/fp16"), b"swap").expect("written");
        let running = base.path().join(format!("dsplan-{}", std::process::id()));
        std::fs::create_dir_all(running.join("other")).expect("created");
        let unrelated = base.path().join("dsplan-notes");
        std::fs::create_dir(&unrelated).expect("created");
        let dir = SwapDir::create(base.path(), 0, "/x").expect("created");
        assert!(!stale.exists(), "the killed run's swap files stay");
        assert!(running.join("other").is_dir() && unrelated.is_dir());
        drop(dir);
    }

    #[test]
    fn a_missing_or_non_directory_path_is_an_error() {
        let base = tempfile::tempdir().expect("temp dir");
        let missing = base.path().join("absent");
        let error = SwapDir::create(&missing, 0, "/p").expect_err("missing");
        assert_eq!(error.kind, Some(std::io::ErrorKind::NotFound));
        assert!(error.to_string().starts_with("/p: "), "{error}");
        let file = base.path().join("file");
        std::fs::write(&file, b"").expect("written");
        let error = SwapDir::create(&file, 0, "/p").expect_err("a file");
        assert!(error.message.contains("not a directory"), "{error}");
        assert!(!missing.exists());
    }
}
