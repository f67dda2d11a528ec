//! [`probe_writable`]: whether this process can create entries in a directory, asked before a
//! run depends on it (NVMe swap files, checkpoints) rather than discovered at the first write;
//! [`available_bytes`]: how much it can still write there.

use std::path::Path;

/// Whether this process can create entries in `dir`, found by trying. On Linux the probe is an
/// unnamed file (`O_TMPFILE`) that vanishes when closed, so a run killed mid-probe leaves
/// nothing behind; where the file system has no unnamed files (and elsewhere), an empty
/// directory `.dsplan-probe-<pid>` is made and removed (one left by an earlier run of the same
/// pid counts as written).
pub fn probe_writable(dir: &Path) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{Mode, OFlags, open};
        use rustix::io::Errno;
        match open(
            dir,
            OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::RUSR,
        ) {
            Ok(_unnamed) => return Ok(()),
            // No unnamed files on this file system: the named probe below decides.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    named_probe(dir)
}

fn named_probe(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".dsplan-probe-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).or_else(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => Ok(()),
        _ => Err(e),
    });
    let _ = std::fs::remove_dir(&probe);
    made
}

/// Bytes an unprivileged process can still write on the file system holding `dir` (`None`
/// when the system does not say).
pub fn available_bytes(dir: &Path) -> Option<u64> {
    #[cfg(unix)]
    {
        let stat = rustix::fs::statvfs(dir).ok()?;
        Some(stat.f_bavail.saturating_mul(stat.f_frsize))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_writable_and_a_missing_one_is_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        probe_writable(dir.path()).expect("writable");
        assert!(
            std::fs::read_dir(dir.path())
                .expect("listed")
                .next()
                .is_none()
        );
        assert!(probe_writable(&dir.path().join("absent")).is_err());
        named_probe(dir.path()).expect("writable by the named probe too");
        assert!(named_probe(&dir.path().join("absent")).is_err());
        assert!(available_bytes(dir.path()).is_some_and(|b| b > 0));
        assert!(available_bytes(&dir.path().join("absent")).is_none());
    }
}
