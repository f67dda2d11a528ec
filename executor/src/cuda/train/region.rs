//! The ground floor of the step's buffers: [`Region`] (one device allocation), [`TensorRef`]
//! (a span of one), [`RegionLengths`] and [`RegionSizes`] (elements per region), and the
//! planner's named tensors per region ([`Tables`]). The op vocabulary, the families, the layout
//! and both interpreters stand on these.

use std::collections::BTreeMap;

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::{self, CudaElement, CudaRegion, CudaTensor};

use crate::cuda::element::Element;
use crate::metrics::{ByCategory, Category};
use crate::tensor::{Span, TensorTable};

/// One device allocation of the step: a model state, or one of the planner's step regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// Parameters in the model dtype.
    Params,
    /// Gradients in the model dtype.
    Grads,
    /// fp32 master weights (16-bit training).
    Master,
    /// Adam's first moment.
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// A region the planner's `cuda_layout` sizes (activations, statistics, scratch, the
    /// batch, the step's norm and segment table).
    Step(CudaRegion),
    /// Stage 3 (W > 1): a bucket packed rank by rank for its reduce-scatter.
    ReduceStaging,
    /// The all-gather's packed input (stage 3's slices of a fetch; a sharded stage-1/2 piece).
    GatherIn,
    /// The all-gather's output (`W ×` its input), unpacked into the parameters.
    GatherOut,
    /// A host buffer of ZeRO-Offload ([`HostRegion`]): not a device allocation, so not in
    /// [`Region::ALL`].
    Host(HostRegion),
}

/// A host buffer of an offloaded step (the plan's `cuda_offload::host` buffers): the rank's
/// owned optimizer state, its gradient staging, and the speculative step's saved state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostRegion {
    /// fp32 master weights of the owned range (the fp32 parameters themselves in f32 training).
    Master,
    /// Adam's first moment.
    ExpAvg,
    /// Adam's second moment.
    ExpAvgSq,
    /// The owned gradients in the model dtype, copied from the device after the norm pass.
    Grads,
    /// The host AdamW's segment table (the device's, kept on the host).
    Segments,
    /// The speculative step's saved master.
    SavedMaster,
    /// The speculative step's saved first moment.
    SavedExpAvg,
    /// The speculative step's saved second moment.
    SavedExpAvgSq,
}

impl HostRegion {
    /// Every host region.
    pub const ALL: [HostRegion; 8] = [
        HostRegion::Master,
        HostRegion::ExpAvg,
        HostRegion::ExpAvgSq,
        HostRegion::Grads,
        HostRegion::Segments,
        HostRegion::SavedMaster,
        HostRegion::SavedExpAvg,
        HostRegion::SavedExpAvgSq,
    ];

    /// Its place in [`HostRegion::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl Region {
    /// Every region, in allocation order: the model states, then the planner's regions.
    pub const ALL: [Region; 20] = [
        Region::Params,
        Region::Grads,
        Region::Master,
        Region::ExpAvg,
        Region::ExpAvgSq,
        Region::Step(CudaRegion::Activations),
        Region::Step(CudaRegion::Stats),
        Region::Step(CudaRegion::Scratch),
        Region::Step(CudaRegion::Tokens),
        Region::Step(CudaRegion::Targets),
        Region::Step(CudaRegion::BucketTokens),
        Region::Step(CudaRegion::BucketStarts),
        Region::Step(CudaRegion::BucketRows),
        Region::Step(CudaRegion::NormPartials),
        Region::Step(CudaRegion::NormTotal),
        Region::Step(CudaRegion::FoundInf),
        Region::Step(CudaRegion::Segments),
        Region::ReduceStaging,
        Region::GatherIn,
        Region::GatherOut,
    ];

    /// Its place in [`Region::ALL`] (the one list of allocations: the device's and the host
    /// interpreter's buffers are kept in this order).
    pub fn index(self) -> usize {
        Region::ALL
            .iter()
            .position(|r| *r == self)
            .unwrap_or(Region::ALL.len())
    }

