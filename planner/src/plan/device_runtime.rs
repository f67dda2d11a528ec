//! [`DeviceRuntime`]: what dsplan's CUDA executor holds on a GPU outside its own allocations,
//! so that "it fits" means it fits on the device (what `nvidia-smi` shows), not only in the
//! buffers the plan lists.
//!
//! | part | bytes | source |
//! |---|---|---|
//! | CUDA context | 528.8 MiB | measured: the driver's used memory before the step's buffers, less the cuBLASLt workspace (H100 SXM and H200, driver 580.159.04, CUDA 13.0, 2026-11-27: 560.8 MiB in every one of 16 runs) |
//! | cuBLASLt workspace | 32 MiB | cudarc's `Workspace::new` on sm_90 and newer (4 MiB below), one handle a rank |
//! | kernel modules | 31.9 MiB | measured: what the driver added during the run beyond the step's buffers (the lazily loaded NVRTC and cuBLASLt modules; same runs) |
//! | NCCL buffers | 576 MiB at `W > 1` | an estimate, not yet measured (the lent machines had one GPU): 32 channels on an NVLink node × 2 ring connections × 9 MiB (NCCL_BUFFSIZE's 4 MiB for the simple protocol, about 4.5 MiB for LL128, 0.5 MiB for LL) |
//!
//! Thread ranks sharing one GPU add one context each and no NCCL; the plan describes one rank
//! per GPU.

use serde::Serialize;

/// MiB.
const MIB: u64 = 1 << 20;

/// The context's bytes as measured: 560.8 MiB of runtime less the 32 MiB workspace.
const CONTEXT_BYTES: u64 = 588_054_528 - WORKSPACE_SM90_BYTES;

/// cudarc's cuBLASLt workspace on sm_90 and newer (cuBLASLt's recommendation for Hopper).
const WORKSPACE_SM90_BYTES: u64 = 33_554_432;

/// The modules loaded during the measured runs: the driver's figure after the run, less the
/// runtime before it and the step's buffers (9,330,229,248 − 9,296,739,824).
const MODULE_BYTES: u64 = 33_489_424;

/// The NCCL estimate's terms.
const NCCL_CHANNELS: u64 = 32;
const NCCL_CONNECTIONS: u64 = 2;
const NCCL_BYTES_PER_CONNECTION: u64 = 9 * MIB;

/// Whether a figure was measured on a device or is an estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Basis {
    /// Measured on an H100 and an H200 (driver 580.159.04, CUDA 13.0).
    Measured,
    /// A model of the library's buffers, not yet measured.
    Estimated,
}

/// One part of the runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuntimePart {
    /// What it is.
    pub name: &'static str,
    /// Bytes on the device.
    pub bytes: u64,
    /// Where the figure comes from.
    pub basis: Basis,
}

/// What a rank holds on its GPU outside the plan's buffers; see the [module
/// documentation](self).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRuntime {
    /// Each part.
    pub parts: Vec<RuntimePart>,
    /// Their sum.
    pub bytes: u64,
}

impl DeviceRuntime {
    /// The runtime of one rank alone on its GPU, in a world of `world_size` ranks (NCCL's
    /// buffers from two ranks on).
    pub fn of_rank(world_size: u64) -> DeviceRuntime {
        let mut parts = vec![
            RuntimePart {
                name: "CUDA context",
                bytes: CONTEXT_BYTES,
                basis: Basis::Measured,
            },
            RuntimePart {
                name: "cuBLASLt workspace",
                bytes: WORKSPACE_SM90_BYTES,
                basis: Basis::Measured,
            },
            RuntimePart {
                name: "kernel modules",
                bytes: MODULE_BYTES,
                basis: Basis::Measured,
            },
        ];
        if world_size > 1 {
            parts.push(RuntimePart {
                name: "NCCL buffers",
                bytes: NCCL_CHANNELS * NCCL_CONNECTIONS * NCCL_BYTES_PER_CONNECTION,
                basis: Basis::Estimated,
            });
        }
        let bytes = parts.iter().map(|p| p.bytes).sum();
        DeviceRuntime { parts, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_gpu_adds_what_the_h200_measured_and_several_add_nccl() {
        let one = DeviceRuntime::of_rank(1);
        // The H200's driver figure (9,918,283,776) less its allocation (9,296,739,824).
        assert_eq!(one.bytes, 9_918_283_776 - 9_296_739_824);
        assert!(one.parts.iter().all(|p| p.basis == Basis::Measured));
        let eight = DeviceRuntime::of_rank(8);
        let nccl = eight.bytes - one.bytes;
        assert_eq!(nccl, 576 * MIB);
        assert_eq!(eight.parts.last().map(|p| p.basis), Some(Basis::Estimated));
    }
}
