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
    /// The same figure before the step's buffers were allocated: the CUDA context, the
    /// communicator, cuBLASLt's handle and workspace. `driver_used_bytes` minus this is what
    /// the run added, the figure to hold against the plan (an H200 showed 9.24 GiB used after
    /// a run whose buffers and plan were 8.66 GiB).
    pub driver_runtime_bytes: u64,
}

impl DeviceRun {
    /// What the run added on the device beyond its runtime: `driver_used_bytes -
    /// driver_runtime_bytes` (the whole device's figure: other processes' changes count too).
    pub fn driver_added_bytes(&self) -> u64 {
        self.driver_used_bytes
            .saturating_sub(self.driver_runtime_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_adds_what_the_driver_saw_beyond_the_runtime() {
        let run = |used, runtime| DeviceRun {
            name: "GPU".to_string(),
            mfu: None,
            driver_used_bytes: used,
            driver_runtime_bytes: runtime,
        };
        assert_eq!(
            run(9_918_349_312, 600_000_000).driver_added_bytes(),
            9_318_349_312
        );
        // Another process freed memory meanwhile: nothing added, never a wrapped figure.
        assert_eq!(run(100, 200).driver_added_bytes(), 0);
    }
}
