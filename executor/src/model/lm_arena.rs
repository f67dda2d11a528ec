//! [`LmArena`]: the activation arena of a causal language model, with what every family does
//! the same way around its own layers: the arena's state (which pass may run next), the checks
//! on token and target ids, and the cross-entropy at the end of a training forward. GPT-2 and
//! the Llama family lay their activations out differently ([`super::ActivationLayout`],
//! [`super::llama::LlamaActivations`]) but both end in a `(B, T, V)` logits buffer and a
//! `(B, T)` loss buffer, which is all this module reads.

use super::classifier::{LossDivisor, divided_crossentropy};
use super::{BatchShape, ModelError};
use crate::tensor::{Span, split_spans_mut};

/// What the activation arena holds after the last call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArenaState {
    /// Nothing usable.
    Empty,
    /// An inference forward ran: the logits are valid.
    Logits,
    /// A training forward ran: the logits buffer holds their gradient; backward may run.
    LogitGradients,
}

/// The activation buffer of one model and the state of its last pass.
#[derive(Debug, Clone)]
pub(crate) struct LmArena {
    /// Every activation, laid out by the family's activation layout.
    pub(crate) acts: Vec<f32>,
    state: ArenaState,
    shape: BatchShape,
    vocab_size: usize,
    logits: Span,
    losses: Span,
}

impl LmArena {
    /// A zeroed arena of `len` elements for batches of `shape`, whose logits `(B, T, V)` and
    /// losses `(B, T)` sit at `logits` and `losses`.
    pub(crate) fn new(
        len: usize,
        shape: BatchShape,
        vocab_size: usize,
        logits: Span,
        losses: Span,
    ) -> Self {
        Self {
            acts: vec![0.0; len],
            state: ArenaState::Empty,
            shape,
            vocab_size,
            logits,
            losses,
        }
    }

    /// Bytes of the arena (allocated once, at construction).
    pub(crate) fn bytes(&self) -> usize {
        self.acts.len() * std::mem::size_of::<f32>()
    }

    /// Forgets the activations (the parameters changed).
    pub(crate) fn invalidate(&mut self) {
        self.state = ArenaState::Empty;
    }

    /// The logits of the last inference forward, if the arena still holds them.
    pub(crate) fn logits(&self) -> Option<&[f32]> {
        (self.state == ArenaState::Logits).then(|| self.logits.of(&self.acts))
    }

    /// Before an inference forward: checks `tokens`; the arena holds nothing until it ends.
    pub(crate) fn start_inference(&mut self, tokens: &[u32]) -> Result<(), ModelError> {
        self.check_tokens(tokens)?;
        self.state = ArenaState::Empty;
        Ok(())
    }

    /// After an inference forward: the logits `(B, T, V)`.
    pub(crate) fn finish_inference(&mut self) -> &[f32] {
        self.state = ArenaState::Logits;
        self.logits.of(&self.acts)
    }

    /// Before a training forward: checks `tokens` and `targets`, and resolves the loss's
    /// divisor (the count of targets is refused when there is none).
    pub(crate) fn start_training(
        &mut self,
        tokens: &[u32],
        targets: &[Option<u32>],
        divisor: LossDivisor,
    ) -> Result<f64, ModelError> {
        self.check_tokens(tokens)?;
        self.check_ids("target", "targets", targets.iter().copied(), targets.len())?;
        let divisor = divisor.resolve(targets)?;
        self.state = ArenaState::Empty;
        Ok(divisor)
    }

    /// After a training forward: the summed cross-entropy over the targets divided by
    /// `divisor`; the logits buffer now holds the gradient of `grad_scale * loss`, so backward
    /// may run.
    pub(crate) fn finish_training(
        &mut self,
        targets: &[Option<u32>],
        divisor: f64,
        grad_scale: f32,
    ) -> f32 {
        let [logits, losses] = split_spans_mut(&mut self.acts, [self.logits, self.losses]);
        let loss = divided_crossentropy(logits, losses, targets, divisor, grad_scale);
        self.state = ArenaState::LogitGradients;
        loss
    }

    /// Before backward: a training forward must have run since the last backward (backward
    /// uses up the logits' gradient).
    pub(crate) fn start_backward(&mut self) -> Result<(), ModelError> {
        if self.state != ArenaState::LogitGradients {
            return Err(ModelError::BackwardWithoutForward);
        }
        self.state = ArenaState::Empty;
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        self.check_ids(
            "token",
            "tokens",
            tokens.iter().map(|&t| Some(t)),
            tokens.len(),
        )
    }

    /// Checks the length of `ids` and that each is in the vocabulary.
    fn check_ids(
        &self,
        what: &'static str,
        plural: &'static str,
        ids: impl Iterator<Item = Option<u32>>,
        len: usize,
    ) -> Result<(), ModelError> {
        let expected = self.shape.tokens();
        if len != expected {
            return Err(ModelError::BatchLength {
                what: plural,
                expected,
                found: len,
            });
        }
        let vocab_size = self.vocab_size;
        for (position, id) in ids.enumerate() {
            if let Some(id) = id
                && id as usize >= vocab_size
            {
                return Err(ModelError::OutOfVocabulary {
                    what,
                    position,
                    id,
                    vocab_size,
                });
            }
        }
        Ok(())
    }
}