    /// What the region's elements are (the planner's, [`cuda_layout::CudaRegion::element`],
    /// for all but the model states).
    pub fn element(self) -> Element {
        match self {
            Region::Params
            | Region::Grads
            | Region::ReduceStaging
            | Region::GatherIn
            | Region::GatherOut => Element::Model,
            Region::Master | Region::ExpAvg | Region::ExpAvgSq => Element::F32,
            Region::Host(HostRegion::Grads) => Element::Model,
            Region::Host(HostRegion::Segments) => Element::AdamSegment,
            Region::Host(_) => Element::F32,
            Region::Step(region) => match region.element() {
                CudaElement::Model => Element::Model,
                CudaElement::F32 => Element::F32,
                CudaElement::F64 => Element::F64,
                CudaElement::U32 => Element::U32,
                CudaElement::I32 => Element::I32,
                CudaElement::AdamSegment => Element::AdamSegment,
            },
        }
    }

    /// The memory category its bytes count in.
    pub fn category(self) -> Category {
        match self {
            Region::Params => Category::Params,
            Region::Grads => Category::Grads,
            Region::ReduceStaging | Region::GatherIn | Region::GatherOut => Category::Buckets,
            Region::Master | Region::Host(HostRegion::Master | HostRegion::SavedMaster) => {
                Category::Master
            }
            Region::Host(HostRegion::Grads) => Category::Grads,
            Region::Host(HostRegion::Segments) => Category::StepScratch,
            Region::ExpAvg | Region::ExpAvgSq | Region::Host(_) => Category::Optimizer,
            Region::Step(
                CudaRegion::NormPartials
                | CudaRegion::NormTotal
                | CudaRegion::FoundInf
                | CudaRegion::Segments,
            ) => Category::StepScratch,
            Region::Step(_) => Category::Activations,
        }
    }
}

/// A tensor on the device: a span of one region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorRef {
    /// The region.
    pub region: Region,
    /// Where in it.
    pub span: Span,
}

impl TensorRef {
    /// Elements.
    pub fn len(&self) -> usize {
        self.span.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The first `len` elements.
    pub fn prefix(&self, len: usize) -> TensorRef {
        TensorRef {
            region: self.region,
            span: Span::new(self.span.offset, len.min(self.span.len)),
        }
    }

    /// `span` of `region`.
    pub fn of(region: Region, span: Span) -> Self {
        Self { region, span }
    }

    /// Whether it lies in host memory (an offloaded step's [`HostRegion`]).
    pub fn is_host(&self) -> bool {
        matches!(self.region, Region::Host(_))
    }

    /// Whether the two share an element.
    pub fn overlaps(&self, other: &TensorRef) -> bool {
        self.region == other.region
            && self.span.offset < other.span.end()
            && other.span.offset < self.span.end()
    }
}

/// Blocks of `unscale_norm_partials` (its `NORM_BLOCKS`; defined by the planner).
pub const NORM_BLOCKS: usize = cuda_layout::NORM_BLOCKS as usize;

// The planner sizes the segment table with the struct's size.
const _: () = assert!(
    std::mem::size_of::<crate::cuda::adamw::AdamSegment>() as u64
        == cuda_layout::ADAM_SEGMENT_BYTES
);

/// `region` whole, `len` elements.
pub fn whole(region: Region, len: usize) -> TensorRef {
    TensorRef {
        region,
        span: Span::new(0, len),
    }
}

/// A planner count as a `usize` (saturating).
pub fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

/// The planner's tensors, one table per region, and the spans of named ones.
pub struct Tables(BTreeMap<Region, TensorTable>);

impl Tables {
    /// The planner's `tensors`, laid out back to back in each region in list order.
    pub fn new(tensors: &[CudaTensor]) -> Self {
        let mut tables: BTreeMap<Region, TensorTable> = BTreeMap::new();
        for tensor in tensors {
            let dims: Vec<usize> = tensor.shape.iter().map(|&d| to_usize(d)).collect();
            tables
                .entry(Region::Step(tensor.region))
                .or_default()
                .push(tensor.name.clone(), &dims);
        }
        Self(tables)
    }

    /// The tensor `name` of `region` (empty when the planner has none: the step's check
    /// refuses every op on it).
    pub fn get(&self, region: Region, name: &str) -> TensorRef {
        let span = self
            .0
            .get(&region)
            .and_then(|table| table.get(name))
            .map_or(Span::new(0, 0), |entry| entry.span);
        TensorRef { region, span }
    }

