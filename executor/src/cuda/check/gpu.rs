//! The device a check runs on: a context on one GPU, its kernel modules (through the kernel
//! cache) and default stream, and copies to and from it that return errors instead of
//! panicking.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use dsplan_kernels::GpuArch;
use dsplan_kernels::cache::CubinCache;

use crate::cuda::error::CudaError;
use crate::cuda::launch::Launcher;
use crate::cuda::modules::KernelModules;

/// One GPU with its kernels.
pub struct Gpu {
    /// The device's name.
    pub name: String,
    /// Its compute capability.
    pub arch: GpuArch,
    /// The stream every check runs on.
    pub stream: Arc<CudaStream>,
    /// The kernels, compiled or read from the cache on first use.
    pub modules: KernelModules,
}

impl Gpu {
    /// A context on GPU `ordinal`. The driver must have been probed first.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        let ctx = CudaContext::new(ordinal)?;
        let name = ctx.name()?;
        let stream = ctx.default_stream();
        let modules = KernelModules::new(ctx, CubinCache::default_dir().map(CubinCache::new))?;
        Ok(Gpu {
            name,
            arch: modules.arch(),
            stream,
            modules,
        })
    }

    /// A launcher on the check's stream.
    pub fn launcher(&self) -> Launcher<'_> {
        Launcher::new(&self.modules, self.stream.clone())
    }

    /// `host` on the device.
    pub fn up<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// `device` on the host, after the stream's work is done.
    pub fn down<T: DeviceRepr>(&self, device: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        let host = self.stream.clone_dtoh(device)?;
        self.stream.synchronize()?;
        Ok(host)
    }

    /// `n` zeros on the device.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        Ok(self.stream.alloc_zeros(n)?)
    }
}
