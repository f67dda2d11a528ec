//! [`HostOp`]: the ops of ZeRO-Offload's step (issue 30) that touch host memory: the copies
//! between the device and the host's buffers ([`crate::cuda::train::region::HostRegion`]) and
//! the host optimizer's AdamW. They run on the host's side of the link, not as kernels:
//! [`super::Op::launches`] lists a `memcpy` per copy between device and host and nothing for
//! the host's own work.

use super::{Access, ShapeError, expect};
use crate::cuda::element::Element;
use crate::cuda::train::region::{HostRegion, Region, TensorRef};

/// Which way a [`HostOp::Copy`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Device → host: a gradient share to the host's staging (the copy stream).
    ToHost,
    /// Host → device: the updated parameters.
    ToDevice,
    /// Within the host: the speculative step's state saved or restored.
    WithinHost,
}

/// The host buffer of each of [`HostOp::AdamW`]'s operands, in [`HostOp::operands_mut`]'s
/// order.
const ADAMW_REGIONS: [HostRegion; 5] = [
    HostRegion::Master,
    HostRegion::Grads,
    HostRegion::ExpAvg,
    HostRegion::ExpAvgSq,
    HostRegion::Segments,
];

/// One host-side op of an offloaded step.
#[derive(Debug, Clone, PartialEq)]
pub enum HostOp {
    /// `dst = src`, between the device and the host or within the host (a store into a
    /// model-dtype buffer is rounded to the model dtype, as the host's 16-bit copy-out is).
    Copy {
        /// Destination.
        dst: TensorRef,
        /// Source, as long.
        src: TensorRef,
    },
    /// The host optimizer's AdamW over host buffers, with the fused kernel's arithmetic
    /// (`adamw_element`) and scalars (unscale times clip coefficient).
    AdamW {
        /// fp32 master (host).
        master: TensorRef,
        /// Model-dtype gradients (host staging).
        grads: TensorRef,
        /// First moment (host).
        exp_avg: TensorRef,
        /// Second moment (host).
        exp_avg_sq: TensorRef,
        /// The segment table (host).
        segments: TensorRef,
    },
}

impl HostOp {
    /// Which way a copy goes (`None` for the optimizer, or a copy within the device, which a
    /// host op never is).
    pub fn direction(&self) -> Option<Direction> {
        let HostOp::Copy { dst, src } = self else {
            return None;
        };
        match (src.is_host(), dst.is_host()) {
            (false, true) => Some(Direction::ToHost),
            (true, false) => Some(Direction::ToDevice),
            (true, true) => Some(Direction::WithinHost),
            (false, false) => None,
        }
    }

    /// Its operands under their names, each to be moved, with whether it writes them.
    pub(super) fn operands_mut(&mut self) -> Vec<(&'static str, &mut TensorRef, Access)> {
        use Access::{Read, Write};
        match self {
            HostOp::Copy { dst, src } => vec![("dst", dst, Write), ("src", src, Read)],
            HostOp::AdamW {
                master,
                grads,
                exp_avg,
                exp_avg_sq,
                segments,
            } => vec![
                ("master", master, Write),
                ("grads", grads, Read),
                ("exp_avg", exp_avg, Write),
                ("exp_avg_sq", exp_avg_sq, Write),
                ("segments", segments, Read),
            ],
        }
    }

    /// Its shape rules: a copy of one length with a host side, between f32 or model-dtype
    /// buffers; the optimizer's operands in their host buffers, views of one length.
    pub(super) fn check_shapes(&self) -> Result<(), ShapeError> {
        match self {
            HostOp::Copy { dst, src } => {
                if self.direction().is_none() {
                    return Err(ShapeError(format!(
                        "a host copy from {:?} to {:?}, neither on the host",
                        src.region, dst.region
                    )));
                }
                for t in [dst, src] {
                    if !matches!(t.region.element(), Element::F32 | Element::Model) {
                        return Err(ShapeError(format!(
                            "a host copy of {:?}, which holds no parameters or gradients",
                            t.region
                        )));
                    }
                }
                expect("dst", dst, src.len())
            }
            HostOp::AdamW { master, .. } => {
                // Every operand in its host buffer, each but the segment table as long as
                // the master.
                let n = master.len();
                let mut op = self.clone();
                for ((what, tensor, _), host) in op.operands_mut().into_iter().zip(ADAMW_REGIONS) {
                    if tensor.region != Region::Host(host) {
                        return Err(ShapeError(format!(
                            "the host AdamW reads {:?} where it takes {:?}",
                            tensor.region,
                            Region::Host(host)
                        )));
                    }
                    if host != HostRegion::Segments {
                        expect(what, tensor, n)?;
                    }
                }
                Ok(())
            }
        }
    }

    /// The library calls it makes on the device's side: a copy across the link is one
    /// `memcpy`; the host's own work makes none.
    pub(super) fn library_calls(&self) -> usize {
        match self.direction() {
            Some(Direction::ToHost | Direction::ToDevice) => 1,
            _ => 0,
        }
    }
}
