//! Every parameter tensor of an [`Architecture`], named as in Hugging Face `transformers`.
//!
//! One function per family lists the tensors of the base model (what `AutoModel` builds) and,
//! with [`LmHead::Include`], the language-modelling head of the training class
//! (`*ForCausalLM`, `GPT2LMHeadModel`, `T5ForConditionalGeneration`, `BertForMaskedLM`). Tied
//! heads are listed as sharing the embedding's storage, so they add to their module's size
//! (as in DeepSpeed's largest-layer count) but not to the total.

use super::LmHead;
use super::architecture::{Architecture, Bias, Embeddings, Family, FeedForward};
use super::tensors::TensorEntry;

/// The tensor list being built.
struct Layout {
    tensors: Vec<TensorEntry>,
}

impl Layout {
    fn weight(&mut self, module: &str, numel: u64) {
        self.tensors
            .push(TensorEntry::owned(format!("{module}.weight"), numel));
    }

    /// `nn.Linear(inputs, outputs)` (or GPT-2's `Conv1D`, same count).
    fn linear(&mut self, module: &str, inputs: u64, outputs: u64, bias: Bias) {
        self.weight(module, inputs.saturating_mul(outputs));
        if bias == Bias::Present {
            self.tensors
                .push(TensorEntry::owned(format!("{module}.bias"), outputs));
        }
    }

    /// A normalisation layer: a scale vector and optionally a shift.
    fn norm(&mut self, module: &str, width: u64, bias: Bias) {
        self.weight(module, width);
        if bias == Bias::Present {
            self.tensors
                .push(TensorEntry::owned(format!("{module}.bias"), width));
        }
    }

    /// The output projection `vocab x hidden`, tied to `embedding` or its own.
    fn lm_head(&mut self, module: &str, arch: &Architecture, embedding: &str) {
        let numel = arch.vocab.saturating_mul(arch.hidden);
        let name = format!("{module}.weight");
        self.tensors.push(match arch.embeddings {
            Embeddings::Tied => TensorEntry::shared(name, numel, format!("{embedding}.weight")),
            Embeddings::Untied => TensorEntry::owned(name, numel),
        });
    }
}

/// All parameter tensors of `arch`, with or without the LM head.
pub fn tensors(arch: &Architecture, lm_head: LmHead) -> Vec<TensorEntry> {
    let mut layout = Layout {
        tensors: Vec::new(),
    };
    match arch.family {
        Family::Gpt2 => gpt2(&mut layout, arch, lm_head),
        Family::Llama {
            attention_bias,
            mlp_bias,
        } => {
            let biases = LlamaBiases {
                qkv: attention_bias,
                output: attention_bias,
                mlp: mlp_bias,
            };
            llama(&mut layout, arch, lm_head, biases);
        }
        Family::Mistral => {
            let biases = LlamaBiases {
                qkv: Bias::Absent,
                output: Bias::Absent,
                mlp: Bias::Absent,
            };
            llama(&mut layout, arch, lm_head, biases);
        }
        Family::Qwen2 => {
            let biases = LlamaBiases {
                qkv: Bias::Present,
                output: Bias::Absent,
                mlp: Bias::Absent,
            };
            llama(&mut layout, arch, lm_head, biases);
        }
        Family::T5 {
            decoder_layers,
            feed_forward,
            relative_attention_buckets,
        } => {
            let t5_shape = T5Shape {
                decoder_layers,
                feed_forward,
                buckets: relative_attention_buckets,
            };
            t5(&mut layout, arch, lm_head, t5_shape);
        }
        Family::Bert { type_vocab_size } => bert(&mut layout, arch, lm_head, type_vocab_size),
        Family::Bloom => bloom(&mut layout, arch, lm_head),
    }
    layout.tensors
}

fn gpt2(layout: &mut Layout, arch: &Architecture, lm_head: LmHead) {
    let h = arch.hidden;
    layout.weight("transformer.wte", arch.vocab.saturating_mul(h));
    layout.weight(
        "transformer.wpe",
        arch.positions.unwrap_or(0).saturating_mul(h),
    );
    for layer in 0..arch.layers {
        let block = format!("transformer.h.{layer}");
        layout.norm(&format!("{block}.ln_1"), h, Bias::Present);
        layout.linear(&format!("{block}.attn.c_attn"), h, 3 * h, Bias::Present);
        layout.linear(&format!("{block}.attn.c_proj"), h, h, Bias::Present);
        layout.norm(&format!("{block}.ln_2"), h, Bias::Present);
        layout.linear(
            &format!("{block}.mlp.c_fc"),
            h,
            arch.intermediate,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.mlp.c_proj"),
            arch.intermediate,
            h,
            Bias::Present,
        );
    }
    layout.norm("transformer.ln_f", h, Bias::Present);
    if lm_head == LmHead::Include {
        layout.lm_head("lm_head", arch, "transformer.wte");
    }
}

