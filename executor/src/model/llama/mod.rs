//! The Llama-family decoder (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`) on
//! the CPU, llm.c style, matching `transformers` 5.
//!
//! `forward` runs the token embedding, `L` layers
//! (`h += o_proj(attn(rope(qkv(rmsnorm(h)))))`, `h += down(silu(gate(x)) * up(x))` with
//! `x = rmsnorm(h)`), the final RMSNorm and `lm_head` (tied or not); with targets, the mean
//! cross-entropy and, fused, the gradient of the logits. `backward` walks the same layers in
//! reverse. With [`Recompute::EachLayer`] the arena keeps only each layer's output and
//! backward re-runs the layer's forward from its saved input (see [`super::recompute`]).
//! [`LlamaCore`] reads its parameters unit by unit through a [`ParamSource`] (as
//! [`crate::model::Gpt2Core`] does), so the ZeRO ranks drive it unchanged; [`Llama`] owns
//! whole buffers. This file holds the types and checks; `forward.rs` and `backward.rs` the two
//! passes. Vocabulary as in [`crate::model`], plus `KV` key/value heads and `I` the MLP width.

mod activations;
mod backward;
mod config;
mod forward;
mod init;
mod params;

pub use activations::{LlamaActivations, LlamaBlockActivations, planned_llama_arena_len};
pub use config::{AttentionBias, LlamaConfig, LlamaFamily};
pub use init::init_llama_params;
pub use params::{LlamaBlockParams, LlamaLayout};

use super::attention::AttentionDims;
use super::lm_arena::LmArena;
use super::masking::{TokenLayout, TrainingBatch};
use super::owned::OwnedParams;
use super::recompute::{LayerStack, Recompute};
use super::rope::RopeTable;
use super::units::{ParamSource, UnitGrads, UnitParams, UnitSpans};
use super::{BatchShape, ModelError};
use crate::tensor::Span;

/// A Llama-family decoder without its parameters: shapes, layouts, the RoPE table and the
/// activation arena.
#[derive(Debug, Clone)]
pub struct LlamaCore {
    config: LlamaConfig,
    shape: BatchShape,
    param_layout: LlamaLayout,
    unit_spans: UnitSpans,
    act_layout: LlamaActivations,
    rope: RopeTable,
    arena: LmArena,
    tokens: Vec<u32>,
    /// The positions and attention mask of the last forward (backward and the recomputed
    /// forwards use them again).
    layout: TokenLayout,
}

impl LlamaCore {
    /// The passes of a model for `config`, sized for batches of `shape`, keeping every
    /// activation.
    pub fn new(config: LlamaConfig, shape: BatchShape) -> Result<Self, ModelError> {
        Self::with_recompute(config, shape, Recompute::Nothing)
    }

    /// The passes of a model for `config`, sized for batches of `shape`, keeping or
    /// recomputing each layer's activations as `recompute` says.
    ///
    /// Rows longer than `max_position_embeddings` are refused: their positions `arange(T)`
    /// would run past it. [`LlamaCore::for_packed_rows`] takes longer rows whose batches give
    /// their own `position_ids` (packed documents restart at 0).
    pub fn with_recompute(
        config: LlamaConfig,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        if shape.seq_len > config.max_position_embeddings {
            return Err(ModelError::SequenceTooLong {
                seq_len: shape.seq_len,
                n_positions: config.max_position_embeddings,
            });
        }
        Self::for_packed_rows(config, shape, recompute)
    }

