//! [`Dtype`]: the element types a plan's buffers hold (floating point for states, integers for
//! token ids, bytes for dropout masks), and [`Device`]: where a buffer lives.

use serde::Serialize;

use crate::config::{CommDataType, DtypeName};

/// An element type of a planned buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit IEEE float.
    Fp32,
    /// 16-bit IEEE half precision.
    Fp16,
    /// bfloat16.
    Bf16,
    /// 64-bit integer (token ids and labels).
    Int64,
    /// One byte (dropout masks, opaque structs).
    Uint8,
    /// 64-bit float (the `dsplan-cuda` step's gradient norm sums).
    Fp64,
    /// 32-bit signed integer (the `dsplan-cuda` step's targets, indices and flags).
    Int32,
    /// 32-bit unsigned integer (the `dsplan-cuda` step's token ids).
    Uint32,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Fp32 => 4,
            Dtype::Fp16 | Dtype::Bf16 => 2,
            Dtype::Int64 | Dtype::Fp64 => 8,
            Dtype::Uint8 => 1,
            Dtype::Int32 | Dtype::Uint32 => 4,
        }
    }

    /// The short name (`fp32`, `fp16`, `bf16`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Fp32 => "fp32",
            Dtype::Fp16 => "fp16",
            Dtype::Bf16 => "bf16",
            Dtype::Int64 => "int64",
            Dtype::Uint8 => "uint8",
            Dtype::Fp64 => "fp64",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
        }
    }

    /// The dtype a config's dtype name stands for; `None` for `int8` (not a training dtype).
    pub fn from_name(name: DtypeName) -> Option<Dtype> {
        match name {
            DtypeName::Fp32 => Some(Dtype::Fp32),
            DtypeName::Fp16 => Some(Dtype::Fp16),
            DtypeName::Bf16 => Some(Dtype::Bf16),
            DtypeName::Int8 => None,
        }
    }

    /// The dtype of `communication_data_type`.
    pub fn from_comm(comm: CommDataType) -> Dtype {
        match comm {
            CommDataType::Fp32 => Dtype::Fp32,
            CommDataType::Fp16 => Dtype::Fp16,
            CommDataType::Bf16 => Dtype::Bf16,
        }
    }
}

/// Where a buffer lives, or which side of a copy it is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The rank's GPU memory.
    Gpu,
    /// Host memory of the rank's node (pinned or pageable, see the buffer).
    Cpu,
    /// Files on the node's NVMe drive.
    Nvme,
}

impl Device {
    /// Every device, in display order.
    pub const ALL: [Device; 3] = [Device::Gpu, Device::Cpu, Device::Nvme];

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Gpu => "gpu",
            Device::Cpu => "cpu",
            Device::Nvme => "nvme",
        }
    }
}
