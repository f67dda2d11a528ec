//! [`HostBuffers`]: one host vector per [`Region`] of a step, sized and filled exactly as
//! `super::super::execute::DeviceBuffers` allocates and uploads the device's (the same
//! [`RegionSizes`] lengths, an absent region one element long, the same initial parameters,
//! master and AdamW segment table), so a [`TensorRef`] of the program names the same elements
//! here as on the GPU.
//!
//! A 16-bit model's regions hold `f32` values that are always representable in the model
//! dtype: every store into a model-dtype region is rounded to nearest even
//! ([`ModelRounding`]), as the kernels' `from_float<T>` and the upload's cast round it, so a
//! read is the device's widening of its 16-bit element (exact). Arithmetic between stores is
//! f32 (f64 for the products), as the kernels accumulate in f32.

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::HostError;
use crate::cuda::adamw::{AdamSegment, Decay};
use crate::cuda::element::Element;
use crate::cuda::train::region::{HostRegion, Region, RegionSizes, TensorRef};
use crate::tensor::TensorTable;

/// One region's elements.
#[derive(Debug, Clone, PartialEq)]
enum Values {
    /// Model-dtype (f32 here) and f32 regions.
    F32(Vec<f32>),
    /// The norm's partials and total.
    F64(Vec<f64>),
    /// Token ids and distinct tokens.
    U32(Vec<u32>),
    /// Targets, bucket starts and rows, the overflow flag.
    I32(Vec<i32>),
    /// AdamW's segment table.
    Segments(Vec<AdamSegment>),
}

/// How a store into a model-dtype region is rounded: the device's 16-bit element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelRounding {
    /// An f32 model: stored as computed.
    Exact,
    /// bfloat16, round to nearest even.
    Bf16,
    /// IEEE half, round to nearest even (overflow to infinity).
    F16,
}

impl ModelRounding {
    /// The rounding of a model stored in `dtype` (f64 is no model dtype).
    pub fn of(dtype: Dtype) -> Result<Self, HostError> {
        match dtype {
            Dtype::F32 => Ok(Self::Exact),
            Dtype::Bf16 => Ok(Self::Bf16),
            Dtype::F16 => Ok(Self::F16),
            Dtype::F64 => Err(HostError(
                "a model stored in f64: the device stores models in f32, bf16 or f16".into(),
            )),
        }
    }

    /// `values` rounded in place to the model dtype.
    pub fn apply(self, values: &mut [f32]) {
        match self {
            Self::Exact => {}
            Self::Bf16 => values
                .iter_mut()
                .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
            Self::F16 => values
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
        }
    }
}

/// Every region of a step on the host, [`Region::ALL`] order, and the offloaded step's host
/// buffers, [`HostRegion::ALL`] order.
#[derive(Debug, Clone)]
pub struct HostBuffers {
    regions: Vec<Values>,
    host: Vec<Values>,
    rounding: ModelRounding,
}

/// What an element type is called in errors.
fn kind(values: &Values) -> &'static str {
    match values {
        Values::F32(_) => "f32",
        Values::F64(_) => "f64",
        Values::U32(_) => "u32",
        Values::I32(_) => "i32",
        Values::Segments(_) => "AdamSegment",
    }
}

fn span_of<T>(data: &[T], t: &TensorRef) -> Result<std::ops::Range<usize>, HostError> {
    let range = t.span.offset..t.span.end();
    if range.end > data.len() {
        return Err(HostError(format!(
            "{:?} {}..{} is past the end of its region ({} elements)",
            t.region,
            range.start,
            range.end,
            data.len()
        )));
    }
    Ok(range)
}

macro_rules! typed_access {
    ($get:ident, $get_mut:ident, $variant:ident, $ty:ty, $what:literal) => {
        /// The elements of `t` (a region of this element type).
        pub fn $get(&self, t: &TensorRef) -> Result<&[$ty], HostError> {
            match self.values(t.region) {
                Values::$variant(data) => Ok(&data[span_of(data, t)?]),
                other => Err(HostError(format!(
                    "{:?} holds {} elements, the op reads it as {}",
                    t.region,
                    kind(other),
                    $what
                ))),
            }
        }

        /// The elements of `t`, to be written.
        pub fn $get_mut(&mut self, t: &TensorRef) -> Result<&mut [$ty], HostError> {
            match self.values_mut(t.region) {
                Values::$variant(data) => {
                    let range = span_of(data, t)?;
                    Ok(&mut data[range])
                }
                other => Err(HostError(format!(
                    "{:?} holds {} elements, the op writes it as {}",
                    t.region,
                    kind(other),
                    $what
                ))),
            }
        }
    };
}

