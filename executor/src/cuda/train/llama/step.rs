//! The Llama family's [`StepProgram`]: its micro-step (forward, classifier, backward) inside
//! the phases every family shares ([`StepProgram::around`]), the same passes for
//! [`world_program`](crate::cuda::train::world_program) at `W > 1` ([`WorldLayout`]), and the
//! host check before anything is allocated.

use super::backward::llama_backward_ops;
use super::buffers::LlamaDeviceLayout;
use super::forward::llama_forward_ops;
use crate::cuda::train::buffers::RankShares;
use crate::cuda::train::program::Op;
use crate::cuda::train::program::{ShapeError, check_head_size};
use crate::cuda::train::step::StepProgram;
use crate::cuda::train::world_step::WorldLayout;

impl WorldLayout for LlamaDeviceLayout {
    fn rank_shares(&self) -> RankShares<'_> {
        LlamaDeviceLayout::rank_shares(self)
    }

    fn passes(&self) -> [Vec<Op>; 2] {
        [llama_forward_ops(self), llama_backward_ops(self)]
    }
}

impl StepProgram {
    /// The step over a Llama-family layout's buffers.
    pub fn llama(layout: &LlamaDeviceLayout) -> Self {
        let mut micro_step = llama_forward_ops(layout);
        micro_step.extend(llama_backward_ops(layout));
        Self::around(micro_step, layout)
    }

    /// Checks the Llama step before anything is allocated: the head size has attention
    /// kernels, the model has no sliding window (the kernels are causal over the whole row),
    /// and every op and launch fits `layout`.
    pub fn check_llama(&self, layout: &LlamaDeviceLayout) -> Result<(), ShapeError> {
        check_head_size(layout.config.head_dim, layout.dtype)?;
        if let Some(window) = layout.config.sliding_window
            && window < layout.shape.seq_len
        {
            return Err(ShapeError(format!(
                "sliding_window {window} is shorter than the rows ({} tokens): the CUDA \
                 attention kernels are causal over the whole row; train with --device cpu",
                layout.shape.seq_len
            )));
        }
        self.check_ops(layout, layout.dtype)
    }
}
