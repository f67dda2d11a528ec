//! [`LayerDims`]: the per-layer dimensions of an architecture the activation formulas read,
//! with the family traits that change what a layer stores (norm kind, dropout, gated MLP, the
//! activation function's saved tensors).

use serde::Serialize;

use crate::model::architecture::{Architecture, Family, FeedForward};

/// How a family normalises, which decides the bytes its norms store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NormKind {
    /// `nn.LayerNorm`: the input is stored in the activation dtype.
    LayerNorm,
    /// Hugging Face's RMSNorm (Llama, Mistral, Qwen2, T5): the input is upcast, so an fp32
    /// copy (4 bytes per element) is what backward keeps.
    RmsNormUpcast,
}

/// Whether the family's default config trains with dropout (so 1-byte masks are stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dropout {
    /// Dropout probability > 0 (GPT-2, BERT, T5): masks are stored.
    Present,
    /// Dropout 0 (Llama, Mistral, Qwen2, BLOOM): PyTorch skips it, nothing is stored.
    Absent,
}

/// Whether the MLP is gated (SwiGLU, gated-GELU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mlp {
    /// `up -> activation -> down`.
    Dense,
    /// `down(act(gate(x)) * up(x))`.
    Gated,
}

/// What the MLP's activation function saves for backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MlpActivation {
    /// One PyTorch operation (`F.gelu`, `F.silu`, `F.relu`, HF's `gelu_pytorch_tanh`): it saves
    /// its input, the MLP's inner tensor, once.
    Fused,
    /// Hugging Face's `gelu_new` (`NewGELUActivation`, GPT-2's default `activation_function`),
    /// written as Python arithmetic: autograd saves its input and three more inner-width
    /// tensors (the tanh output, `0.5·x` and `1 + tanh`). Counted with saved-tensor hooks
    /// (transformers 5.23: 4 inner-width tensors against 1 for `F.gelu`) and seen on an H200 in
    /// DeepSpeed's peak (bench/results/gpu/2026-11-26-nvidia-h200.json).
    TanhGeluComposite,
}

/// The dimensions the activation formulas use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LayerDims {
    /// Decoder (or encoder) blocks with one attention each.
    pub self_attention_layers: u64,
    /// Blocks with an extra cross-attention (T5's decoder).
    pub cross_attention_layers: u64,
    /// Model width.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// `heads x head_dim`.
    pub attention_width: u64,
    /// `kv_heads x head_dim`.
    pub kv_width: u64,
    /// MLP inner width.
    pub intermediate: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Dense or gated MLP.
    pub mlp: Mlp,
    /// What the MLP's activation saves.
    pub activation: MlpActivation,
    /// Norm kind.
    pub norm: NormKind,
    /// Dropout or not.
    pub dropout: Dropout,
}

/// The per-layer dimensions of an architecture.
pub fn layer_dims(arch: &Architecture) -> LayerDims {
    let (self_layers, cross_layers) = match arch.family {
        Family::T5 { decoder_layers, .. } => (arch.layers + decoder_layers, decoder_layers),
        _ => (arch.layers, 0),
    };
    let mlp = match arch.family {
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 => Mlp::Gated,
        Family::T5 {
            feed_forward: FeedForward::Gated,
            ..
        } => Mlp::Gated,
        _ => Mlp::Dense,
    };
    // GPT-2's config defaults to `gelu_new`; the other families' activations are one op
    // (T5's `gated-gelu` also runs `gelu_new`: not measured yet, so counted as fused).
    let activation = match arch.family {
        Family::Gpt2 => MlpActivation::TanhGeluComposite,
        _ => MlpActivation::Fused,
    };
    let norm = match arch.family {
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 | Family::T5 { .. } => {
            NormKind::RmsNormUpcast
        }
        Family::Gpt2 | Family::Bert { .. } | Family::Bloom => NormKind::LayerNorm,
    };
    let dropout = match arch.family {
        Family::Gpt2 | Family::Bert { .. } | Family::T5 { .. } => Dropout::Present,
        Family::Llama { .. } | Family::Mistral | Family::Qwen2 | Family::Bloom => Dropout::Absent,
    };
    LayerDims {
        self_attention_layers: self_layers,
        cross_attention_layers: cross_layers,
        hidden: arch.hidden,
        heads: arch.heads,
        attention_width: arch.attention_width(),
        kv_width: arch.kv_width(),
        intermediate: arch.intermediate,
        vocab: arch.vocab,
        mlp,
        activation,
        norm,
        dropout,
    }
}
