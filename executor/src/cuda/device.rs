//! Is there a usable GPU, and which backend runs: the `--device cpu|cuda|auto` decision.
//!
//! cudarc loads `libcuda` lazily and **panics** when it cannot (dynamic loading), so
//! [`probe`] asks `cudarc::driver::sys::is_culib_present()` (which only tries to open the
//! library) before any other driver call. With the driver present but no GPU (`cuInit` returns
//! `CUDA_ERROR_NO_DEVICE`), cudarc returns an ordinary error. [`probe`] creates no context.
//!
//! [`resolve_backend`] is the pure decision over a probe's result, so every case is tested
//! without hardware; [`choose_backend`] probes and decides.

use std::fmt;
use std::str::FromStr;

use cudarc::driver::{result, sys};
use dsplan_kernels::GpuArch;

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    /// Its ordinal (`CUDA_VISIBLE_DEVICES` numbering).
    pub ordinal: usize,
    /// Its name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Its compute capability.
    pub arch: GpuArch,
    /// Its memory in bytes.
    pub total_memory: u64,
}

impl fmt::Display for CudaDeviceInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {} ({}, {}, {:.1} GiB)",
            self.ordinal,
            self.name,
            self.arch,
            self.total_memory as f64 / f64::from(1u32 << 30)
        )
    }
}

/// What the CUDA driver offers on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaAvailability {
    /// The driver initialised and reports these devices (at least one).
    Available {
        /// The driver's CUDA version, e.g. 13000 for 13.0.
        driver_version: i32,
        /// The devices.
        devices: Vec<CudaDeviceInfo>,
        /// CUDA libraries the backend needs that cannot be loaded (`libnvrtc`, `libcublasLt`).
        missing_libraries: Vec<&'static str>,
    },
    /// `libcuda` could not be loaded: no NVIDIA driver is installed (or not on the loader path).
    NoDriver,
    /// The driver loaded but there is no GPU (`CUDA_ERROR_NO_DEVICE`, or zero devices).
    NoDevice(String),
    /// The driver loaded but failed otherwise (the driver's error name and message).
    DriverFailed(String),
}

/// The backend the executor runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend.
    Cpu,
    /// One GPU through CUDA.
    Cuda(CudaDeviceInfo),
}

/// What the user asked for with `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// `cpu`: never touch CUDA.
    Cpu,
    /// `cuda`: a GPU or a clear error.
    Cuda,
    /// `auto`: a GPU when one is usable, else the CPU with a one-line notice.
    Auto,
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda),
            "auto" => Ok(DeviceChoice::Auto),
            other => Err(format!(
                "unknown device `{other}`: expected cpu, cuda or auto"
            )),
        }
    }
}

/// The chosen backend, and the notice to print when `auto` fell back to the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendChoice {
    /// Where to run.
    pub backend: Backend,
    /// One line for stderr when the choice is not what the user might expect (`auto` fell back).
    pub notice: Option<String>,
}

/// Why `--device cuda` cannot be honoured (or `auto` hit a configuration error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// No driver.
    NoDriver,
    /// Driver, no device.
    NoDevice(String),
    /// The driver failed.
    DriverFailed(String),
    /// The requested ordinal (LOCAL_RANK) is not a device of this machine.
    OrdinalOutOfRange {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// The GPU is older than the kernels support.
    UnsupportedArch(CudaDeviceInfo),
    /// A GPU is there but CUDA libraries the backend needs cannot be loaded.
    MissingLibraries(Vec<&'static str>),
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::NoDriver => write!(
                f,
                "--device cuda: no CUDA driver found (libcuda.so could not be loaded); install \
                 the NVIDIA driver or use --device cpu"
            ),
            DeviceError::NoDevice(why) => write!(
                f,
                "--device cuda: the CUDA driver reports no GPU ({why}); check \
                 CUDA_VISIBLE_DEVICES or use --device cpu"
            ),
            DeviceError::DriverFailed(why) => write!(
                f,
                "--device cuda: the CUDA driver failed to initialise ({why})"
            ),
            DeviceError::OrdinalOutOfRange { ordinal, count } => write!(
                f,
                "GPU {ordinal} was asked for (LOCAL_RANK) but this machine has {count} GPU(s)"
            ),
            DeviceError::UnsupportedArch(device) => write!(
                f,
                "--device cuda: {device} is not supported; dsplan's kernels need compute \
                 capability 8.0 (sm_80) or newer"
            ),
            DeviceError::MissingLibraries(names) => write!(
                f,
                "--device cuda: a GPU is present but {} cannot be loaded; pip install \
                 nvidia-cuda-nvrtc nvidia-cublas and put their nvidia/*/lib directories on \
                 LD_LIBRARY_PATH",
                names.join(" and ")
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

/// The driver's name and message for an error, without assuming either call succeeds.
pub(crate) fn describe_driver_error(error: result::DriverError) -> String {
    let name = error
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    match error.error_string() {
        Ok(message) => format!("{name}: {}", message.to_string_lossy()),
        Err(_) => name,
    }
}

/// Whether `libcuda` can be loaded (no driver call is made).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { sys::is_culib_present() }
}

/// Asks the driver what it offers. Never panics for a missing driver or device.
pub fn probe() -> CudaAvailability {
    if !driver_present() {
        return CudaAvailability::NoDriver;
    }
    if let Err(error) = result::init() {
        let description = describe_driver_error(error);
        return if error.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
            CudaAvailability::NoDevice(description)
        } else {
            CudaAvailability::DriverFailed(description)
        };
    }
    // Only cuInit, cuDeviceGetCount and the error strings are called until a device is known
    // to exist (a stub or partial driver may lack the rest; cudarc panics on a missing symbol).
    match result::device::get_count() {
        Ok(0) => return CudaAvailability::NoDevice("the driver lists 0 devices".to_string()),
        Ok(_) => {}
        Err(error) => return CudaAvailability::DriverFailed(describe_driver_error(error)),
    }
    match list_devices() {
        Ok((driver_version, devices)) => CudaAvailability::Available {
            driver_version,
            devices,
            missing_libraries: missing_libraries(),
        },
        Err(error) => CudaAvailability::DriverFailed(describe_driver_error(error)),
    }
}

/// The libraries the CUDA backend loads besides the driver, that cannot be opened here.
fn missing_libraries() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !dsplan_kernels::nvrtc_available() {
        missing.push("libnvrtc");
    }
    // SAFETY: only tries to open the library by its candidate names.
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        missing.push("libcublasLt");
    }
    missing
}

