//! Runs the ops of [`super::program`] on the GPU: [`DeviceBuffers`] holds one allocation per
//! [`Region`], and [`Executor::run`] turns each op into its kernel launches (bound to those
//! allocations through the launch table's descriptions, [`Launcher::launch_bound`]), a
//! [`Gemm`] call, a memset or a copy. **Needs a GPU**; nothing here is reached without one.
//!
//! Several tensors of one op can live in one region (a LayerNorm's input and output in the
//! activations, its weight and bias gradients in the gradients); [`carve`] hands out disjoint
//! mutable views of one allocation in safe code. The same bindings are checked on the host
//! for every op of the step ([`Op::check`]).

use crate::cuda::gemm::GemmElement;
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::program::Op;
use super::region::{Region, RegionSizes, TensorRef};
use crate::cuda::adamw::{AdamScalars, AdamSegment, Decay};
use crate::cuda::error::CudaError;
use crate::cuda::gemm::{Gemm, Pass};
use crate::cuda::launch::bind::{Allocation, RunValues, carve};
use crate::cuda::launch::{Launcher, Storage};
use crate::tensor::TensorTable;

/// Every allocation of a step.
#[derive(Debug)]
pub struct DeviceBuffers<T: Storage> {
    /// Parameters.
    pub params: CudaSlice<T>,
    /// Gradients.
    pub grads: CudaSlice<T>,
    /// Activations.
    pub activations: CudaSlice<T>,
    /// fp32 master weights (one unused element in f32 training).
    pub master: CudaSlice<f32>,
    /// Adam's first moment.
    pub exp_avg: CudaSlice<f32>,
    /// Adam's second moment.
    pub exp_avg_sq: CudaSlice<f32>,
    /// f32 statistics and losses.
    pub stats: CudaSlice<f32>,
    /// f32 partial sums.
    pub scratch: CudaSlice<f32>,
    /// Token ids.
    pub tokens: CudaSlice<u32>,
    /// Targets.
    pub targets: CudaSlice<i32>,
    /// Distinct tokens.
    pub bucket_tokens: CudaSlice<u32>,
    /// Group starts.
    pub bucket_starts: CudaSlice<i32>,
    /// Rows by token.
    pub bucket_rows: CudaSlice<i32>,
    /// Norm partials.
    pub norm_partials: CudaSlice<f64>,
    /// Norm total.
    pub norm_total: CudaSlice<f64>,
    /// Overflow flag.
    pub found_inf: CudaSlice<i32>,
    /// Adam's segments.
    pub segments: CudaSlice<AdamSegment>,
    /// Stage 3's reduce-scatter staging.
    pub reduce_staging: CudaSlice<T>,
    /// The all-gather's packed input.
    pub gather_in: CudaSlice<T>,
    /// The all-gather's output.
    pub gather_out: CudaSlice<T>,
    /// The same segments on the host.
    pub host_segments: Vec<AdamSegment>,
}

fn zeros<U: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<U>, CudaError> {
    // A zero-length allocation is refused by the driver; absent buffers hold one element.
    Ok(stream.alloc_zeros::<U>(len.max(1))?)
}