    /// As [`LlamaCore::with_recompute`], for rows of any length: each forward checks that the
    /// positions it uses (`arange(T)` or the batch's `position_ids`) stay below
    /// `max_position_embeddings`.
    pub fn for_packed_rows(
        config: LlamaConfig,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        if shape.batch == 0 || shape.seq_len == 0 {
            return Err(ModelError::EmptyBatch);
        }
        if let Some(window) = config.sliding_window
            && shape.seq_len > window
        {
            return Err(ModelError::SlidingWindow {
                seq_len: shape.seq_len,
                window,
            });
        }
        let param_layout = LlamaLayout::new(&config);
        let act_layout = LlamaActivations::new(&config, shape, recompute);
        // The arena is the size the planner lists; the layout must fill it exactly.
        let planned = planned_llama_arena_len(&config, shape, recompute);
        if planned != act_layout.total_len() {
            return Err(ModelError::ArenaSize {
                planned,
                laid_out: act_layout.total_len(),
            });
        }
        Ok(Self {
            rope: config.rope.table(config.head_dim, shape.seq_len),
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
            layout: TokenLayout::causal(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The batch shape the arena is sized for.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The parameter (and gradient) layout.
    pub fn param_layout(&self) -> &LlamaLayout {
        &self.param_layout
    }

    /// The activation arena layout.
    pub fn activation_layout(&self) -> &LlamaActivations {
        &self.act_layout
    }

    /// What forward keeps of each layer.
    pub fn recompute(&self) -> Recompute {
        self.act_layout.recompute
    }

    /// The rotary table of this sequence length.
    pub fn rope_table(&self) -> &RopeTable {
        &self.rope
    }

    /// Bytes of the activation arena.
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
        self.layout = self.sequential_layout()?;
        self.run_forward(source, tokens)?;
        Ok(self.arena.finish_inference())
    }

    /// Training forward with parameters from `source`: the mean cross-entropy over positions
    /// that have a target; backward will compute the gradient of `grad_scale * loss`.
    pub fn forward_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
        targets: &[Option<u32>],
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        self.forward_batch_with(source, &TrainingBatch::causal(tokens, targets), grad_scale)
    }

    /// Training forward of `batch` (its positions, attention mask and loss divisor, see
    /// [`TrainingBatch`]): the summed cross-entropy over its targets divided as
    /// `batch.divisor` says; backward will compute the gradient of `grad_scale * loss`.
    pub fn forward_batch_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        batch: &TrainingBatch<'_>,
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        let (tokens, targets) = (batch.tokens, batch.targets);
        let divisor = self.arena.start_training(tokens, targets, batch.divisor)?;
        self.layout = if batch.is_masked() {
            let limit = self.rope.len().min(self.config.max_position_embeddings);
            TokenLayout::of(batch, self.shape.seq_len, limit)?
        } else {
            self.sequential_layout()?
        };
        self.run_forward(source, tokens)?;
        Ok(self.arena.finish_training(targets, divisor, grad_scale))
    }

    /// The causal layout at positions `arange(T)`, if `T` fits the model's positions.
    fn sequential_layout(&self) -> Result<TokenLayout, ModelError> {
        if self.shape.seq_len > self.config.max_position_embeddings {
            return Err(ModelError::SequenceTooLong {
                seq_len: self.shape.seq_len,
                n_positions: self.config.max_position_embeddings,
            });
        }
        Ok(TokenLayout::causal())
    }

    /// The attention sizes.
    fn attention_dims(&self) -> AttentionDims {
        AttentionDims {
            batch: self.shape.batch,
            seq_len: self.shape.seq_len,
            n_head: self.config.num_attention_heads,
            head_dim: self.config.head_dim,
        }
    }
}

impl LayerStack for LlamaCore {
    fn layers(&self) -> usize {
        self.config.num_hidden_layers
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

/// A Llama-family decoder with its parameters, gradients and activation arena.
#[derive(Debug, Clone)]
pub struct Llama {
    core: LlamaCore,
    unit_spans: UnitSpans,
    params: Vec<f32>,
    grads: Vec<f32>,
}

impl Llama {
    /// A model for `config` with `params` laid out as [`LlamaLayout::new`] says, sized for
    /// batches of `shape`, keeping every activation. Gradients start at zero.
    pub fn new(
        config: LlamaConfig,
        params: Vec<f32>,
        shape: BatchShape,
    ) -> Result<Self, ModelError> {
        Self::with_recompute(config, params, shape, Recompute::Nothing)
    }

    /// As [`Llama::new`], keeping or recomputing each layer's activations as `recompute` says.
    pub fn with_recompute(
        config: LlamaConfig,
        params: Vec<f32>,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        let core = LlamaCore::with_recompute(config, shape, recompute)?;
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

    /// The passes (layouts, arena).
    pub fn core(&self) -> &LlamaCore {
        &self.core
    }

    /// The flat parameter buffer.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The flat gradient buffer.
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// Sets every gradient to zero (backward accumulates).
    pub fn zero_grad(&mut self) {
        self.grads.fill(0.0);
    }

    /// Parameters and gradients at once, for an optimizer step (the activations cached by the
    /// last forward are invalidated, since the parameters may change).
    pub fn params_and_grads_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.core.invalidate();
        (&mut self.params, &mut self.grads)
    }

    /// Inference forward: the logits `(B, T, V)` of `tokens` `(B, T)`.
    pub fn forward_logits(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        let mut source = OwnedParams::new(&self.unit_spans, &self.params, &mut self.grads);
        self.core.forward_logits_with(&mut source, tokens)
    }

    /// Training forward: the mean cross-entropy over positions that have a target (see
    /// [`crate::model::next_token_targets`]), the logits' gradient prepared for backward.
    pub fn forward(&mut self, tokens: &[u32], targets: &[Option<u32>]) -> Result<f32, ModelError> {
        self.forward_scaled(tokens, targets, 1.0)
    }

    /// As [`Llama::forward`], but backward will compute the gradient of `grad_scale * loss`
    /// (gradient accumulation divides by the number of micro-batches).
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

    /// Backward: adds the gradient of the last training forward's loss to the gradients.
    pub fn backward(&mut self) -> Result<(), ModelError> {
        let mut source = OwnedParams::new(&self.unit_spans, &self.params, &mut self.grads);
        self.core.backward_with(&mut source)
    }
}
