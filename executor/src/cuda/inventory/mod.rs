//! What this machine offers dsplan's CUDA backend, as data (`dsplan report`, dsplan's
//! `ds_report`): the NVIDIA driver and its CUDA version, the CUDA libraries found on disk and
//! whether dsplan's loader can open them, each GPU, the CPU's SIMD, MPI and the NVRTC kernel
//! cache. [`MachineReport::collect`] never panics and never creates a CUDA context: the driver
//! is probed first ([`super::device::probe`]), and a library's own version call is made only
//! after its loader check succeeded.
//!
//! | module | job |
//! |---|---|
//! | [`libraries`] | search the loader path, the loader cache and Python's `nvidia/*/lib` for the CUDA libraries |
//! | [`gpus`] | each GPU's name, compute capability, memory, multiprocessors and PCIe link |
//! | [`host`] | the CPU's model and SIMD, MPI, the driver's version string, the kernel cache |
//!
//! [`MachineReport::missing`] lists in words what keeps the CUDA backend from running here, so
//! the report without a GPU says exactly what is missing.

pub mod gpus;
pub mod host;
pub mod libraries;

use serde::Serialize;

use super::device::{CudaAvailability, probe};
pub use gpus::{GpuReport, PcieLink};
pub use host::{CpuReport, KernelCacheReport, MpiReport};
pub use libraries::{CudaLibrary, LibraryFile, LibraryReport, Need, Origin};

/// The driver as the probe found it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "status")]
pub enum DriverReport {
    /// `libcuda` cannot be loaded.
    Absent,
    /// The driver loaded but lists no GPU.
    NoDevice {
        /// The driver's words.
        detail: String,
    },
    /// The driver loaded but failed to initialise.
    Failed {
        /// The driver's words.
        detail: String,
    },
    /// The driver works.
    Ok {
        /// The kernel module's version (`/proc/driver/nvidia/version` or `nvidia-smi`), e.g.
        /// `580.159.04`; `None` when neither says.
        version: Option<String>,
        /// The CUDA version the driver supports, e.g. `13.0`.
        cuda_version: String,
    },
}

/// Everything `dsplan report` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MachineReport {
    /// The driver.
    pub driver: DriverReport,
    /// Each GPU (empty without a working driver).
    pub gpus: Vec<GpuReport>,
    /// The CUDA libraries dsplan loads.
    pub libraries: Vec<LibraryReport>,
    /// The CPU.
    pub cpu: CpuReport,
    /// MPI, when a launcher or library is found.
    pub mpi: Option<MpiReport>,
    /// The NVRTC kernel cache.
    pub kernel_cache: KernelCacheReport,
    /// What keeps the CUDA backend from running here, one sentence each (empty: nothing).
    pub missing: Vec<String>,
}

impl MachineReport {
    /// Looks at this machine. Never panics; no CUDA context is created.
    pub fn collect() -> Self {
        let availability = probe();
        let driver = match &availability {
            CudaAvailability::NoDriver => DriverReport::Absent,
            CudaAvailability::NoDevice(detail) => DriverReport::NoDevice {
                detail: detail.clone(),
            },
            CudaAvailability::DriverFailed(detail) => DriverReport::Failed {
                detail: detail.clone(),
            },
            CudaAvailability::Available { driver_version, .. } => DriverReport::Ok {
                version: host::driver_version(),
                cuda_version: cuda_version_text(*driver_version),
            },
        };
        let gpus = match &availability {
            CudaAvailability::Available { devices, .. } => gpus::describe(devices),
            _ => Vec::new(),
        };
        let libraries = libraries::search(&libraries::SearchPath::of_this_machine());
        let mut report = MachineReport {
            driver,
            gpus,
            libraries,
            cpu: host::cpu(),
            mpi: host::mpi(),
            kernel_cache: host::kernel_cache(),
            missing: Vec::new(),
        };
        report.missing = report.what_is_missing();
        report
    }

    /// What keeps the CUDA backend from running, in words, from the rest of the report.
    pub fn what_is_missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        match &self.driver {
            DriverReport::Absent => missing.push(
                "no NVIDIA driver: libcuda.so cannot be loaded (install the NVIDIA driver, or \
                 put the directory holding libcuda.so.1 on LD_LIBRARY_PATH)"
                    .to_string(),
            ),
            DriverReport::NoDevice { detail } => missing.push(format!(
                "no GPU: the driver lists none ({detail}); check CUDA_VISIBLE_DEVICES"
            )),
            DriverReport::Failed { detail } => {
                missing.push(format!("the CUDA driver failed to initialise ({detail})"))
            }
            DriverReport::Ok { .. } => {}
        }
        for gpu in &self.gpus {
            if !gpu.supported {
                missing.push(format!(
                    "GPU {} ({}, sm_{}) is older than sm_80, which dsplan's kernels need",
                    gpu.ordinal,
                    gpu.name,
                    gpu.compute_capability.replace('.', "")
                ));
            }
        }
        for library in &self.libraries {
            if let Some(why) = library.missing_reason() {
                missing.push(why);
            }
        }
        missing
    }
}

/// `13000` as `13.0`, `12040` as `12.4`.
pub fn cuda_version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_read_as_major_dot_minor() {
        assert_eq!(cuda_version_text(13000), "13.0");
        assert_eq!(cuda_version_text(12040), "12.4");
        assert_eq!(cuda_version_text(11080), "11.8");
    }

    #[test]
    fn this_machine_reports_without_panicking_and_names_what_is_missing() {
        let report = MachineReport::collect();
        // Whatever this machine has, a driver that is not usable is named as missing.
        if !matches!(report.driver, DriverReport::Ok { .. }) {
            assert!(report.gpus.is_empty());
            assert!(!report.missing.is_empty());
        }
        assert_eq!(report.missing, report.what_is_missing());
        assert_eq!(report.libraries.len(), CudaLibrary::ALL.len());
    }
}