impl<T: Storage> DeviceBuffers<T> {
    /// Allocates every region of `layout` (zeroed) and uploads the whole model `params` (f32,
    /// in `param_table`'s flat order) as this rank holds it ([`RegionSizes::initial_params`],
    /// [`RegionSizes::initial_master`], one AdamW segment per tensor of what it owns,
    /// [`RegionSizes::adam_segments`]): the master copy as given, the model-dtype copy rounded.
    pub fn new(
        stream: &Arc<CudaStream>,
        layout: &dyn RegionSizes,
        param_table: &TensorTable,
        params: &[f32],
    ) -> Result<Self, CudaError> {
        if params.len() != param_table.total_len() {
            return Err(CudaError::Shape(format!(
                "{} initial parameters for a model of {}",
                params.len(),
                param_table.total_len()
            )));
        }
        let initial = layout.initial_params(params);
        let rounded: Vec<T> = initial.iter().map(|&x| T::from_f32(x)).collect();
        let host_segments: Vec<AdamSegment> = layout
            .adam_segments(param_table)
            .into_iter()
            .map(|(offset, len)| AdamSegment::new(offset, len, Decay::Apply))
            .collect();
        let len = |r| layout.region_len(r);
        Ok(Self {
            params: stream.clone_htod(&rounded)?,
            grads: zeros(stream, len(Region::Grads))?,
            activations: zeros(stream, len(Region::Step(CudaRegion::Activations)))?,
            master: if layout.trains_master() {
                stream.clone_htod(&layout.initial_master(params))?
            } else {
                zeros(stream, 0)?
            },
            exp_avg: zeros(stream, len(Region::ExpAvg))?,
            exp_avg_sq: zeros(stream, len(Region::ExpAvgSq))?,
            stats: zeros(stream, len(Region::Step(CudaRegion::Stats)))?,
            scratch: zeros(stream, len(Region::Step(CudaRegion::Scratch)))?,
            tokens: zeros(stream, len(Region::Step(CudaRegion::Tokens)))?,
            targets: zeros(stream, len(Region::Step(CudaRegion::Targets)))?,
            bucket_tokens: zeros(stream, len(Region::Step(CudaRegion::BucketTokens)))?,
            bucket_starts: zeros(stream, len(Region::Step(CudaRegion::BucketStarts)))?,
            bucket_rows: zeros(stream, len(Region::Step(CudaRegion::BucketRows)))?,
            norm_partials: zeros(stream, len(Region::Step(CudaRegion::NormPartials)))?,
            norm_total: zeros(stream, len(Region::Step(CudaRegion::NormTotal)))?,
            found_inf: zeros(stream, len(Region::Step(CudaRegion::FoundInf)))?,
            segments: {
                // The table is allocated whole (one entry per parameter tensor, as planned);
                // a rank's partition may need fewer, the AdamW op reads their prefix.
                let mut table = host_segments.clone();
                table.resize(
                    len(Region::Step(CudaRegion::Segments)).max(table.len()),
                    AdamSegment::new(0, 0, Decay::Apply),
                );
                stream.clone_htod(&table)?
            },
            host_segments,
            reduce_staging: zeros(stream, len(Region::ReduceStaging))?,
            gather_in: zeros(stream, len(Region::GatherIn))?,
            gather_out: zeros(stream, len(Region::GatherOut))?,
        })
    }
}

/// The values an op needs at run time that the op list does not fix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunScalars {
    /// The classifier's `dloss` (loss multiplier / targets).
    pub dloss: f32,
    /// The norm pass's multiplier (`1 / S`).
    pub inv_scale: f32,
    /// AdamW's scalars (set at the boundary).
    pub adam: Option<AdamScalars>,
    /// Distinct tokens of the current micro-batch.
    pub bucket_groups: usize,
}

impl<T: Storage> DeviceBuffers<T> {
    /// Every allocation as a launch binds it, in [`Region::ALL`] order (an argument's `at`,
    /// [`Op::bindings`]).
    fn allocations(&mut self) -> [&mut dyn Allocation; Region::ALL.len()] {
        [
            &mut self.params,
            &mut self.grads,
            &mut self.master,
            &mut self.exp_avg,
            &mut self.exp_avg_sq,
            &mut self.activations,
            &mut self.stats,
            &mut self.scratch,
            &mut self.tokens,
            &mut self.targets,
            &mut self.bucket_tokens,
            &mut self.bucket_starts,
            &mut self.bucket_rows,
            &mut self.norm_partials,
            &mut self.norm_total,
            &mut self.found_inf,
            &mut self.segments,
            &mut self.reduce_staging,
            &mut self.gather_in,
            &mut self.gather_out,
        ]
    }

    /// The uploaded AdamW segments lie inside the `n` parameters the op steps, and the op
    /// reads all of them (the kernel indexes by the segments).
    fn check_segments(&self, segments: &TensorRef, n: usize) -> Result<(), CudaError> {
        if segments.len() != self.host_segments.len() {
            return Err(CudaError::Shape(format!(
                "{} segments on the device, {} on the host",
                segments.len(),
                self.host_segments.len()
            )));
        }
        for segment in &self.host_segments {
            if segment.offset < 0 || segment.len < 0 || (segment.offset + segment.len) as usize > n
            {
                return Err(CudaError::Shape(format!(
                    "segment {segment:?} outside {n} parameters"
                )));
            }
        }
        Ok(())
    }
}

