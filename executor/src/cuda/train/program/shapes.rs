//! [`Op::check`]: the layout's bounds and aliasing rules, then the launcher's shape rules
//! applied to an op's operands ([`Op::check_shapes`]), before anything runs. A kernel op's
//! shapes are not written again here: its operands are bound to the arguments of the kernels
//! it launches ([`Op::kernel_calls`]) exactly as the device binds them, and each must be what
//! the argument's description asks (element type, length, written or read).

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::{Access, Op, ShapeError, expect, expect_strided};
use crate::cuda::element::Element;
use crate::cuda::gemm::{Operand, Pass};
use crate::cuda::launch::bind::resolve;
use crate::cuda::train::region::{Region, RegionSizes, TensorRef};

const ACTIVATIONS: Region = Region::Step(CudaRegion::Activations);

impl Op {
    /// The launcher's shape rules on the op's spans, and the layout's bounds: every tensor
    /// inside its region, written tensors disjoint from every other tensor of the op.
    pub fn check(&self, layout: &impl RegionSizes) -> Result<(), ShapeError> {
        let tensors = self.tensors();
        for (tensor, _) in &tensors {
            if tensor.span.end() > layout.region_len(tensor.region) {
                return Err(ShapeError(format!(
                    "{tensor:?} lies outside its region of {} elements",
                    layout.region_len(tensor.region)
                )));
            }
        }
        for (i, (a, a_access)) in tensors.iter().enumerate() {
            for (b, b_access) in &tensors[i + 1..] {
                let written = *a_access == Access::Write || *b_access == Access::Write;
                if written && a.overlaps(b) {
                    return Err(ShapeError(format!(
                        "{a:?} overlaps {b:?}, and one of them is written"
                    )));
                }
            }
        }
        self.check_shapes()
    }

    /// The op's shape rules: a memset of a region the executors zero, a copy between two
    /// activations of one length, a product's operands as its plan needs them (and in the
    /// regions the executor reads them from), a collective's own rules, and for every other op
    /// each operand bound to the arguments of its kernels ([`Op::kernel_calls`]) as the device
    /// binds it ([`resolve`]): of the argument's element type and the length the shape needs,
    /// every operand bound by some argument, and written by the op where and only where a
    /// kernel writes it.
    pub fn check_shapes(&self) -> Result<(), ShapeError> {
        match self {
            Op::Zero { tensor } => match tensor.region {
                Region::Grads | ACTIVATIONS | Region::Step(CudaRegion::FoundInf) => Ok(()),
                other => Err(ShapeError(format!(
                    "a memset of {other:?}, which the executors do not zero"
                ))),
            },
            Op::Copy { dst, src } => {
                if (dst.region, src.region) != (ACTIVATIONS, ACTIVATIONS) {
                    return Err(ShapeError(format!(
                        "a copy from {:?} to {:?}, not within the activations",
                        src.region, dst.region
                    )));
                }
                expect("dst", dst, src.len())
            }
            Op::Linear {
                product,
                out,
                first,
                second,
                bias,
            } => {
                let (p, g) = (Region::Params, Region::Grads);
                let regions = match product.pass {
                    Pass::Forward | Pass::BackwardInput => [ACTIVATIONS, ACTIVATIONS, p],
                    Pass::BackwardWeight => [g, ACTIVATIONS, ACTIVATIONS],
                };
                let found = [out.region, first.region, second.region];
                if found != regions || bias.is_some_and(|b| b.region != p) {
                    return Err(ShapeError(format!(
                        "a {:?} product's operands live in {found:?} (bias {:?}), the executor \
                         reads them from {regions:?} (bias {p:?})",
                        product.pass,
                        bias.map(|b| b.region)
                    )));
                }
                let plan = product.plan();
                let [a, b, c] = plan.operands;
                let (first_shape, second_shape) = if plan.second_is_a { (b, a) } else { (a, b) };
                operand(out, c)?;
                operand(first, first_shape)?;
                operand(second, second_shape)?;
                match (bias, product.pass) {
                    (None, _) => Ok(()),
                    (Some(bias), Pass::Forward) => expect("bias", bias, product.dims.2),
                    (Some(_), _) => Err(ShapeError(format!(
                        "a {:?} product takes no bias",
                        product.pass
                    ))),
                }
            }
            Op::Collective(comm) => comm.check_shapes(),
            Op::Host(host) => host.check_shapes(),
            _ => self.check_bindings(),
        }
    }

    /// Every operand bound to the arguments of the op's kernels (checked in f32: the shapes do
    /// not depend on the dtype).
    fn check_bindings(&self) -> Result<(), ShapeError> {
        let operands = self.operands();
        let named: Vec<(&'static str, usize)> =
            operands.iter().map(|o| (o.name, o.tensor.len())).collect();
        let mut bound = vec![None; operands.len()];
        for call in self.kernel_calls(Dtype::F32, self.largest_groups())? {
            let slots = resolve(&call, &named).map_err(|e| ShapeError(e.to_string()))?;
            for slot in slots.into_iter().flatten() {
                let operand = &operands[slot.at];
                let region = operand.tensor.region.element();
                // f32 training keeps no master copy: AdamW steps the parameters themselves.
                let own_master = matches!(
                    self,
                    Op::AdamW {
                        params_out: None,
                        ..
                    }
                ) && operand.name == "master"
                    && region == Element::Model;
                if region != slot.element && !(own_master && slot.element == Element::F32) {
                    return Err(ShapeError(format!(
                        "{}: `{}` lives in {:?} ({region:?} elements), the kernel takes {:?}",
                        call.entry_point, operand.name, operand.tensor.region, slot.element
                    )));
                }
                let written = bound[slot.at].unwrap_or(Access::Read);
                bound[slot.at] = Some(match slot.access {
                    Access::Write => Access::Write,
                    Access::Read => written,
                });
            }
        }
        for (operand, bound) in operands.iter().zip(bound) {
            match bound {
                None => {
                    return Err(ShapeError(format!(
                        "`{}` is bound by none of the op's kernels",
                        operand.name
                    )));
                }
                Some(access) if access != operand.access => {
                    return Err(ShapeError(format!(
                        "`{}` is {access:?} by the op's kernels, the op says {:?}",
                        operand.name, operand.access
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// `tensor` spans exactly the product operand `shape`.
fn operand(tensor: &TensorRef, shape: Operand) -> Result<(), ShapeError> {
    expect_strided(shape.name, tensor, (shape.rows, shape.cols, shape.stride))
}
