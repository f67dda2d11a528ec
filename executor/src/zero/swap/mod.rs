//! NVMe offload (ZeRO-Infinity) on the CPU backend: what DeepSpeed keeps in files under
//! `nvme_path` lives in real files here too, read and written with positioned I/O
//! ([`std::os::unix::fs::FileExt`]) through fixed swap buffers.
//!
//! * [`SwapDir`]: the rank's directory, `<nvme_path>/dsplan-<pid>/rank<R>.<n>/` (`n` unique in
//!   the process, so that runs in one process never share files), removed with everything in
//!   it when the rank's state is dropped: at the end of the run, on an error, on a panic;
//! * [`SwapFile`]: one file of little-endian elements, read and written in 1 MiB requests
//!   (DeepSpeed's default `aio.block_size`), counting the bytes moved;
//! * `optimizer.rs` ([`OptimizerSwap`]): the fp32 master weights and Adam's two moments, one
//!   file each, in the plan's sub-groups; the step reads a sub-group's three into swap buffers
//!   (`offload_optimizer.buffer_count` buffers of the largest sub-group), steps it with its
//!   fp32 gradients, writes the three back and hands the new master to the caller to refresh
//!   the 16-bit parameters;
//! * `params.rs` ([`ParamSwap`]): the stage 3 parameter slices the plan puts on NVMe, in the
//!   model dtype, one file; a gather reads each slice into one of the
//!   `offload_param.buffer_count × buffer_size` swap buffers, and the step writes the updated
//!   slices back.
//!
//! Errors ([`SwapError`]) name the config's JSON pointer of the `nvme_path` involved and the
//! file, and say what failed (a missing directory, no permission, no space left).

mod dir;
mod file;
mod optimizer;
mod params;

use std::fmt;
use std::path::PathBuf;

use serde::Serialize;

pub use dir::SwapDir;
pub use file::SwapFile;
pub use optimizer::OptimizerSwap;
pub use params::ParamSwap;

/// JSON pointer of the optimizer's `nvme_path`.
pub const OPTIMIZER_PATH_POINTER: &str = "/zero_optimization/offload_optimizer/nvme_path";
/// JSON pointer of the parameters' `nvme_path`.
pub const PARAM_PATH_POINTER: &str = "/zero_optimization/offload_param/nvme_path";

/// Why a swap could not be set up or carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapError {
    /// The config value it concerns (a JSON pointer).
    pub pointer: &'static str,
    /// The file or directory.
    pub path: PathBuf,
    /// What was being done ("create the swap directory", "write", ...).
    pub action: String,
    /// The operating system's message, or what is wrong.
    pub message: String,
    /// The kind of I/O error, when there was one.
    pub kind: Option<std::io::ErrorKind>,
}

impl SwapError {
    pub(crate) fn io(
        pointer: &'static str,
        path: impl Into<PathBuf>,
        action: impl Into<String>,
        error: &std::io::Error,
    ) -> Self {
        let kind = error.kind();
        let hint = match kind {
            std::io::ErrorKind::StorageFull => " (the drive behind nvme_path is full)",
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                " (nvme_path must be writable)"
            }
            std::io::ErrorKind::NotFound => " (nvme_path must be an existing directory)",
            _ => "",
        };
        Self {
            pointer,
            path: path.into(),
            action: action.into(),
            message: format!("{error}{hint}"),
            kind: Some(kind),
        }
    }

    pub(crate) fn invalid(
        pointer: &'static str,
        path: impl Into<PathBuf>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            pointer,
            path: path.into(),
            action: String::new(),
            message: message.into(),
            kind: None,
        }
    }
}

impl fmt::Display for SwapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.pointer)?;
        if self.action.is_empty() {
            write!(f, "{} ({})", self.message, self.path.display())
        } else {
            write!(
                f,
                "cannot {} {}: {}",
                self.action,
                self.path.display(),
                self.message
            )
        }
    }
}

impl std::error::Error for SwapError {}

/// Bytes moved between memory and the swap files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct SwapTraffic {
    /// Read from the files.
    pub read_bytes: u64,
    /// Written to the files.
    pub written_bytes: u64,
}

impl SwapTraffic {
    /// The sum of two counts.
    pub fn plus(self, other: SwapTraffic) -> SwapTraffic {
        SwapTraffic {
            read_bytes: self.read_bytes + other.read_bytes,
            written_bytes: self.written_bytes + other.written_bytes,
        }
    }

    /// What was moved since `earlier`.
    pub fn since(self, earlier: SwapTraffic) -> SwapTraffic {
        SwapTraffic {
            read_bytes: self.read_bytes.saturating_sub(earlier.read_bytes),
            written_bytes: self.written_bytes.saturating_sub(earlier.written_bytes),
        }
    }
}

/// One rank's use of NVMe over a run, measured.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NvmeUsage {
    /// The rank's swap directories (optimizer first), as they were during the run.
    pub directories: Vec<PathBuf>,
    /// Bytes of the swap files (their sizes on disk at the end of the run, before removal).
    pub resident_bytes: u64,
    /// Of which the optimizer's files (fp32 master and Adam states).
    pub optimizer_bytes: u64,
    /// Of which the parameters' file.
    pub param_bytes: u64,
    /// Written while setting up (the initial master, zero moments, parameter slices).
    pub init: SwapTraffic,
    /// Moved by the training steps (gathers and optimizer steps).
    pub steps: SwapTraffic,
}

/// NVMe use over a run: the plan's figure next to what each rank measured.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct NvmeReport {
    /// The plan's bytes on NVMe per rank (its buffers on `Device::Nvme`): the `dsplan-cpu`
    /// plan lists exactly the executor's swap files, so each rank's `resident_bytes` equal it.
    pub plan_bytes: u64,
    /// Each rank, measured.
    pub ranks: Vec<NvmeUsage>,
}

impl NvmeReport {
    /// The plan's side of the report, with no rank measured yet.
    pub fn of_plan(plan: &dsplan_planner::plan::Plan) -> Self {
        use dsplan_planner::plan::Device;
        Self {
            plan_bytes: plan
                .buffers
                .iter()
                .filter(|b| b.device == Device::Nvme)
                .map(|b| b.bytes)
                .sum(),
            ranks: Vec::new(),
        }
    }
}