fn list_devices() -> Result<(i32, Vec<CudaDeviceInfo>), result::DriverError> {
    let count = result::device::get_count()?;
    let mut devices = Vec::new();
    for ordinal in 0..count {
        let device = result::device::get(ordinal)?;
        let attribute = |a| {
            // SAFETY: `device` is a valid handle returned by the driver above.
            unsafe { result::device::get_attribute(device, a) }
        };
        let major =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor =
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        // SAFETY: as above.
        let total_memory = unsafe { result::device::total_mem(device) }?;
        devices.push(CudaDeviceInfo {
            ordinal: ordinal as usize,
            name: result::device::get_name(device)?,
            arch: GpuArch::new(major as u32, minor as u32),
            total_memory: total_memory as u64,
        });
    }
    let mut version = 0;
    // SAFETY: the driver is initialised; `version` is valid for writes.
    unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok((version, devices))
}

/// The decision for `choice` given what the driver offers, using GPU `ordinal`
/// (the process's LOCAL_RANK; 0 for a single process).
///
/// * `cpu`: the CPU, silently.
/// * `cuda`: that GPU, or a [`DeviceError`] saying why not.
/// * `auto`: that GPU when usable; otherwise the CPU with a one-line notice. An ordinal beyond
///   the devices present is a configuration error under `auto` too.
pub fn resolve_backend(
    choice: DeviceChoice,
    availability: &CudaAvailability,
    ordinal: usize,
) -> Result<BackendChoice, DeviceError> {
    if choice == DeviceChoice::Cpu {
        return Ok(BackendChoice {
            backend: Backend::Cpu,
            notice: None,
        });
    }
    let usable = match availability {
        CudaAvailability::NoDriver => Err(DeviceError::NoDriver),
        CudaAvailability::NoDevice(why) => Err(DeviceError::NoDevice(why.clone())),
        CudaAvailability::DriverFailed(why) => Err(DeviceError::DriverFailed(why.clone())),
        CudaAvailability::Available {
            devices,
            missing_libraries,
            ..
        } => match devices.get(ordinal) {
            None => {
                return Err(DeviceError::OrdinalOutOfRange {
                    ordinal,
                    count: devices.len(),
                });
            }
            Some(device) if !device.arch.is_supported() => {
                Err(DeviceError::UnsupportedArch(device.clone()))
            }
            Some(_) if !missing_libraries.is_empty() => {
                Err(DeviceError::MissingLibraries(missing_libraries.clone()))
            }
            Some(device) => Ok(device.clone()),
        },
    };
    match (usable, choice) {
        (Ok(device), _) => Ok(BackendChoice {
            backend: Backend::Cuda(device),
            notice: None,
        }),
        (Err(error), DeviceChoice::Cuda) => Err(error),
        (Err(error), _) => Ok(BackendChoice {
            backend: Backend::Cpu,
            notice: Some(fallback_notice(&error)),
        }),
    }
}

