//! [`StepBackend`]: the operations of one training step on one rank's own memory. The one
//! training loop ([`super::step`]) calls them in DeepSpeed's order and decides everything
//! between them on the host ([`super::StepControl`]); the backends only compute:
//!
//! | backend | memory | implementation |
//! |---|---|---|
//! | CPU, ZeRO stages 0-3 | host, one [`crate::zero::ZeroRank`] per rank | [`crate::zero::engine::CpuStep`] |
//! | CUDA, one rank per GPU (or sharing one) | device buffers ([`crate::cuda::train::DeviceLayout`]) | `crate::cuda::train::rank::CudaStep` |
//!
//! Checkpoints go through the same interface: a backend hands out and takes back its owned
//! optimizer state in the CPU rank's layout ([`OwnedState`]), so a checkpoint is the same
//! files whichever backend wrote it.

use crate::comm::watchdog::Watch;
use crate::comm::{Comm, StepPhase};
use crate::data::LabelledBatch;
use crate::metrics::PhaseTimes;
use crate::model::LossDivisor;
use crate::optim::AdamConfig;
use crate::zero::{ClipRule, Dtype, OwnedState, Scales, ZeroError};

/// One rank's step operations.
pub trait StepBackend {
    /// This rank's index.
    fn rank(&self) -> usize;

    /// The rank's collectives (the loss average over ranks, the checkpoints' agreement).
    fn comm(&mut self) -> &mut dyn Comm;

    /// Starts an optimizer step (the accumulated gradients are cleared).
    fn begin_step(&mut self) -> Result<(), ZeroError>;

    /// Forward and backward of one micro-batch, its summed token loss divided as `divisor`
    /// says and the backward's loss multiplied by `grad_scale`; returns the micro-batch's loss
    /// and adds the phases' seconds to `times`. A backend that cannot honour the batch's
    /// positions, mask or divisor refuses it.
    fn micro_step(
        &mut self,
        batch: &LabelledBatch,
        divisor: LossDivisor,
        grad_scale: f32,
        times: &mut PhaseTimes,
    ) -> Result<f64, ZeroError>;

    /// At the boundary: the accumulated gradients reduced across ranks and readied for the
    /// optimizer (`loss_scale`: the scale of this step's backward).
    fn reduce_gradients(&mut self, loss_scale: f64) -> Result<(), ZeroError>;

    /// Right after [`Self::reduce_gradients`], before the overflow check and the norm: a
    /// backend whose optimizer starts before they are known (ZeRO-Offload's speculative host
    /// step) starts it here with the step's `adam` and `lr`, to be undone by
    /// [`Self::discard`] or redone by [`Self::optimizer_step`] when it must be. Others do
    /// nothing.
    fn speculate_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError> {
        let _ = (adam, lr);
        Ok(())
    }

    /// Whether any gradient on any rank is inf or NaN (asked only when the precision checks).
    fn any_overflow(&mut self) -> Result<bool, ZeroError>;

    /// Drops the step's gradients (the loss scaler skipped the step).
    fn discard(&mut self);

    /// Unscales and clips the gradients in one multiplication; returns the true (unscaled,
    /// pre-clip) global norm.
    fn unscale_and_clip(
        &mut self,
        rule: ClipRule,
        scales: Scales,
        clip: f64,
    ) -> Result<f64, ZeroError>;

    /// Steps the optimizer with `adam` at learning rate `lr` and refreshes the parameters.
    fn optimizer_step(&mut self, adam: &AdamConfig, lr: f64) -> Result<(), ZeroError>;

    /// This rank's optimizer state (fp32 master, moments, Adam's step), in the CPU rank's
    /// layout.
    fn export_owned(&mut self) -> Result<OwnedState, ZeroError>;

    /// Elements of this rank's optimizer partition (what every vector of its
    /// [`OwnedState`] holds).
    fn owned_len(&self) -> usize;

    /// Takes `state` (of [`StepBackend::owned_len`] elements) as this rank's optimizer state.
    fn import_owned(&mut self, state: &OwnedState) -> Result<(), ZeroError>;

    /// The model-dtype parameters this rank holds, widened to `f32`, and their dtype: the flat
    /// buffer (stages 0-2, padding included) or the rank's stage 3 shard, as the CPU rank holds
    /// them.
    fn held_params(&mut self) -> Result<(Dtype, Vec<f32>), ZeroError>;

    /// Watches `phase` of the step for a peer that fails or hangs: a backend whose waits can
    /// block inside its communication library (NCCL) returns its watchdog's [`Watch`]; the
    /// others, whose collectives fail on their own, watch nothing.
    fn watch(&mut self, phase: StepPhase) -> Watch {
        let _ = phase;
        Watch::none()
    }
}
