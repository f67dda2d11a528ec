//! [`Gpt2`]: the whole model, forward and backward, over the flat buffers.
//!
//! `forward` runs embeddings, `L` blocks (`h += attn(ln_1(h)); h += mlp(ln_2(h))`), `ln_f` and
//! the tied-embedding classifier; with targets it also computes the mean cross-entropy and,
//! fused, the gradient of the logits. `backward` walks the same layers in reverse and
//! accumulates every parameter gradient into the gradient buffer. [`Gpt2Core`] is the model
//! without its parameters (layouts, arena), reading them unit by unit through a
//! [`ParamSource`]; [`Gpt2`] adds whole parameter and gradient buffers (`model/owned.rs` is its
//! source). With [`Recompute::EachLayer`] the arena keeps only each block's input and
//! backward re-runs `block_forward` from it (see [`super::recompute`]). This file holds the types and their checks; `forward.rs` and `backward.rs` hold the
//! two passes.

mod backward;
mod forward;

use super::activations::{ActivationLayout, BatchShape, planned_arena_len};
use super::attention::AttentionDims;
use super::lm_arena::LmArena;
use super::masking::TrainingBatch;
use super::owned::OwnedParams;
use super::recompute::{LayerStack, Recompute};
use super::units::{ParamSource, UnitGrads, UnitParams, UnitSpans};
use super::{Gpt2Config, ModelError, ParamLayout};
use crate::tensor::Span;

/// A GPT-2 without its parameters: shapes, layouts and the activation arena.
///
/// Forward and backward read parameters and write gradients through a [`ParamSource`], one
/// unit at a time (see [`super::units`]), so the buffers can live elsewhere: in a [`Gpt2`]
/// (whole buffers), or sharded across ZeRO-3 ranks and gathered per unit.
#[derive(Debug, Clone)]
pub struct Gpt2Core {
    config: Gpt2Config,
    shape: BatchShape,
    param_layout: ParamLayout,
    unit_spans: UnitSpans,
    act_layout: ActivationLayout,
    arena: LmArena,
    tokens: Vec<u32>,
}

impl Gpt2Core {
    /// The passes of a model for `config`, sized for batches of `shape`, keeping every
    /// activation.
    pub fn new(config: Gpt2Config, shape: BatchShape) -> Result<Self, ModelError> {
        Self::with_recompute(config, shape, Recompute::Nothing)
    }

