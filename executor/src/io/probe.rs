//! [`probe_writable`]: whether this process can create entries in a directory, asked before a
//! run depends on it (NVMe swap files, checkpoints) rather than discovered at the first write;
//! [`available_bytes`]: how much it can still write there.

use std::path::Path;

/// Creates and removes an empty directory `.dsplan-probe-<pid>` in `dir`; the error of the
/// creation if it fails (a probe left by an earlier run of the same pid counts as written).
pub fn probe_writable(dir: &Path) -> std::io::Result<()> {
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
        assert!(available_bytes(dir.path()).is_some_and(|b| b > 0));
        assert!(available_bytes(&dir.path().join("absent")).is_none());
    }
}
