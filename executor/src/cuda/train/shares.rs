//! A rank's shares of the plan's model states ([`RankShares`]): what its owned range, its AdamW
//! segments, its first uploads and its bytes per category follow, one path for every family;
//! and how a layout's region lengths, stage-3 shard slices and arena places come from the
//! plan (`planner::plan::cuda_world::CudaShares`, `planner::plan::stage3_arena`).

use dsplan_kernels::Dtype;
use dsplan_planner::plan::Plan;
use dsplan_planner::plan::cuda_world::{CudaScheme, CudaShares};
use dsplan_planner::plan::stage3_arena::Stage3Arena;

use super::region::{Region, RegionLengths, Tables, TensorRef, to_usize};
use crate::metrics::{ByCategory, Category};
use crate::tensor::{Span, TensorTable};

/// The planner's name of a model dtype.
pub fn planner_dtype(dtype: Dtype) -> dsplan_planner::plan::Dtype {
    use dsplan_planner::plan::Dtype as P;
    match dtype {
        Dtype::F32 => P::Fp32,
        Dtype::Bf16 => P::Bf16,
        Dtype::F16 => P::Fp16,
        Dtype::F64 => P::Fp64,
    }
}

/// A rank's shares of the plan's model states, borrowed from its layout: what its owned range, its AdamW
/// segments and its first uploads follow, one path for every family.
#[derive(Debug, Clone, Copy)]
pub struct RankShares<'a> {
    /// The rank's shares of the plan (one GPU: everything whole).
    pub shares: &'a CudaShares,
    /// The parameter tensors in flat order.
    pub table: &'a TensorTable,
    /// Stage 3: each tensor's slice in the shard (`DeviceLayout::shard_spans`); empty
    /// otherwise.
    pub shard_spans: &'a [Span],
    /// Stage 3: the plan's gathered-parameter arena.
    pub arena: Option<&'a Stage3Arena>,
    /// Stage 3: each persistent tensor's flat span and its place in the arena.
    pub persistent_places: &'a [(Span, Span)],
}

impl RankShares<'_> {
    /// The range of `region` (parameters or gradients) this rank's optimizer owns: everything
    /// on one GPU and at stage 0, its flat partition at stages 1-2, its shard at stage 3.
    pub fn owned(&self, region: Region) -> TensorRef {
        let (start, len) = match self.shares.scheme {
            CudaScheme::Replicated => (0, self.table.total_len() as u64),
            CudaScheme::FlatPartition => (self.shares.partition, self.shares.optimizer),
            CudaScheme::PartitionedGradients => match region {
                Region::Grads => (self.shares.grads, self.shares.grad_partition),
                _ => (self.shares.partition, self.shares.optimizer),
            },
            CudaScheme::Sharded => match region {
                Region::Grads => (self.shares.grads, self.shares.grad_partition),
                _ => (self.shares.params, self.shares.param_shard),
            },
        };
        TensorRef {
            region,
            span: Span::new(to_usize(start), to_usize(len)),
        }
    }

    /// The fused AdamW's segments `(offset, len)` over the owned range ([`Self::owned`]):
    /// one per parameter tensor that reaches into it, offsets from the range's start.
    pub fn segments(&self) -> Vec<(usize, usize)> {
        let entries = self.table.entries();
        match self.shares.scheme {
            CudaScheme::Replicated => entries
                .iter()
                .map(|e| (e.span.offset, e.span.len))
                .collect(),
            CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => {
                let start = to_usize(self.shares.partition);
                let end = start + to_usize(self.shares.optimizer);
                entries
                    .iter()
                    .filter_map(|e| {
                        let (a, b) = (e.span.offset.max(start), e.span.end().min(end));
                        (a < b).then(|| (a - start, b - a))
                    })
                    .collect()
            }
            CudaScheme::Sharded => self
                .shard_spans
                .iter()
                .filter(|s| s.len > 0)
                .map(|s| (s.offset, s.len))
                .collect(),
        }
    }

    /// The parameters' region as this rank starts it from the whole model `whole` (f32,
    /// flat order): the model and zero padding to the flat buffer's length; at
    /// stage 3 the arena (the persistent tensors at their places, zeros elsewhere) and the
    /// rank's slices of every tensor (zero-padded) after it.
    pub fn initial_params(&self, whole: &[f32]) -> Vec<f32> {
        let mut out = match self.shares.scheme {
            CudaScheme::Sharded => {
                let mut arena = vec![0.0; to_usize(self.shares.params)];
                for &(flat, place) in self.persistent_places {
                    if let (Some(dst), Some(src)) = (
                        arena.get_mut(place.offset..place.end()),
                        whole.get(flat.offset..flat.end()),
                    ) {
                        dst.copy_from_slice(src);
                    }
                }
                arena
            }
            CudaScheme::Replicated
            | CudaScheme::FlatPartition
            | CudaScheme::PartitionedGradients => {
                let mut flat = whole.to_vec();
                flat.resize(to_usize(self.shares.params), 0.0);
                flat
            }
        };
        if self.shares.scheme == CudaScheme::Sharded {
            let rank = to_usize(self.shares.rank);
            for (entry, slice) in self.table.entries().iter().zip(self.shard_spans) {
                let from = (entry.span.offset + rank * slice.len).min(entry.span.end());
                let to = (from + slice.len).min(entry.span.end());
                let mut piece = whole.get(from..to).unwrap_or(&[]).to_vec();
                piece.resize(slice.len, 0.0);
                out.extend(piece);
            }
        }
        out
    }

    /// The fp32 master this rank starts from (its owned range of [`Self::initial_params`]);
    /// empty when the parameters are the master.
    pub fn initial_master(&self, whole: &[f32], trains_master: bool) -> Vec<f32> {
        if !trains_master {
            return Vec::new();
        }
        let owned = self.owned(Region::Params);
        let params = self.initial_params(whole);
        params
            .get(owned.span.offset..owned.span.end())
            .unwrap_or(&[])
            .to_vec()
    }

    /// Bytes per memory category of `lengths` (this rank's regions) stored in `dtype`: at
    /// stage 3 the parameters' region holds the gathered-parameter arena (category gathered)
    /// and then the rank's shard (category params).
    pub fn bytes_by_category(&self, lengths: &RegionLengths, dtype: Dtype) -> ByCategory {
        let mut total = ByCategory::default();
        let mut add = |category: Category, bytes: u64| {
            total.set(category, total.get(category) + bytes);
        };
        for region in Region::ALL {
            let bytes = lengths.bytes(region, dtype);
            if region == Region::Params && self.shares.scheme == CudaScheme::Sharded {
                let shard = self.shares.param_shard * region.element().size(dtype) as u64;
                add(Category::Gathered, bytes - shard);
                add(Category::Params, shard);
            } else {
                add(region.category(), bytes);
            }
        }
        total
    }
}

