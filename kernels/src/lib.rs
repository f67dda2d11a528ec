//! dsplan's CUDA C kernels, embedded as sources and compiled at run time with NVRTC.
//!
//! * [`source`]: the `.cu` files (`kernels/cu/`), embedded with `include_str!`, and the shared
//!   prelude (`common.cuh`) every file is compiled with.
//! * [`registry`]: [`KERNELS`], one [`KernelSpec`] per kernel: its file, entry points, launch
//!   shape, the CPU function it must match and the storage types it is instantiated for.
//! * [`launch`]: launch-shape rules turned into grid and block sizes for a problem size.
//! * [`nvrtc`]: compiles a source for one GPU architecture (PTX and CUBIN) through NVRTC,
//!   loaded dynamically: nothing CUDA is needed to build this crate, and a missing
//!   `libnvrtc` is an error value, not a panic.
//! * [`cache`]: an on-disk cache of compiled CUBINs, keyed by source, architecture, options and
//!   NVRTC version.
//! * [`scan`]: reads `__global__` names and `#define` constants out of a source, so tests can
//!   hold the registry and the sources to each other.
//!
//! Nothing here touches the CUDA driver; loading and launching live in `dsplan-executor`'s
//! `cuda` module.

pub mod cache;
pub mod launch;
pub mod nvrtc;
pub mod registry;
pub mod scan;
pub mod source;

pub use launch::{LaunchDims, LaunchError, LaunchRule, Work};
pub use nvrtc::{CompiledModule, GpuArch, NvrtcError, compile, nvrtc_available};
pub use registry::{Dtype, KERNELS, KernelSpec, kernel};
pub use source::{CudaSource, PRELUDE, SOURCES};
