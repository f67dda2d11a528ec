//! Compiled kernel modules for one GPU: each `.cu` file compiled by NVRTC for the device's
//! architecture on first use (or read from the on-disk CUBIN cache), loaded once per context,
//! and its functions looked up by registry entry point.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;
use dsplan_kernels::cache::{CacheOutcome, CubinCache};
use dsplan_kernels::nvrtc::nvrtc_version;
use dsplan_kernels::{CudaSource, GpuArch, KernelSpec, compile};

use super::error::CudaError;

/// The kernels of one CUDA context.
#[derive(Debug)]
pub struct KernelModules {
    ctx: Arc<CudaContext>,
    arch: GpuArch,
    cache: Option<CubinCache>,
    loaded: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    outcomes: Mutex<Vec<(&'static str, CacheOutcome)>>,
}

impl KernelModules {
    /// Kernels for `ctx`'s device, cached in `cache` (`None`: compile every time).
    pub fn new(ctx: Arc<CudaContext>, cache: Option<CubinCache>) -> Result<Self, CudaError> {
        let (major, minor) = ctx.compute_capability()?;
        Ok(Self {
            ctx,
            arch: GpuArch::new(major as u32, minor as u32),
            cache,
            loaded: Mutex::new(HashMap::new()),
            outcomes: Mutex::new(Vec::new()),
        })
    }

    /// The device's architecture.
    pub fn arch(&self) -> GpuArch {
        self.arch
    }

    /// Where each loaded file's CUBIN came from (for a progress line).
    pub fn cache_outcomes(&self) -> Vec<(&'static str, CacheOutcome)> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn module(&self, source: &'static CudaSource) -> Result<Arc<CudaModule>, CudaError> {
        let mut loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(module) = loaded.get(source.file_name) {
            return Ok(module.clone());
        }
        let arch = self.arch;
        let compile_cubin = || compile(source, arch).map(|m| m.cubin);
        let (cubin, outcome) = match &self.cache {
            Some(cache) => cache.get_or_compile(source, arch, nvrtc_version()?, compile_cubin)?,
            None => (compile_cubin()?, CacheOutcome::Compiled),
        };
        let module = match self.ctx.load_module(Ptx::from_binary(cubin)) {
            Ok(module) => module,
            // A cached CUBIN the driver refuses (truncated, or from another driver): compile
            // afresh once, and overwrite the entry.
            Err(_) if outcome == CacheOutcome::Hit => {
                let cubin = compile_cubin()?;
                if let Some(cache) = &self.cache {
                    cache.replace(source, arch, nvrtc_version()?, &cubin);
                }
                self.ctx.load_module(Ptx::from_binary(cubin))?
            }
            Err(error) => return Err(error.into()),
        };
        loaded.insert(source.file_name, module.clone());
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((source.file_name, outcome));
        Ok(module)
    }

    /// The function `entry` of `spec` (which must be one of its entry points).
    pub fn function(&self, spec: &KernelSpec, entry: &str) -> Result<CudaFunction, CudaError> {
        if !spec.entry_points.contains(&entry) {
            return Err(CudaError::Shape(format!(
                "`{entry}` is not an entry point of kernel `{}`",
                spec.name
            )));
        }
        Ok(self.module(spec.source)?.load_function(entry)?)
    }
}