/// The lengths of a rank's regions holding `shares` of the model states, the planner's
/// step regions from `tables`.
pub(crate) fn share_lengths(shares: &CudaShares, tables: &Tables) -> RegionLengths {
    let n = |v: u64| to_usize(v);
    RegionLengths::device(Region::ALL.map(|region| match region {
        Region::Params => n(shares.params + shares.param_shard),
        Region::Grads => n(shares.grads + shares.grad_partition),
        Region::ExpAvg | Region::ExpAvgSq => n(shares.optimizer),
        Region::Master => n(shares.master),
        Region::ReduceStaging => n(shares.bucket),
        Region::GatherIn => n(shares.gather),
        Region::GatherOut => n(shares.gather_out()),
        other => tables.len(other),
    }))
}

/// Stage 3: each tensor of `table`'s slice in the rank's shard (`ceil(numel / W)` each, back
/// to back, in flat order); empty otherwise.
pub(crate) fn shard_spans(shares: &CudaShares, table: &TensorTable) -> Vec<Span> {
    match shares.scheme {
        CudaScheme::Sharded => {
            let world = to_usize(shares.world).max(1);
            let mut offset = 0;
            table
                .entries()
                .iter()
                .map(|e| {
                    let slice = e.span.len.div_ceil(world);
                    let span = Span::new(offset, slice);
                    offset += slice;
                    span
                })
                .collect()
        }
        CudaScheme::Replicated | CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => {
            Vec::new()
        }
    }
}

/// Stage 3: the plan's gathered-parameter arena and each persistent tensor's flat span in
/// `table` with its place there; nothing below stage 3. An error when the plan shards the
/// parameters without placing them, or places a tensor `table` does not have.
#[allow(clippy::type_complexity)]
pub(crate) fn plan_placement(
    plan: &Plan,
    shares: &CudaShares,
    table: &TensorTable,
) -> Result<(Option<Stage3Arena>, Vec<(Span, Span)>), String> {
    if shares.scheme != CudaScheme::Sharded {
        return Ok((None, Vec::new()));
    }
    let arena = plan
        .stage3
        .as_ref()
        .and_then(|s| s.arena.as_ref())
        .ok_or("the plan shards the parameters but places no stage-3 arena")?;
    let entries = table.entries();
    let mut places = Vec::new();
    for place in arena.persistent() {
        let name = plan
            .layout
            .entries
            .iter()
            .find(|e| e.tensor == place.tensor)
            .map(|e| e.name.as_str());
        let flat = entries
            .iter()
            .find(|e| Some(e.name.as_str()) == name)
            .map(|e| e.span)
            .filter(|s| s.len as u64 == place.numel)
            .ok_or_else(|| {
                format!(
                    "the plan's persistent tensor {} ({name:?}) is not a parameter of {} elements of the device model",
                    place.tensor, place.numel
                )
            })?;
        places.push((
            flat,
            Span::new(to_usize(place.offset), to_usize(place.numel)),
        ));
    }
    Ok((Some(arena.clone()), places))
}