    /// Elements of `region`'s tensors together.
    pub fn len(&self, region: Region) -> usize {
        self.0.get(&region).map_or(0, TensorTable::total_len)
    }

    /// `region`'s table, taken out.
    pub fn take(&mut self, region: Region) -> TensorTable {
        self.0.remove(&region).unwrap_or_default()
    }
}

/// The sizes of a layout's regions (GPT-2's [`DeviceLayout`], the Llama family's
/// `LlamaDeviceLayout`): what the op checks and the step's whole-region ops need.
pub trait RegionSizes {
    /// Elements of `region`.
    fn region_len(&self, region: Region) -> usize;

    /// A region whole.
    fn whole_region(&self, region: Region) -> TensorRef {
        whole(region, self.region_len(region))
    }

    /// Whether 16-bit parameters are trained through fp32 master weights.
    fn trains_master(&self) -> bool {
        self.region_len(Region::Master) > 0
    }

    /// What this rank uploads into [`Region::Params`] from the whole model's parameters
    /// (flat order): all of them, unless the layout shares them out across ranks.
    fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        whole.to_vec()
    }

    /// What this rank uploads into [`Region::Master`]: the parameters it owns, in fp32.
    fn initial_master(&self, whole: &[f32]) -> Vec<f32> {
        if self.trains_master() {
            whole.to_vec()
        } else {
            Vec::new()
        }
    }

    /// What this rank's host master starts from under optimizer offload (its owned range of
    /// the parameters, fp32); empty without offload.
    fn initial_host_master(&self, whole: &[f32]) -> Vec<f32> {
        let _ = whole;
        Vec::new()
    }

    /// The AdamW segments (offset, length) of this rank's optimizer region: one per tensor of
    /// `param_table` unless the layout shares the optimizer out across ranks.
    fn adam_segments(&self, param_table: &TensorTable) -> Vec<(usize, usize)> {
        param_table
            .entries()
            .iter()
            .map(|e| (e.span.offset, e.span.len))
            .collect()
    }
}

impl RegionSizes for RegionLengths {
    fn region_len(&self, region: Region) -> usize {
        self.len(region)
    }
}

/// Elements of every region: the device's, [`Region::ALL`] order (what a layout of any family
/// allocates), and the host's under offload, [`HostRegion::ALL`] order (none without).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionLengths {
    /// Device allocations.
    pub device: [usize; Region::ALL.len()],
    /// Host buffers.
    pub host: [usize; HostRegion::ALL.len()],
}

impl RegionLengths {
    /// Device allocations of `device` elements each, and no host buffers.
    pub fn device(device: [usize; Region::ALL.len()]) -> Self {
        Self {
            device,
            host: [0; HostRegion::ALL.len()],
        }
    }

    /// The lengths of `layout`'s regions.
    pub fn of(layout: &dyn RegionSizes) -> Self {
        Self {
            device: Region::ALL.map(|region| layout.region_len(region)),
            host: HostRegion::ALL.map(|host| layout.region_len(Region::Host(host))),
        }
    }

    /// Elements of `region`.
    pub fn len(&self, region: Region) -> usize {
        if let Region::Host(host) = region {
            return self.host[host.index()];
        }
        let index = Region::ALL.iter().position(|r| *r == region).unwrap_or(0);
        self.device[index]
    }

    /// Whether the step's optimizer runs on the host (its master lives there).
    pub fn offloads(&self) -> bool {
        self.len(Region::Host(HostRegion::Master)) > 0
    }

    /// Bytes of `region` when the model is stored in `dtype`.
    pub fn bytes(&self, region: Region, dtype: Dtype) -> u64 {
        (self.len(region) * region.element().size(dtype)) as u64
    }

    /// Bytes per memory category.
    pub fn bytes_by_category(&self, dtype: Dtype) -> ByCategory {
        let mut total = ByCategory::default();
        for region in Region::ALL {
            let category = region.category();
            total.set(category, total.get(category) + self.bytes(region, dtype));
        }
        total
    }
}
