//! The one check of a run's settings that needs the machine: every directory NVMe offload
//! will write swap files to ([`dsplan_planner::plan::training::SwapDirectory`]) is an
//! existing directory this process can create files in, so that a wrong `nvme_path` is an
//! error before anything runs.

use std::path::Path;

use dsplan_planner::plan::training::SwapDirectory;

use super::SettingsError;

/// Checks each of `directories` ([`crate::io::probe_writable`]).
pub(super) fn check(directories: &[SwapDirectory]) -> Result<(), SettingsError> {
    for directory in directories {
        check_one(Path::new(&directory.path), &directory.pointer)?;
    }
    Ok(())
}

fn check_one(path: &Path, pointer: &str) -> Result<(), SettingsError> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(SettingsError::new(
                pointer,
                format!("nvme_path `{shown}` is not a directory"),
            ));
        }
        Err(e) => {
            return Err(SettingsError::new(
                pointer,
                format!("nvme_path `{shown}` cannot be used: {e}"),
            )
            .with_help("point nvme_path at an existing directory on a fast local drive (dsplan run --nvme-path DIR overrides it)"));
        }
    }
    crate::io::probe_writable(path).map_err(|e| {
        SettingsError::new(pointer, format!("nvme_path `{shown}` is not writable: {e}"))
            .with_help("the swap files of NVMe offload are written there")
    })
}