impl HostBuffers {
    /// Every region of `layout` (zeroed), the whole model `params` (f32, `param_table`'s flat
    /// order) placed as the rank holds it ([`RegionSizes::initial_params`],
    /// [`RegionSizes::initial_master`]) and one AdamW segment per piece it owns
    /// ([`RegionSizes::adam_segments`], weight decay on every one, as the device's table):
    /// what `DeviceBuffers::new` uploads (the parameters rounded to the model `dtype`).
    pub fn new(
        layout: &dyn RegionSizes,
        dtype: Dtype,
        param_table: &TensorTable,
        params: &[f32],
    ) -> Result<Self, HostError> {
        let rounding = ModelRounding::of(dtype)?;
        let offloads = layout.region_len(Region::Host(HostRegion::Master)) > 0;
        if params.len() != param_table.total_len() {
            return Err(HostError(format!(
                "{} initial parameters for a model of {}",
                params.len(),
                param_table.total_len()
            )));
        }
        let segments: Vec<AdamSegment> = layout
            .adam_segments(param_table)
            .into_iter()
            .map(|(offset, len)| AdamSegment::new(offset, len, Decay::Apply))
            .collect();
        let regions = Region::ALL
            .iter()
            .chain(&HostRegion::ALL.map(Region::Host))
            .map(|&region| {
                // A zero-length allocation is refused by the driver; absent buffers hold one
                // element, as on the device.
                let len = layout.region_len(region).max(1);
                match region {
                    // The host's buffers exist under offload only.
                    Region::Host(_) if !offloads => Values::F32(Vec::new()),
                    Region::Params => {
                        let mut initial = layout.initial_params(params);
                        rounding.apply(&mut initial);
                        Values::F32(initial)
                    }
                    Region::Master if layout.trains_master() => {
                        Values::F32(layout.initial_master(params))
                    }
                    Region::Host(HostRegion::Master) => {
                        Values::F32(layout.initial_host_master(params))
                    }
                    Region::Step(CudaRegion::Segments) | Region::Host(HostRegion::Segments) => {
                        let mut table = segments.clone();
                        table.resize(len.max(table.len()), AdamSegment::new(0, 0, Decay::Apply));
                        Values::Segments(table)
                    }
                    _ => match region.element() {
                        Element::Model | Element::F32 => Values::F32(vec![0.0; len]),
                        Element::F64 => Values::F64(vec![0.0; len]),
                        Element::U32 => Values::U32(vec![0; len]),
                        Element::I32 => Values::I32(vec![0; len]),
                        Element::AdamSegment => {
                            Values::Segments(vec![AdamSegment::new(0, 0, Decay::Apply); len])
                        }
                    },
                }
            })
            .collect::<Vec<_>>();
        let (regions, host) = {
            let mut regions = regions;
            let host = regions.split_off(Region::ALL.len());
            (regions, host)
        };
        Ok(Self {
            regions,
            host,
            rounding,
        })
    }

    /// The elements of `region`.
    fn values(&self, region: Region) -> &Values {
        match region {
            Region::Host(host) => &self.host[host.index()],
            device => &self.regions[device.index()],
        }
    }

    /// The elements of `region`, to be written.
    fn values_mut(&mut self, region: Region) -> &mut Values {
        match region {
            Region::Host(host) => &mut self.host[host.index()],
            device => &mut self.regions[device.index()],
        }
    }

    /// Rounds the elements of `t` as the device stores them (nothing outside the model-dtype
    /// regions): after an op that wrote `t` through [`Self::f32s_mut`].
    pub fn round_stored(&mut self, t: &TensorRef) -> Result<(), HostError> {
        if t.region.element() == Element::Model && self.rounding != ModelRounding::Exact {
            let rounding = self.rounding;
            rounding.apply(self.f32s_mut(t)?);
        }
        Ok(())
    }

    /// Elements `region` holds.
    pub fn len(&self, region: Region) -> usize {
        match self.values(region) {
            Values::F32(v) => v.len(),
            Values::F64(v) => v.len(),
            Values::U32(v) => v.len(),
            Values::I32(v) => v.len(),
            Values::Segments(v) => v.len(),
        }
    }

    /// Whether `region` holds no elements (never: an absent region holds one).
    pub fn is_empty(&self, region: Region) -> bool {
        self.len(region) == 0
    }

    /// `region` whole.
    pub fn whole(&self, region: Region) -> TensorRef {
        crate::cuda::train::region::whole(region, self.len(region))
    }

    typed_access!(f32s, f32s_mut, F32, f32, "f32");
    typed_access!(f64s, f64s_mut, F64, f64, "f64");
    typed_access!(u32s, u32s_mut, U32, u32, "u32");
    typed_access!(i32s, i32s_mut, I32, i32, "i32");
    typed_access!(segments, segments_mut, Segments, AdamSegment, "AdamSegment");

    /// A copy of the f32 elements of `t` (an op's input, read before it writes).
    pub fn read(&self, t: &TensorRef) -> Result<Vec<f32>, HostError> {
        Ok(self.f32s(t)?.to_vec())
    }

    /// Writes `values` into `t` (same length), rounded as the device stores them.
    pub fn write(&mut self, t: &TensorRef, values: &[f32]) -> Result<(), HostError> {
        let slot = self.f32s_mut(t)?;
        if slot.len() != values.len() {
            return Err(HostError(format!(
                "{} values for {:?} of {} elements",
                values.len(),
                t.region,
                slot.len()
            )));
        }
        slot.copy_from_slice(values);
        self.round_stored(t)
    }

    /// Copies `values` to the start of `region` (a batch upload: `values` must fit).
    pub fn upload_u32(&mut self, region: Region, values: &[u32]) -> Result<(), HostError> {
        let at = crate::cuda::train::region::whole(region, values.len());
        self.u32s_mut(&at)?.copy_from_slice(values);
        Ok(())
    }

    /// Copies `values` to the start of `region` (a batch upload: `values` must fit).
    pub fn upload_i32(&mut self, region: Region, values: &[i32]) -> Result<(), HostError> {
        let at = crate::cuda::train::region::whole(region, values.len());
        self.i32s_mut(&at)?.copy_from_slice(values);
        Ok(())
    }
}