fn fallback_notice(error: &DeviceError) -> String {
    let why = match error {
        DeviceError::NoDriver => "no CUDA driver found".to_string(),
        DeviceError::NoDevice(why) => format!("no GPU ({why})"),
        DeviceError::DriverFailed(why) => format!("the CUDA driver failed ({why})"),
        DeviceError::OrdinalOutOfRange { ordinal, count } => {
            format!("GPU {ordinal} not present ({count} found)")
        }
        DeviceError::UnsupportedArch(device) => format!("{device} is older than sm_80"),
        DeviceError::MissingLibraries(names) => {
            format!(
                "a GPU is present but {} cannot be loaded",
                names.join(" and ")
            )
        }
    };
    format!("note: --device auto: {why}; running on the CPU")
}

/// Probes the driver and decides (see [`resolve_backend`]). The run command calls this once,
/// prints the notice (if any) to stderr, and reports the error (if any) as a usage error.
pub fn choose_backend(choice: DeviceChoice, ordinal: usize) -> Result<BackendChoice, DeviceError> {
    if choice == DeviceChoice::Cpu {
        return resolve_backend(choice, &CudaAvailability::NoDriver, ordinal);
    }
    resolve_backend(choice, &probe(), ordinal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100(ordinal: usize) -> CudaDeviceInfo {
        CudaDeviceInfo {
            ordinal,
            name: "NVIDIA H100 80GB HBM3".to_string(),
            arch: GpuArch::SM90,
            total_memory: 85_520_809_984,
        }
    }

    #[test]
    fn every_choice_against_every_availability() {
        let gpus = CudaAvailability::Available {
            driver_version: 13000,
            devices: vec![h100(0), h100(1)],
            missing_libraries: Vec::new(),
        };
        let none = CudaAvailability::NoDevice("CUDA_ERROR_NO_DEVICE: no device".to_string());
        // cpu never looks at CUDA.
        assert_eq!(
            resolve_backend(DeviceChoice::Cpu, &gpus, 0).map(|c| c.backend),
            Ok(Backend::Cpu)
        );
        // cuda and auto take the GPU when there is one.
        for choice in [DeviceChoice::Cuda, DeviceChoice::Auto] {
            assert_eq!(
                resolve_backend(choice, &gpus, 1),
                Ok(BackendChoice {
                    backend: Backend::Cuda(h100(1)),
                    notice: None
                })
            );
        }
        // cuda without a GPU is an error that says what is missing.
        let error = resolve_backend(DeviceChoice::Cuda, &CudaAvailability::NoDriver, 0)
            .expect_err("no driver");
        assert_eq!(error, DeviceError::NoDriver);
        assert!(error.to_string().contains("no CUDA driver found"));
        let error = resolve_backend(DeviceChoice::Cuda, &none, 0).expect_err("no device");
        assert!(error.to_string().contains("CUDA_ERROR_NO_DEVICE"));
        // auto falls back with one line.
        for availability in [CudaAvailability::NoDriver, none.clone()] {
            let choice = resolve_backend(DeviceChoice::Auto, &availability, 0).expect("falls back");
            assert_eq!(choice.backend, Backend::Cpu);
            let notice = choice.notice.expect("a notice");
            assert!(notice.starts_with("note: --device auto:") && !notice.contains('\n'));
        }
        // An ordinal beyond the devices is an error under both.
        for choice in [DeviceChoice::Cuda, DeviceChoice::Auto] {
            assert_eq!(
                resolve_backend(choice, &gpus, 2),
                Err(DeviceError::OrdinalOutOfRange {
                    ordinal: 2,
                    count: 2
                })
            );
        }
        // Too old a GPU: error under cuda, fallback under auto.
        let old = CudaAvailability::Available {
            driver_version: 12000,
            devices: vec![CudaDeviceInfo {
                arch: GpuArch::new(7, 0),
                name: "Tesla V100".to_string(),
                ..h100(0)
            }],
            missing_libraries: Vec::new(),
        };
        assert!(matches!(
            resolve_backend(DeviceChoice::Cuda, &old, 0),
            Err(DeviceError::UnsupportedArch(_))
        ));
        assert_eq!(
            resolve_backend(DeviceChoice::Auto, &old, 0).map(|c| c.backend),
            Ok(Backend::Cpu)
        );
        // A GPU without NVRTC: error under cuda naming the library, fallback under auto.
        let no_nvrtc = CudaAvailability::Available {
            driver_version: 13000,
            devices: vec![h100(0)],
            missing_libraries: vec!["libnvrtc"],
        };
        let error = resolve_backend(DeviceChoice::Cuda, &no_nvrtc, 0).expect_err("no NVRTC");
        assert!(error.to_string().contains("libnvrtc cannot be loaded"));
        let auto = resolve_backend(DeviceChoice::Auto, &no_nvrtc, 0).expect("falls back");
        assert_eq!(auto.backend, Backend::Cpu);
        assert!(auto.notice.is_some_and(|n| n.contains("libnvrtc")));
    }

    #[test]
    fn device_choice_parses() {
        assert_eq!("auto".parse(), Ok(DeviceChoice::Auto));
        assert_eq!("cpu".parse(), Ok(DeviceChoice::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda));
        assert!("gpu".parse::<DeviceChoice>().is_err());
    }
}
