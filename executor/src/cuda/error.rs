//! Errors of the CUDA backend.

use std::fmt;

use cudarc::driver::DriverError;
use dsplan_kernels::registry::MissingEntryPoint;
use dsplan_kernels::{LaunchError, NvrtcError};

use super::device::describe_driver_error;

/// Why a CUDA operation failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaError {
    /// The driver returned an error (its name and message).
    Driver(String),
    /// A kernel file did not compile.
    Nvrtc(NvrtcError),
    /// A kernel's launch shape could not be computed.
    Launch(LaunchError),
    /// The registry has no such entry point (e.g. an unsupported head size).
    MissingEntryPoint(MissingEntryPoint),
    /// Buffers passed to a kernel do not have the lengths its shape needs.
    Shape(String),
    /// cuBLASLt failed.
    Blas(String),
    /// NCCL failed.
    Nccl(String),
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaError::Driver(e) => write!(f, "CUDA driver error: {e}"),
            CudaError::Nvrtc(e) => write!(f, "{e}"),
            CudaError::Launch(e) => write!(f, "kernel launch: {e}"),
            CudaError::MissingEntryPoint(e) => write!(f, "{e}"),
            CudaError::Shape(e) => write!(f, "kernel arguments: {e}"),
            CudaError::Blas(e) => write!(f, "cuBLASLt: {e}"),
            CudaError::Nccl(e) => write!(f, "NCCL: {e}"),
        }
    }
}

impl std::error::Error for CudaError {}

impl From<DriverError> for CudaError {
    fn from(e: DriverError) -> Self {
        CudaError::Driver(describe_driver_error(e))
    }
}

impl From<NvrtcError> for CudaError {
    fn from(e: NvrtcError) -> Self {
        CudaError::Nvrtc(e)
    }
}

impl From<LaunchError> for CudaError {
    fn from(e: LaunchError) -> Self {
        CudaError::Launch(e)
    }
}

impl From<MissingEntryPoint> for CudaError {
    fn from(e: MissingEntryPoint) -> Self {
        CudaError::MissingEntryPoint(e)
    }
}