fn range(t: &TensorRef) -> std::ops::Range<usize> {
    t.span.offset..t.span.end()
}

fn shape_error(op: &Op) -> CudaError {
    CudaError::Shape(format!("{op:?}: operands in unexpected regions"))
}

/// Runs ops on one stream.
#[derive(Debug)]
pub struct Executor<'m> {
    /// Kernel launches.
    pub launcher: Launcher<'m>,
    /// Products.
    pub gemm: Gemm,
    /// LayerNorm epsilon.
    pub eps: f32,
}

impl Executor<'_> {
    /// Runs `op` on `bufs`: a memset, a copy or a product as itself, every other compute op
    /// as its kernels, each argument bound to the allocation of the operand its description
    /// names ([`Op::bindings`]).
    pub fn run<T: GemmElement>(
        &self,
        op: &Op,
        bufs: &mut DeviceBuffers<T>,
        scalars: &RunScalars,
    ) -> Result<(), CudaError> {
        let stream = self.launcher.stream();
        match op {
            Op::Zero { tensor } => {
                let r = range(tensor);
                match tensor.region {
                    Region::Grads => stream.memset_zeros(&mut bufs.grads.slice_mut(r))?,
                    Region::Step(CudaRegion::Activations) => {
                        stream.memset_zeros(&mut bufs.activations.slice_mut(r))?
                    }
                    Region::Step(CudaRegion::FoundInf) => {
                        stream.memset_zeros(&mut bufs.found_inf.slice_mut(r))?
                    }
                    _ => return Err(shape_error(op)),
                }
                Ok(())
            }
            Op::Copy { dst, src } => {
                carve(&mut bufs.activations, &[dst.span, src.span], |mut a| {
                    let [dst_v, src_v] = a.as_mut_slice() else {
                        return Err(shape_error(op));
                    };
                    stream.memcpy_dtod(&src_v.as_view(), dst_v)?;
                    Ok(())
                })
            }
            Op::Linear { .. } => self.product(op, bufs),
            Op::Host(_) => Err(CudaError::Shape(format!(
                "{op:?}: the device executor does not allocate the offloaded step's host \
                 buffers yet (the host interpreter runs them)"
            ))),
            Op::Collective(_) => Err(CudaError::Shape(format!(
                "{op:?}: communication runs through the device collectives, not the compute \
                 executor"
            ))),
            _ => {
                if let Op::AdamW {
                    master, segments, ..
                } = op
                {
                    bufs.check_segments(segments, master.len())?;
                }
                let run = RunValues {
                    eps: self.eps,
                    dloss: scalars.dloss,
                    inv_scale: scalars.inv_scale,
                    adam: scalars.adam,
                };
                let bindings = op
                    .bindings(T::DTYPE, scalars.bucket_groups)
                    .map_err(|e| CudaError::Shape(format!("{op:?}: {e}")))?;
                for (call, slots) in bindings {
                    let mut allocations = bufs.allocations();
                    self.launcher
                        .launch_bound(&call, T::DTYPE, &slots, &mut allocations, &run)?;
                }
                Ok(())
            }
        }
    }

    /// A product: into the activations from an activation and a parameter (and its bias),
    /// or into a gradient from two activations.
    fn product<T: GemmElement>(
        &self,
        op: &Op,
        bufs: &mut DeviceBuffers<T>,
    ) -> Result<(), CudaError> {
        let Op::Linear {
            product,
            out,
            first,
            second,
            bias,
        } = op
        else {
            return Err(shape_error(op));
        };
        let DeviceBuffers {
            params,
            grads,
            activations,
            ..
        } = bufs;
        match product.pass {
            Pass::Forward | Pass::BackwardInput => {
                carve(activations, &[out.span, first.span], |mut a| {
                    let [out_v, first_v] = a.as_mut_slice() else {
                        return Err(shape_error(op));
                    };
                    let bias_v = bias.map(|b| params.slice(range(&b)));
                    self.gemm.run(
                        *product,
                        out_v,
                        &first_v.as_view(),
                        &params.slice(range(second)),
                        bias_v.as_ref(),
                    )
                })
            }
            Pass::BackwardWeight => self.gemm.run(
                *product,
                &mut grads.slice_mut(range(out)),
                &activations.slice(range(first)),
                &activations.slice(range(second)),
                None,
            ),
        }
    }
}
