//! One model abstraction for the engines: [`ModelConfig`] (which family, which shape),
//! [`ModelLayout`] (its parameter layout, through [`ParamTable`]) and [`ModelCore`] (its
//! passes, through a [`ParamSource`]). The ZeRO engine, plan compilation and checkpoints are
//! written once against these; each family keeps its own llm.c-style code.

use dsplan_planner::model::{Architecture, Bias, Embeddings, Family};

use super::llama::{
    AttentionBias, LlamaConfig, LlamaCore, LlamaFamily, LlamaLayout, init_llama_params,
};
use super::masking::{RowPositions, TrainingBatch};
use super::units::{ParamSource, ParamTable, ParamUnit};
use super::{
    BatchShape, ConfigError, Gpt2Config, Gpt2Core, ModelError, ParamLayout, Recompute, init_params,
};
use crate::tensor::{Span, TensorTable};

/// The shape of a model of any implemented family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ModelConfig {
    /// GPT-2 (`GPT2LMHeadModel`).
    Gpt2(Gpt2Config),
    /// The Llama family (`LlamaForCausalLM`, `Qwen2ForCausalLM`, `MistralForCausalLM`).
    Llama(LlamaConfig),
}

impl From<Gpt2Config> for ModelConfig {
    fn from(config: Gpt2Config) -> Self {
        ModelConfig::Gpt2(config)
    }
}

impl From<LlamaConfig> for ModelConfig {
    fn from(config: LlamaConfig) -> Self {
        ModelConfig::Llama(config)
    }
}

impl ModelConfig {
    /// Checks that the sizes describe a buildable model.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            ModelConfig::Gpt2(c) => c.validate(),
            ModelConfig::Llama(c) => c.validate(),
        }
    }

    /// The vocabulary size.
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.vocab_size,
            ModelConfig::Llama(c) => c.vocab_size,
        }
    }

    /// The longest sequence the model takes.
    pub fn max_positions(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.n_positions,
            ModelConfig::Llama(c) => c.max_position_embeddings,
        }
    }

    /// The model width.
    pub fn hidden(&self) -> usize {
        match self {
            ModelConfig::Gpt2(c) => c.n_embd,
            ModelConfig::Llama(c) => c.hidden_size,
        }
    }

    /// The normalisation epsilon (LayerNorm's or RMSNorm's).
    pub fn norm_eps(&self) -> f32 {
        match self {
            ModelConfig::Gpt2(c) => c.layer_norm_epsilon,
            ModelConfig::Llama(c) => c.rms_norm_eps,
        }
    }

    /// The GPT-2 shape, if this is a GPT-2.
    pub fn gpt2(&self) -> Option<&Gpt2Config> {
        match self {
            ModelConfig::Gpt2(c) => Some(c),
            ModelConfig::Llama(_) => None,
        }
    }

    /// The parameter layout.
    pub fn layout(&self) -> ModelLayout {
        match self {
            ModelConfig::Gpt2(c) => ModelLayout::Gpt2(ParamLayout::new(c)),
            ModelConfig::Llama(c) => ModelLayout::Llama(LlamaLayout::new(c)),
        }
    }

    /// Fresh parameters as `transformers` initialises the model, from `seed`.
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        match self {
            ModelConfig::Gpt2(c) => init_params(c, &ParamLayout::new(c), seed),
            ModelConfig::Llama(c) => init_llama_params(&LlamaLayout::new(c), seed),
        }
    }

    /// The architecture the planner knows this model by.
    pub fn architecture(&self) -> Architecture {
        let n = |x: usize| x as u64;
        match self {
            ModelConfig::Gpt2(c) => Architecture {
                family: Family::Gpt2,
                layers: n(c.n_layer),
                hidden: n(c.n_embd),
                heads: n(c.n_head),
                kv_heads: n(c.n_head),
                head_dim: n(c.head_dim()),
                intermediate: 4 * n(c.n_embd),
                vocab: n(c.vocab_size),
                positions: Some(n(c.n_positions)),
                embeddings: Embeddings::Tied,
            },
            ModelConfig::Llama(c) => Architecture {
                family: match (c.family, c.attention_bias) {
                    (LlamaFamily::Qwen2, _) => Family::Qwen2,
                    (LlamaFamily::Mistral, _) => Family::Mistral,
                    (LlamaFamily::Llama, bias) => Family::Llama {
                        attention_bias: if bias == AttentionBias::Absent {
                            Bias::Absent
                        } else {
                            Bias::Present
                        },
                        mlp_bias: Bias::Absent,
                    },
                },
                layers: n(c.num_hidden_layers),
                hidden: n(c.hidden_size),
                heads: n(c.num_attention_heads),
                kv_heads: n(c.num_key_value_heads),
                head_dim: n(c.head_dim),
                intermediate: n(c.intermediate_size),
                vocab: n(c.vocab_size),
                positions: Some(n(c.max_position_embeddings)),
                embeddings: c.embeddings,
            },
        }
    }

    /// A short name of the family, for messages and graphs.
    pub fn family_name(&self) -> &'static str {
        match self {
            ModelConfig::Gpt2(_) => "gpt2",
            ModelConfig::Llama(c) => c.family.model_type(),
        }
    }
}

