//! The CUDA backend: device discovery and the `--device` decision, NVRTC-compiled kernels
//! (from `dsplan-kernels`) launched over cudarc, cuBLASLt GEMMs, and NCCL set up from the
//! launcher's environment.
//!
//! Everything loads CUDA libraries at run time (cudarc's dynamic loading), so the binary builds
//! and runs where no CUDA is installed. **Call [`device::choose_backend`] (or
//! [`device::probe`]) before anything else here**: cudarc panics when `libcuda` is missing and
//! a driver call is made; the probe checks first.
//!
//! | module | job | runs without a GPU |
//! |---|---|---|
//! | [`device`] | probe the driver, resolve `--device cpu\|cuda\|auto` | yes (the no-driver and stub-driver paths are tested) |
//! | [`rendezvous`] | hand rank 0's NCCL id to every rank over TCP | yes (loopback tests) |
//! | [`element`] | a device buffer's element types, and the span of a strided block | yes |
//! | [`encoder_buckets`] | group rows by token for the deterministic embedding backward | yes |
//! | [`adamw`] | the fused AdamW kernel's scalars and segments | yes (its arithmetic is replayed against `adam_step`) |
//! | [`modules`] | compile (or fetch from the disk cache) and load kernel files per device | needs a GPU |
//! | [`launch`] | typed, shape-checked launches of every registered kernel | needs a GPU |
//! | [`check`] | `dsplan report --check`: every kernel and one training step against the CPU, as rows of measured errors | rows and verdicts yes; running needs a GPU |
//! | [`inventory`] | what the machine offers: driver, CUDA libraries, GPUs, CPU SIMD, MPI, kernel cache (`dsplan report`) | yes |
//! | [`gemm`] | cuBLASLt products with fused bias | needs a GPU |
//! | [`nccl`] | NCCL collectives (device and host-staged; the `Comm` trait) | needs a GPU |
//! | [`device_comm`] | the step's collectives on device buffers: NCCL, or any host `Comm` staged through the host | the host half yes; the copies need a GPU |
//! | [`id_broadcast`] | NCCL's unique id over a host `Comm` (MPI under `mpirun`) | yes |
//! | [`train`] | the device training step: buffers, op lists, executor, runs | layouts and op lists yes; running needs a GPU |

pub mod adamw;
pub mod check;
pub mod device;
pub mod device_comm;
pub mod element;
pub mod encoder_buckets;
mod error;
pub mod gemm;
pub mod id_broadcast;
pub mod inventory;
pub mod launch;
pub mod modules;
pub mod nccl;
pub mod rendezvous;
pub mod train;

/// The launcher's environment now lives in [`crate::launch`] (CPU processes read it too).
pub use crate::launch::{LaunchEnv, LaunchEnvError};
pub use device::{
    Backend, BackendChoice, CudaAvailability, CudaDeviceInfo, DeviceChoice, DeviceError,
    choose_backend, probe, resolve_backend,
};
pub use error::CudaError;