    /// The passes of a model for `config`, sized for batches of `shape`, keeping or
    /// recomputing each block's activations as `recompute` says.
    pub fn with_recompute(
        config: Gpt2Config,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        if shape.batch == 0 || shape.seq_len == 0 {
            return Err(ModelError::EmptyBatch);
        }
        if shape.seq_len > config.n_positions {
            return Err(ModelError::SequenceTooLong {
                seq_len: shape.seq_len,
                n_positions: config.n_positions,
            });
        }
        let param_layout = ParamLayout::new(&config);
        let act_layout = ActivationLayout::new(&config, shape, recompute);
        // The arena is the size the planner lists; the layout must fill it exactly.
        let planned = planned_arena_len(&config, shape, recompute);
        if planned != act_layout.total_len() {
            return Err(ModelError::ArenaSize {
                planned,
                laid_out: act_layout.total_len(),
            });
        }
        Ok(Self {
            config,
            shape,
            unit_spans: UnitSpans::new(&param_layout),
            arena: LmArena::new(
                planned,
                shape,
                config.vocab_size,
                act_layout.logits,
                act_layout.losses,
            ),
            param_layout,
            act_layout,
            tokens: Vec::with_capacity(shape.tokens()),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The batch shape the arena is sized for.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The parameter (and gradient) layout.
    pub fn param_layout(&self) -> &ParamLayout {
        &self.param_layout
    }

    /// Where each parameter unit lives.
    pub fn unit_spans(&self) -> &UnitSpans {
        &self.unit_spans
    }

    /// The activation arena layout.
    pub fn activation_layout(&self) -> &ActivationLayout {
        &self.act_layout
    }

    /// What forward keeps of each block.
    pub fn recompute(&self) -> Recompute {
        self.act_layout.recompute
    }

    /// Bytes of the activation arena (allocated once, at construction).
    pub fn activation_bytes(&self) -> usize {
        self.arena.bytes()
    }

    /// Forgets the activations (the parameters changed).
    pub fn invalidate(&mut self) {
        self.arena.invalidate();
    }

    /// The logits `(B, T, V)` of the last inference forward, if the arena still holds them.
    pub fn logits(&self) -> Option<&[f32]> {
        self.arena.logits()
    }

    /// Inference forward with parameters from `source`: the logits `(B, T, V)` of `tokens`.
    pub fn forward_logits_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
    ) -> Result<&[f32], S::Error> {
        self.arena.start_inference(tokens)?;
        self.run_forward(source, tokens)?;
        Ok(self.arena.finish_inference())
    }

    /// Training forward with parameters from `source`: the mean cross-entropy over positions
    /// that have a target; backward will compute the gradient of `grad_scale * loss`. See
    /// [`Gpt2::forward_scaled`].
    pub fn forward_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
        targets: &[Option<u32>],
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        self.forward_batch_with(source, &TrainingBatch::causal(tokens, targets), grad_scale)
    }

    /// Training forward of `batch`: its summed cross-entropy divided as `batch.divisor` says.
    /// GPT-2 takes plain causal rows only (its positions are learned, its attention causal):
    /// a batch with `position_ids` or an `attention_mask` is refused.
    pub fn forward_batch_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        batch: &TrainingBatch<'_>,
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        if batch.is_masked() {
            return Err(ModelError::MaskingUnsupported { family: "gpt2" }.into());
        }
        let (tokens, targets) = (batch.tokens, batch.targets);
        let divisor = self.arena.start_training(tokens, targets, batch.divisor)?;
        self.run_forward(source, tokens)?;
        Ok(self.arena.finish_training(targets, divisor, grad_scale))
    }
}

impl LayerStack for Gpt2Core {
    fn layers(&self) -> usize {
        self.config.n_layer
    }

    fn recompute(&self) -> Recompute {
        self.act_layout.recompute
    }

    fn unit_spans(&self) -> &UnitSpans {
        &self.unit_spans
    }

    fn layer_input(&self, l: usize) -> Span {
        self.block_input(l)
    }

    fn layer_forward(&mut self, l: usize, input: Span, p: UnitParams<'_>) -> Span {
        self.block_forward(l, input, p)
    }

    fn layer_backward(&mut self, l: usize, p: UnitParams<'_>, g: UnitGrads<'_>) {
        self.block_backward(l, p, g)
    }
}

/// A GPT-2 with its parameters, gradients and activation arena.
#[derive(Debug, Clone)]
pub struct Gpt2 {
    core: Gpt2Core,
    /// A copy of the core's unit spans, borrowed while the core runs a pass.
    unit_spans: UnitSpans,
    params: Vec<f32>,
    grads: Vec<f32>,
}

impl Gpt2 {
    /// A model for `config` with the given parameters (laid out as [`ParamLayout::new`] says),
    /// sized for batches of `shape`, keeping every activation. Gradients start at zero.
    pub fn new(
        config: Gpt2Config,
        params: Vec<f32>,
        shape: BatchShape,
    ) -> Result<Self, ModelError> {
        Self::with_recompute(config, params, shape, Recompute::Nothing)
    }

