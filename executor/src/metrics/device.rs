//! [`DeviceRun`]: what a run on a GPU reports besides what every run reports.

use serde::Serialize;

/// The GPU a run trained on, and what it measured there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceRun {
    /// The device's name, as the driver gives it.
    pub name: String,
    /// Model FLOPs utilisation over the run (`None`: the device is not in the peak table).
    pub mfu: Option<f64>,
    /// Device memory in use after the run (`total - free` from the driver: the CUDA context
    /// and library workspaces included).
    pub driver_used_bytes: u64,
}