/// Which projections of the Llama layout carry biases.
struct LlamaBiases {
    qkv: Bias,
    output: Bias,
    mlp: Bias,
}

fn llama(layout: &mut Layout, arch: &Architecture, lm_head: LmHead, biases: LlamaBiases) {
    let h = arch.hidden;
    layout.weight("model.embed_tokens", arch.vocab.saturating_mul(h));
    for layer in 0..arch.layers {
        let block = format!("model.layers.{layer}");
        layout.linear(
            &format!("{block}.self_attn.q_proj"),
            h,
            arch.attention_width(),
            biases.qkv,
        );
        layout.linear(
            &format!("{block}.self_attn.k_proj"),
            h,
            arch.kv_width(),
            biases.qkv,
        );
        layout.linear(
            &format!("{block}.self_attn.v_proj"),
            h,
            arch.kv_width(),
            biases.qkv,
        );
        layout.linear(
            &format!("{block}.self_attn.o_proj"),
            arch.attention_width(),
            h,
            biases.output,
        );
        layout.linear(
            &format!("{block}.mlp.gate_proj"),
            h,
            arch.intermediate,
            biases.mlp,
        );
        layout.linear(
            &format!("{block}.mlp.up_proj"),
            h,
            arch.intermediate,
            biases.mlp,
        );
        layout.linear(
            &format!("{block}.mlp.down_proj"),
            arch.intermediate,
            h,
            biases.mlp,
        );
        layout.norm(&format!("{block}.input_layernorm"), h, Bias::Absent);
        layout.norm(
            &format!("{block}.post_attention_layernorm"),
            h,
            Bias::Absent,
        );
    }
    layout.norm("model.norm", h, Bias::Absent);
    if lm_head == LmHead::Include {
        layout.lm_head("lm_head", arch, "model.embed_tokens");
    }
}

/// T5's knobs beyond the common shape.
struct T5Shape {
    decoder_layers: u64,
    feed_forward: FeedForward,
    buckets: u64,
}

fn t5(layout: &mut Layout, arch: &Architecture, lm_head: LmHead, shape: T5Shape) {
    let d = arch.hidden;
    layout.weight("shared", arch.vocab.saturating_mul(d));
    for (stack, blocks) in [("encoder", arch.layers), ("decoder", shape.decoder_layers)] {
        for block in 0..blocks {
            let prefix = format!("{stack}.block.{block}.layer");
            t5_attention(
                layout,
                arch,
                &format!("{prefix}.0.SelfAttention"),
                block == 0,
                shape.buckets,
            );
            layout.norm(&format!("{prefix}.0.layer_norm"), d, Bias::Absent);
            let mut sublayer = 1;
            if stack == "decoder" {
                t5_attention(
                    layout,
                    arch,
                    &format!("{prefix}.1.EncDecAttention"),
                    false,
                    shape.buckets,
                );
                layout.norm(&format!("{prefix}.1.layer_norm"), d, Bias::Absent);
                sublayer = 2;
            }
            let ff = format!("{prefix}.{sublayer}.DenseReluDense");
            match shape.feed_forward {
                FeedForward::Dense => {
                    layout.linear(&format!("{ff}.wi"), d, arch.intermediate, Bias::Absent)
                }
                FeedForward::Gated => {
                    layout.linear(&format!("{ff}.wi_0"), d, arch.intermediate, Bias::Absent);
                    layout.linear(&format!("{ff}.wi_1"), d, arch.intermediate, Bias::Absent);
                }
            }
            layout.linear(&format!("{ff}.wo"), arch.intermediate, d, Bias::Absent);
            layout.norm(&format!("{prefix}.{sublayer}.layer_norm"), d, Bias::Absent);
        }
        layout.norm(&format!("{stack}.final_layer_norm"), d, Bias::Absent);
    }
    if lm_head == LmHead::Include {
        layout.lm_head("lm_head", arch, "shared");
    }
}