    /// As [`Gpt2::new`], keeping or recomputing each block's activations as `recompute` says.
    pub fn with_recompute(
        config: Gpt2Config,
        params: Vec<f32>,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        let core = Gpt2Core::with_recompute(config, shape, recompute)?;
        let expected = core.param_layout.num_params();
        if params.len() != expected {
            return Err(ModelError::ParamCount {
                expected,
                found: params.len(),
            });
        }
        Ok(Self {
            unit_spans: core.unit_spans.clone(),
            core,
            grads: vec![0.0; params.len()],
            params,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Gpt2Config {
        self.core.config()
    }

    /// The batch shape the arena is sized for.
    pub fn shape(&self) -> BatchShape {
        self.core.shape()
    }

    /// The parameter (and gradient) layout.
    pub fn param_layout(&self) -> &ParamLayout {
        self.core.param_layout()
    }

    /// The activation arena layout.
    pub fn activation_layout(&self) -> &ActivationLayout {
        self.core.activation_layout()
    }

    /// The flat parameter buffer.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The flat parameter buffer, for the optimizer (invalidates the activations).
    pub fn params_mut(&mut self) -> &mut [f32] {
        self.core.invalidate();
        &mut self.params
    }

    /// The flat gradient buffer (same layout as the parameters).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// The flat gradient buffer, for clipping or reduction.
    pub fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }

    /// Parameters and gradients at once, for an optimizer step (invalidates the activations).
    pub fn params_and_grads_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.core.invalidate();
        (&mut self.params, &mut self.grads)
    }

    /// Sets every gradient to zero (backward accumulates).
    pub fn zero_grad(&mut self) {
        self.grads.fill(0.0);
    }

    /// The logits `(B, T, V)` of the last [`Gpt2::forward_logits`], if the arena still holds them.
    pub fn logits(&self) -> Option<&[f32]> {
        self.core.logits()
    }

    /// Inference forward: returns the logits `(B, T, V)` of `tokens` `(B, T)`.
    pub fn forward_logits(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        let mut source = OwnedParams::new(&self.unit_spans, &self.params, &mut self.grads);
        self.core.forward_logits_with(&mut source, tokens)
    }

    /// Training forward: the mean cross-entropy over positions that have a target, with the
    /// gradient of the logits prepared for [`Gpt2::backward`].
    ///
    /// `tokens` and `targets` are `(B, T)`; `targets[i]` is the id position `i` should predict,
    /// or `None` to ignore it (Hugging Face's `-100`). See [`next_token_targets`].
    pub fn forward(&mut self, tokens: &[u32], targets: &[Option<u32>]) -> Result<f32, ModelError> {
        self.forward_scaled(tokens, targets, 1.0)
    }

    /// As [`Gpt2::forward`], but backward will compute the gradient of `grad_scale * loss`
    /// (gradient accumulation divides by the number of micro-batches; fp16 multiplies by the
    /// loss scale).
    pub fn forward_scaled(
        &mut self,
        tokens: &[u32],
        targets: &[Option<u32>],
        grad_scale: f32,
    ) -> Result<f32, ModelError> {
        let mut source = OwnedParams::new(&self.unit_spans, &self.params, &mut self.grads);
        self.core
            .forward_with(&mut source, tokens, targets, grad_scale)
    }

    /// Backward through the whole model: adds the gradient of (`grad_scale` times) the last
    /// training forward's loss to the gradient buffer.
    pub fn backward(&mut self) -> Result<(), ModelError> {
        let mut source = OwnedParams::new(&self.unit_spans, &self.params, &mut self.grads);
        self.core.backward_with(&mut source)
    }
}

fn attention_dims(config: &Gpt2Config, shape: BatchShape) -> AttentionDims {
    AttentionDims {
        batch: shape.batch,
        seq_len: shape.seq_len,
        n_head: config.n_head,
        head_dim: config.head_dim(),
    }
}

/// The targets of causal language modelling as Hugging Face computes them from
/// `labels = input_ids`: position `t` predicts token `t + 1` of the same row; the last position
/// of each row has no target.
///
/// `tokens` is `(B, T)` flattened, with rows of `seq_len`.
pub fn next_token_targets(tokens: &[u32], seq_len: usize) -> Vec<Option<u32>> {
    tokens
        .chunks(seq_len.max(1))
        .flat_map(|row| {
            row.iter()
                .skip(1)
                .map(|&t| Some(t))
                .chain(std::iter::once(None))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_shift_left_within_rows() {
        assert_eq!(
            next_token_targets(&[1, 2, 3, 4, 5, 6], 3),
            vec![Some(2), Some(3), None, Some(5), Some(6), None]
        );
    }
}
