//! What a rank's stage family decides, as one interface ([`Stage`]), and what every stage
//! works with ([`Group`]).
//!
//! A stage family is a way of holding the parameters and of getting the gradients to the
//! optimizer: replicated (stage 0, `stage0.rs`), a flat partition (stages 1 and 2,
//! `stage12.rs`) or per-tensor shards (stage 3, `stage3.rs`). Each owns its buffers and runs its
//! own collectives; the rank (`rank.rs`) owns what all of them share: the accumulated
//! gradients, the per-unit buffers the model reads and writes, and the optimizer.

use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use super::ZeroError;
use super::options::RankOptions;
use super::partition::EnginePlan;
use super::precision::DtypeVec;
use super::swap::ParamSwap;
use crate::comm::Comm;
use crate::metrics::{MemoryLedger, Tracked};

/// What every stage reads and talks through: the plan, the rank's place in the group, its
/// collectives and its memory ledger.
pub(super) struct Group {
    /// The plan the ranks follow.
    pub(super) plan: Arc<EnginePlan>,
    /// The stage and dtypes.
    pub(super) options: RankOptions,
    /// This rank.
    pub(super) rank: usize,
    /// The number of ranks.
    pub(super) world: usize,
    /// The collectives.
    pub(super) comm: Box<dyn Comm>,
    /// Where every buffer is counted.
    pub(super) ledger: Rc<MemoryLedger>,
}

/// All of `params`, widened to `f32`.
pub(super) fn widened(params: &DtypeVec) -> Vec<f32> {
    let mut values = vec![0.0f32; params.len()];
    params.read(0, &mut values);
    values
}

/// One `f32` buffer counted in the ledger.
pub(super) type Buffer = Tracked<Box<[f32]>>;

/// What a stage family does on its own buffers (see the [module documentation](self)). Called
/// once per unit, bucket or step, never per element.
pub(super) trait Stage {
    /// The model-dtype parameters this rank keeps in memory (stages 0-2: the flat buffer;
    /// stage 3: the shard, less the slices on NVMe).
    fn params(&self) -> &Tracked<DtypeVec>;

    /// The same, mutably.
    fn params_mut(&mut self) -> &mut Tracked<DtypeVec>;

    /// Elements of the accumulated gradients.
    fn grads_len(&self, plan: &EnginePlan) -> usize;

    /// Where the owned gradients sit in the accumulated ones (all of them, unless the stage
    /// accumulates more than it owns).
    fn owned_grads(&self, plan: &EnginePlan, rank: usize, grads_len: usize) -> Range<usize> {
        let _ = (plan, rank);
        0..grads_len
    }

    /// The owned region's pieces of real tensors, in owned-buffer coordinates (for norms).
    fn norm_pieces(&self, plan: &EnginePlan, rank: usize) -> Vec<Range<usize>>;

    /// Makes unit `i` readable as `f32`: a new buffer, or `None` when the parameters are read
    /// in place.
    fn fetch(&mut self, group: &mut Group, i: usize) -> Result<Option<Buffer>, ZeroError>;

    /// Unit `i`'s parameters in place (`f32` parameters of stages 0-2), when not fetched.
    fn in_place(&self, group: &Group, i: usize) -> Option<&[f32]> {
        let _ = (group, i);
        None
    }

    /// Unit `i`'s gradients of this backward (rounded to the model dtype) are complete: they
    /// go into the accumulated gradients, now or through the stage's buckets.
    fn grads_ready(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
        i: usize,
        values: &[f32],
    ) -> Result<(), ZeroError>;

    /// After the last micro-step: the reduction of the accumulated gradients, when the stage
    /// did not reduce them during backward.
    fn reduce_at_boundary(
        &mut self,
        group: &mut Group,
        grads: &mut Tracked<DtypeVec>,
    ) -> Result<(), ZeroError> {
        let _ = (group, grads);
        Ok(())
    }

    /// Writes new values of the owned elements `start..start + values.len()` (owned
    /// coordinates) into the parameters, wherever they live.
    fn write_owned(&mut self, group: &Group, start: usize, values: &[f32])
    -> Result<(), ZeroError>;

    /// After the optimizer step has written the owned parameters: the collectives that bring
    /// the rest up to date.
    fn after_step(&mut self, group: &mut Group) -> Result<(), ZeroError> {
        let _ = group;
        Ok(())
    }

    /// The model-dtype parameters this rank holds, widened to `f32`, as a checkpoint stores
    /// them (stage 3: the whole shard in shard order, NVMe slices included).
    fn held_params(&mut self, group: &Group) -> Result<Vec<f32>, ZeroError> {
        let _ = group;
        Ok(widened(self.params()))
    }

    /// Stage 3 parameter offload to NVMe, when there is one.
    fn param_swap(&self) -> Option<&ParamSwap> {
        None
    }
}