/// The parameter layout of a model of any family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelLayout {
    /// GPT-2's.
    Gpt2(ParamLayout),
    /// The Llama family's.
    Llama(LlamaLayout),
}

impl ModelLayout {
    /// Every parameter tensor with its Hugging Face name and shape, in buffer order.
    pub fn table(&self) -> &TensorTable {
        self.tensors()
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        self.param_count()
    }

    /// The span of the input embedding (`wte` or `embed_tokens`), which a tied `lm_head`
    /// shares.
    pub fn embedding(&self) -> Span {
        match self {
            ModelLayout::Gpt2(l) => l.wte,
            ModelLayout::Llama(l) => l.embed,
        }
    }
}

impl ParamTable for ModelLayout {
    fn tensors(&self) -> &TensorTable {
        match self {
            ModelLayout::Gpt2(l) => l.table(),
            ModelLayout::Llama(l) => l.table(),
        }
    }

    fn units(&self) -> Vec<ParamUnit> {
        match self {
            ModelLayout::Gpt2(l) => l.units(),
            ModelLayout::Llama(l) => l.units(),
        }
    }

    fn unit_span(&self, unit: ParamUnit) -> Span {
        match self {
            ModelLayout::Gpt2(l) => l.unit_span(unit),
            ModelLayout::Llama(l) => l.unit_span(unit),
        }
    }
}

/// The passes of a model of any family (see [`Gpt2Core`] and [`LlamaCore`]).
#[derive(Debug, Clone)]
pub enum ModelCore {
    /// GPT-2's.
    Gpt2(Gpt2Core),
    /// The Llama family's.
    Llama(LlamaCore),
}

impl ModelCore {
    /// The passes of `config`, sized for batches of `shape`, recomputing what `recompute`
    /// says during backward.
    pub fn new(
        config: ModelConfig,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Result<Self, ModelError> {
        Self::with_positions(config, shape, recompute, RowPositions::Arange)
    }

    /// As [`ModelCore::new`], for rows whose positions come as `positions` says (only the
    /// Llama family takes `position_ids`).
    pub fn with_positions(
        config: ModelConfig,
        shape: BatchShape,
        recompute: Recompute,
        positions: RowPositions,
    ) -> Result<Self, ModelError> {
        Ok(match (config, positions) {
            (ModelConfig::Gpt2(c), RowPositions::Arange) => {
                ModelCore::Gpt2(Gpt2Core::with_recompute(c, shape, recompute)?)
            }
            (ModelConfig::Gpt2(_), RowPositions::PositionIds) => {
                return Err(ModelError::MaskingUnsupported { family: "gpt2" });
            }
            (ModelConfig::Llama(c), RowPositions::Arange) => {
                ModelCore::Llama(LlamaCore::with_recompute(c, shape, recompute)?)
            }
            (ModelConfig::Llama(c), RowPositions::PositionIds) => {
                ModelCore::Llama(LlamaCore::for_packed_rows(c, shape, recompute)?)
            }
        })
    }

    /// Bytes of the activation arena.
    pub fn activation_bytes(&self) -> usize {
        match self {
            ModelCore::Gpt2(c) => c.activation_bytes(),
            ModelCore::Llama(c) => c.activation_bytes(),
        }
    }

    /// Forgets the activations (the parameters changed).
    pub fn invalidate(&mut self) {
        match self {
            ModelCore::Gpt2(c) => c.invalidate(),
            ModelCore::Llama(c) => c.invalidate(),
        }
    }

    /// Inference forward: the logits `(B, T, V)` of `tokens`.
    pub fn forward_logits_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
    ) -> Result<&[f32], S::Error> {
        match self {
            ModelCore::Gpt2(c) => c.forward_logits_with(source, tokens),
            ModelCore::Llama(c) => c.forward_logits_with(source, tokens),
        }
    }

    /// Training forward: the mean loss; backward will compute the gradient of
    /// `grad_scale * loss`.
    pub fn forward_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
        targets: &[Option<u32>],
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        match self {
            ModelCore::Gpt2(c) => c.forward_with(source, tokens, targets, grad_scale),
            ModelCore::Llama(c) => c.forward_with(source, tokens, targets, grad_scale),
        }
    }

    /// Training forward of `batch` (positions, attention mask and loss divisor included; see
    /// [`TrainingBatch`]): its loss; backward will compute the gradient of
    /// `grad_scale * loss`.
    pub fn forward_batch_with<S: ParamSource>(
        &mut self,
        source: &mut S,
        batch: &TrainingBatch<'_>,
        grad_scale: f32,
    ) -> Result<f32, S::Error> {
        match self {
            ModelCore::Gpt2(c) => c.forward_batch_with(source, batch, grad_scale),
            ModelCore::Llama(c) => c.forward_batch_with(source, batch, grad_scale),
        }
    }

    /// Backward through the whole model.
    pub fn backward_with<S: ParamSource>(&mut self, source: &mut S) -> Result<(), S::Error> {
        match self {
            ModelCore::Gpt2(c) => c.backward_with(source),
            ModelCore::Llama(c) => c.backward_with(source),
        }
    }
}