fn t5_attention(
    layout: &mut Layout,
    arch: &Architecture,
    module: &str,
    relative_bias: bool,
    buckets: u64,
) {
    let d = arch.hidden;
    let inner = arch.attention_width();
    for projection in ["q", "k", "v"] {
        layout.linear(&format!("{module}.{projection}"), d, inner, Bias::Absent);
    }
    layout.linear(&format!("{module}.o"), inner, d, Bias::Absent);
    if relative_bias {
        layout.weight(
            &format!("{module}.relative_attention_bias"),
            buckets.saturating_mul(arch.heads),
        );
    }
}

fn bert(layout: &mut Layout, arch: &Architecture, lm_head: LmHead, type_vocab_size: u64) {
    let h = arch.hidden;
    // BertForMaskedLM nests the encoder under `bert.` and builds it without the pooler.
    let base = if lm_head == LmHead::Include {
        "bert."
    } else {
        ""
    };
    let embeddings = format!("{base}embeddings");
    layout.weight(
        &format!("{embeddings}.word_embeddings"),
        arch.vocab.saturating_mul(h),
    );
    layout.weight(
        &format!("{embeddings}.position_embeddings"),
        arch.positions.unwrap_or(0).saturating_mul(h),
    );
    layout.weight(
        &format!("{embeddings}.token_type_embeddings"),
        type_vocab_size.saturating_mul(h),
    );
    layout.norm(&format!("{embeddings}.LayerNorm"), h, Bias::Present);
    let width = arch.attention_width();
    for layer in 0..arch.layers {
        let block = format!("{base}encoder.layer.{layer}");
        for projection in ["query", "key", "value"] {
            layout.linear(
                &format!("{block}.attention.self.{projection}"),
                h,
                width,
                Bias::Present,
            );
        }
        layout.linear(
            &format!("{block}.attention.output.dense"),
            width,
            h,
            Bias::Present,
        );
        layout.norm(
            &format!("{block}.attention.output.LayerNorm"),
            h,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.intermediate.dense"),
            h,
            arch.intermediate,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.output.dense"),
            arch.intermediate,
            h,
            Bias::Present,
        );
        layout.norm(&format!("{block}.output.LayerNorm"), h, Bias::Present);
    }
    match lm_head {
        LmHead::Exclude => layout.linear("pooler.dense", h, h, Bias::Present),
        LmHead::Include => {
            // `cls.predictions` owns the output bias; its `decoder` Linear holds the (tied)
            // word-embedding matrix and the same bias again.
            layout
                .tensors
                .push(TensorEntry::owned("cls.predictions.bias", arch.vocab));
            layout.linear("cls.predictions.transform.dense", h, h, Bias::Present);
            layout.norm("cls.predictions.transform.LayerNorm", h, Bias::Present);
            layout.lm_head(
                "cls.predictions.decoder",
                arch,
                &format!("{embeddings}.word_embeddings"),
            );
            layout.tensors.push(TensorEntry::shared(
                "cls.predictions.decoder.bias",
                arch.vocab,
                "cls.predictions.bias",
            ));
        }
    }
}

fn bloom(layout: &mut Layout, arch: &Architecture, lm_head: LmHead) {
    let h = arch.hidden;
    layout.weight("transformer.word_embeddings", arch.vocab.saturating_mul(h));
    layout.norm("transformer.word_embeddings_layernorm", h, Bias::Present);
    for layer in 0..arch.layers {
        let block = format!("transformer.h.{layer}");
        layout.norm(&format!("{block}.input_layernorm"), h, Bias::Present);
        layout.linear(
            &format!("{block}.self_attention.query_key_value"),
            h,
            3 * h,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.self_attention.dense"),
            h,
            h,
            Bias::Present,
        );
        layout.norm(
            &format!("{block}.post_attention_layernorm"),
            h,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.mlp.dense_h_to_4h"),
            h,
            arch.intermediate,
            Bias::Present,
        );
        layout.linear(
            &format!("{block}.mlp.dense_4h_to_h"),
            arch.intermediate,
            h,
            Bias::Present,
        );
    }
    layout.norm("transformer.ln_f", h, Bias::Present);
    if lm_head == LmHead::Include {
        layout.lm_head("lm_head", arch, "transformer.word_embeddings");
    }
}
