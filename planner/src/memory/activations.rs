//! Activation memory: what each transformer layer stores for backward, the working set of the
//! layer being run, the input ends (token ids, the final norm's and the head's inputs) and the
//! logits/loss buffers. The plan places these bytes in time ([`crate::plan::activations`]);
//! the full estimate reads them back from the plan.
//!
//! Per layer, the tensors autograd saves are counted one by one (Korthikanti et al., arXiv
//! 2205.05198, §4 and Table 2; research/peers.md §4.3), generalised to grouped-query attention,
//! gated MLPs and Hugging Face's fp32-upcasting RMSNorm. With `s` tokens, `b` sequences, width
//! `h`, `a` heads, attention width `q`, key/value width `k`, MLP width `i`, element size `e`
//! (2 in mixed precision) and 1-byte dropout masks where the family trains with dropout:
//!
//! | tensor saved | bytes |
//! |---|---|
//! | attention norm input, MLP norm input | `n·sbh` each (`n` = 4 for upcasting RMSNorm, `e` otherwise) |
//! | QKV input (norm output) | `e·sbh` |
//! | Q, K, V | `e·sb·(q + 2k)` |
//! | softmax output (eager only) | `e·a·s²·b` |
//! | softmax dropout mask and output (eager, with dropout) | `(1 + e)·a·s²·b` |
//! | softmax statistics (flash only, fp32) | `4·a·s·b` |
//! | the fused kernel's output (flash only; the projection reads a contiguous copy) | `e·sb·q` |
//! | output-projection input | `e·sb·q` |
//! | attention dropout mask | `sbh` (with dropout) |
//! | MLP input (norm output) | `e·sbh` |
//! | dense MLP: activation input and output | `2·e·sb·i` |
//! | gated MLP: gate, up, activation output, product | `4·e·sb·i` |
//! | HF's `gelu_new` (Python arithmetic): tanh output, `0.5·x`, `1 + tanh` | `3·e·sb·i` more |
//! | MLP dropout mask | `sbh` (with dropout) |
//!
//! For GPT-2 with a fused GELU and eager attention this is Korthikanti's `sbh·(34 + 5as/h)`;
//! Hugging Face's GPT-2, whose `gelu_new` saves three more `4h`-wide tensors, stores
//! `sbh·(58 + 5as/h)`. Selective
//! recomputation and flash attention drop the `s²` terms (flash adds its fp32 statistics);
//! full checkpointing keeps only each layer's input, `e·sbh`. T5's decoder blocks add a
//! cross-attention block of the same form.
//!
//! The working set of the running layer is the largest intermediate tensor twice (an
//! operation's output, or in backward the gradients of its output and input), plus in backward
//! what is recomputed: the whole layer under full checkpointing, the score tensors under
//! selective recomputation.
//!
//! The input ends: token ids and labels (int64, `16·s·b`), the embedding dropout mask (`sbh`,
//! with dropout), the final norm's input (`n·sbh`) and the LM head's input (`e·sbh`).
//!
//! The loss follows Hugging Face's causal-LM loss: logits in the model dtype, upcast to fp32,
//! then cross-entropy, whose log-softmax output is saved. The model-dtype logits live only
//! while the forward runs: autograd saves neither them nor the upcast, and the training loop
//! keeps the loss, not the returned output. In backward the log-softmax's backward holds three
//! fp32 `s·b·vocab` tensors at once: its saved output, the gradient coming in from the NLL
//! loss (dense) and the gradient it produces. (The H200 runs of 2026-11-26 measured DeepSpeed's
//! stage-3 peaks 0.82 GB, one model-dtype logits tensor, above a count that kept the logits
//! through backward and left the incoming gradient out.)
//!
//! Bytes are split by element type ([`TypedBytes`]: model dtype, fp32, 1-byte masks) so that
//! each part is a whole number of elements of its type.

use super::layer_dims::{Dropout, LayerDims, Mlp, MlpActivation, NormKind};
use super::shape::{AttentionKernel, Checkpointing, Precision, TrainingShape};

/// Bytes split by element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TypedBytes {
    /// Tensors in the model dtype (2 bytes in mixed precision, 4 in fp32).
    pub model: u128,
    /// Tensors kept in fp32 whatever the model dtype (upcast norm inputs, softmax statistics).
    pub fp32: u128,
    /// 1-byte dropout masks.
    pub mask: u128,
}

impl TypedBytes {
    /// All of it.
    pub fn total(self) -> u128 {
        self.model + self.fp32 + self.mask
    }

    /// Part-wise sum.
    pub fn plus(self, other: TypedBytes) -> TypedBytes {
        TypedBytes {
            model: self.model + other.model,
            fp32: self.fp32 + other.fp32,
            mask: self.mask + other.mask,
        }
    }

    /// Part-wise product with `n`.
    pub fn times(self, n: u128) -> TypedBytes {
        TypedBytes {
            model: self.model * n,
            fp32: self.fp32 * n,
            mask: self.mask * n,
        }
    }
}

/// Bytes one layer stores, split into the part that scales with `s²` (attention scores) and
/// the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LayerBytes {
    /// Everything that is linear in the sequence length.
    pub linear: TypedBytes,
    /// The attention-score tensors (eager attention only).
    pub scores: TypedBytes,
}

impl LayerBytes {
    /// Both parts, by type.
    pub fn all(self) -> TypedBytes {
        self.linear.plus(self.scores)
    }

    /// Both parts, in bytes.
    pub fn total(self) -> u128 {
        self.all().total()
    }

    /// Part-wise sum (a block with a self- and a cross-attention).
    pub fn plus(self, other: LayerBytes) -> LayerBytes {
        LayerBytes {
            linear: self.linear.plus(other.linear),
            scores: self.scores.plus(other.scores),
        }
    }

    /// What the layer keeps from its forward to its backward under `checkpointing`:
    /// everything, everything but the scores, or only `checkpoint` (its input).
    pub fn stored(self, checkpointing: Checkpointing, checkpoint: TypedBytes) -> TypedBytes {
        match checkpointing {
            Checkpointing::None => self.all(),
            Checkpointing::Selective => self.linear,
            Checkpointing::Full => checkpoint,
        }
    }

    /// What its backward recomputes under `checkpointing`: nothing, the scores, or all of it.
    pub fn recomputed(self, checkpointing: Checkpointing) -> TypedBytes {
        match checkpointing {
            Checkpointing::None => TypedBytes::default(),
            Checkpointing::Selective => self.scores,
            Checkpointing::Full => self.all(),
        }
    }
}

/// The tokens of one micro-step and the element sizes.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    s: u128,
    b: u128,
    e: u128,
    mask: u128,
    norm: NormKind,
}

impl Sizes {
    fn new(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> Sizes {
        Sizes {
            s: u128::from(shape.seq_len),
            b: u128::from(shape.micro_batch),
            e: u128::from(precision.element_bytes()),
            mask: match dims.dropout {
                Dropout::Present => 1,
                Dropout::Absent => 0,
            },
            norm: dims.norm,
        }
    }

    /// `s·b·width` elements.
    fn tokens_times(&self, width: u64) -> u128 {
        self.s * self.b * u128::from(width)
    }

    /// A norm's stored input of `elements` elements: fp32 for upcasting RMSNorm, else the
    /// model dtype.
    fn norm_input(&self, elements: u128) -> TypedBytes {
        match self.norm {
            NormKind::RmsNormUpcast => TypedBytes {
                fp32: 4 * elements,
                ..TypedBytes::default()
            },
            NormKind::LayerNorm => TypedBytes {
                model: self.e * elements,
                ..TypedBytes::default()
            },
        }
    }
}

/// One attention block (self or cross) with its norm.
fn attention_block(sizes: &Sizes, dims: &LayerDims, attention: AttentionKernel) -> LayerBytes {
    let h = sizes.tokens_times(dims.hidden);
    let q = sizes.tokens_times(dims.attention_width);
    let kv = sizes.tokens_times(dims.kv_width);
    let heads = u128::from(dims.heads);
    let mut linear = sizes.norm_input(h).plus(TypedBytes {
        // QKV input, Q K V, output-projection input.
        model: sizes.e * h + sizes.e * (q + 2 * kv) + sizes.e * q,
        fp32: 0,
        // Attention dropout mask.
        mask: sizes.mask * h,
    });
    match attention {
        AttentionKernel::Eager => {
            let square = heads * sizes.s * sizes.s * sizes.b;
            // Softmax output, plus the dropout mask and dropout output when there is dropout.
            LayerBytes {
                linear,
                scores: TypedBytes {
                    model: sizes.e * square + sizes.mask * sizes.e * square,
                    fp32: 0,
                    mask: sizes.mask * square,
                },
            }
        }
        AttentionKernel::Flash => {
            linear.fp32 += 4 * heads * sizes.s * sizes.b;
            // The fused kernel's own output `(b, a, s, d)`, which it saves for its backward:
            // Hugging Face's sdpa path hands the output projection a contiguous `(b, s, a·d)`
            // copy of it, a second tensor.
            linear.model += sizes.e * q;
            LayerBytes {
                linear,
                scores: TypedBytes::default(),
            }
        }
    }
}

/// The MLP block with its norm.
fn mlp_block(sizes: &Sizes, dims: &LayerDims) -> TypedBytes {
    let h = sizes.tokens_times(dims.hidden);
    let i = sizes.tokens_times(dims.intermediate);
    let inner = match dims.mlp {
        Mlp::Dense => 2 * sizes.e * i,
        Mlp::Gated => 4 * sizes.e * i,
    } + match dims.activation {
        MlpActivation::Fused => 0,
        MlpActivation::TanhGeluComposite => 3 * sizes.e * i,
    };
    sizes.norm_input(h).plus(TypedBytes {
        model: sizes.e * h + inner,
        fp32: 0,
        mask: sizes.mask * h,
    })
}

/// Bytes one self-attention layer stores without any recomputation.
pub fn layer_bytes(
    shape: &TrainingShape,
    precision: Precision,
    dims: &LayerDims,
    attention: AttentionKernel,
) -> LayerBytes {
    let sizes = Sizes::new(shape, precision, dims);
    let attention = attention_block(&sizes, dims, attention);
    LayerBytes {
        linear: attention.linear.plus(mlp_block(&sizes, dims)),
        scores: attention.scores,
    }
}

/// Bytes the extra cross-attention of a T5 decoder block stores.
pub fn cross_attention_bytes(
    shape: &TrainingShape,
    precision: Precision,
    dims: &LayerDims,
) -> LayerBytes {
    let sizes = Sizes::new(shape, precision, dims);
    attention_block(&sizes, dims, shape.attention)
}

/// A layer's input, all that full checkpointing keeps of it: `e·sbh`.
pub fn checkpoint_bytes(
    shape: &TrainingShape,
    precision: Precision,
    dims: &LayerDims,
) -> TypedBytes {
    let sizes = Sizes::new(shape, precision, dims);
    TypedBytes {
        model: sizes.e * sizes.tokens_times(dims.hidden),
        ..TypedBytes::default()
    }
}

/// The largest intermediate tensor of a layer, in the model dtype: the score matrix under eager
/// attention, or the MLP's inner activation. The running layer's working set is twice this.
pub fn largest_intermediate(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> u128 {
    let sizes = Sizes::new(shape, precision, dims);
    let scores = match shape.attention {
        AttentionKernel::Eager => sizes.e * u128::from(dims.heads) * sizes.s * sizes.s * sizes.b,
        AttentionKernel::Flash => 0,
    };
    let mlp = sizes.e * sizes.tokens_times(dims.intermediate);
    scores.max(mlp)
}

/// The tensors at the two ends of the layer stack that live through forward and backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputEnds {
    /// Token ids and labels, int64: `16·s·b` bytes.
    pub ids_and_labels: u128,
    /// The embedding dropout mask: `sbh` bytes with dropout, else 0.
    pub embedding_mask: u128,
    /// The final norm's stored input: `n·sbh`.
    pub final_norm_input: TypedBytes,
    /// The LM head's input: `e·sbh`, model dtype.
    pub head_input: u128,
}

/// The input ends of one micro-step.
pub fn input_ends(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> InputEnds {
    let sizes = Sizes::new(shape, precision, dims);
    let h = sizes.tokens_times(dims.hidden);
    InputEnds {
        ids_and_labels: 16 * sizes.s * sizes.b,
        embedding_mask: sizes.mask * h,
        final_norm_input: sizes.norm_input(h),
        head_input: sizes.e * h,
    }
}

/// The logits and the loss's buffers of one micro-step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossBytes {
    /// Logits in the model dtype, `e·s·b·vocab`, during the head's forward only.
    pub logits: u128,
    /// The fp32 upcast of the logits in the forward (mixed precision only): `4·s·b·vocab`.
    pub upcast: u128,
    /// The saved log-softmax output, fp32: `4·s·b·vocab`.
    pub log_softmax: u128,
    /// The gradient the NLL loss hands the log-softmax in backward, fp32 and dense:
    /// `4·s·b·vocab`.
    pub log_softmax_output_grad: u128,
    /// The gradient the log-softmax produces (w.r.t. its fp32 input): `4·s·b·vocab`.
    pub log_softmax_grad: u128,
}

/// The logits and loss of one micro-step.
pub fn loss_bytes(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> LossBytes {
    let sizes = Sizes::new(shape, precision, dims);
    let s_b_v = sizes.tokens_times(dims.vocab);
    LossBytes {
        logits: sizes.e * s_b_v,
        upcast: if precision.is_mixed() { 4 * s_b_v } else { 0 },
        log_softmax: 4 * s_b_v,
        log_softmax_output_grad: 4 * s_b_v,
        log_softmax_grad: 4 * s_b_v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::shape::CheckpointPlacement;

    /// A GPT layer with a fused GELU (Korthikanti's model).
    fn gpt(heads: u64, hidden: u64) -> LayerDims {
        LayerDims {
            self_attention_layers: 1,
            cross_attention_layers: 0,
            hidden,
            heads,
            attention_width: hidden,
            kv_width: hidden,
            intermediate: 4 * hidden,
            vocab: 50_257,
            mlp: Mlp::Dense,
            activation: MlpActivation::Fused,
            norm: NormKind::LayerNorm,
            dropout: Dropout::Present,
        }
    }

    fn shape(seq_len: u64, micro_batch: u64, attention: AttentionKernel) -> TrainingShape {
        TrainingShape {
            seq_len,
            micro_batch,
            checkpointing: Checkpointing::None,
            checkpoint_placement: CheckpointPlacement::Gpu,
            attention,
        }
    }

    #[test]
    fn gpt_layer_is_korthikanti_table_2() {
        // sbh·(34 + 5·a·s/h) bytes with fp16 activations and 1-byte masks.
        let (s, b, h, a) = (2048u64, 4u64, 2560u64, 32u64);
        let dims = gpt(a, h);
        let bytes = layer_bytes(
            &shape(s, b, AttentionKernel::Eager),
            Precision::Fp16,
            &dims,
            AttentionKernel::Eager,
        );
        let sbh = u128::from(s * b * h);
        assert_eq!(bytes.linear.total(), 34 * sbh);
        assert_eq!(bytes.linear.mask, 2 * sbh);
        assert_eq!(bytes.scores.total(), 5 * u128::from(a * s * s * b));
        // Flash attention drops the score term and adds fp32 statistics per row and head,
        // and its own saved output next to the projection's contiguous copy (2 bytes more).
        let flash = layer_bytes(
            &shape(s, b, AttentionKernel::Flash),
            Precision::Fp16,
            &dims,
            AttentionKernel::Flash,
        );
        assert_eq!(flash.scores.total(), 0);
        assert_eq!(flash.linear.total(), 36 * sbh + 4 * u128::from(a * s * b));
        assert_eq!(flash.linear.fp32, 4 * u128::from(a * s * b));
        // Hugging Face's GPT-2: `gelu_new` saves three more 4h-wide tensors, 24 bytes per
        // token and channel in 16 bits: sbh·(58 + 5as/h).
        let hf = LayerDims {
            activation: MlpActivation::TanhGeluComposite,
            ..dims
        };
        let bytes = layer_bytes(
            &shape(s, b, AttentionKernel::Eager),
            Precision::Fp16,
            &hf,
            AttentionKernel::Eager,
        );
        assert_eq!(bytes.linear.total(), 58 * sbh);
        assert_eq!(bytes.scores.total(), 5 * u128::from(a * s * s * b));
    }

    #[test]
    fn gpt2_is_counted_with_hugging_faces_gelu_new() {
        use crate::model::{LmHead, load};
        let activation = |name: &str| {
            let spec = load(name, LmHead::Exclude).expect("preset");
            let arch = spec.architecture.expect("a preset has its architecture");
            crate::memory::layer_dims(&arch).activation
        };
        assert_eq!(activation("gpt2"), MlpActivation::TanhGeluComposite);
        assert_eq!(activation("gpt2-medium"), MlpActivation::TanhGeluComposite);
        assert_eq!(activation("llama-2-7b"), MlpActivation::Fused);
    }

    #[test]
    fn gated_rms_layers_count_their_upcasts() {
        // Llama-2-7B: no dropout, fp32 norm inputs, SwiGLU.
        let dims = LayerDims {
            self_attention_layers: 32,
            cross_attention_layers: 0,
            hidden: 4096,
            heads: 32,
            attention_width: 4096,
            kv_width: 4096,
            intermediate: 11_008,
            vocab: 32_000,
            mlp: Mlp::Gated,
            activation: MlpActivation::Fused,
            norm: NormKind::RmsNormUpcast,
            dropout: Dropout::Absent,
        };
        let bytes = layer_bytes(
            &shape(1, 1, AttentionKernel::Eager),
            Precision::Bf16,
            &dims,
            AttentionKernel::Eager,
        );
        // Per token: norms 2·4h (fp32), QKV input 2h, Q K V 6h, out input 2h, MLP input 2h,
        // 4 x 2i.
        assert_eq!(bytes.linear.fp32, 8 * 4096);
        assert_eq!(
            bytes.linear.model,
            2 * 4096 + 6 * 4096 + 2 * 4096 + 2 * 4096 + 8 * 11_008_u128
        );
        assert_eq!(bytes.linear.mask, 0);
        assert_eq!(bytes.scores.total(), 2 * 32);
    }

    #[test]
    fn checkpointing_keeps_and_recomputes_its_share() {
        let dims = gpt(16, 1024);
        let shape = shape(1024, 2, AttentionKernel::Eager);
        let layer = layer_bytes(&shape, Precision::Bf16, &dims, AttentionKernel::Eager);
        let input = checkpoint_bytes(&shape, Precision::Bf16, &dims);
        assert_eq!(input.total(), 2 * 1024 * 2 * 1024);
        assert_eq!(layer.stored(Checkpointing::None, input), layer.all());
        assert_eq!(layer.stored(Checkpointing::Selective, input), layer.linear);
        assert_eq!(layer.stored(Checkpointing::Full, input), input);
        assert_eq!(layer.recomputed(Checkpointing::None).total(), 0);
        assert_eq!(layer.recomputed(Checkpointing::Selective), layer.scores);
        assert_eq!(layer.recomputed(Checkpointing::Full).total(), layer.total());
        // Under flash the MLP's inner activation is the largest intermediate.
        let flash = TrainingShape {
            attention: AttentionKernel::Flash,
            ..shape
        };
        assert_eq!(
            largest_intermediate(&flash, Precision::Bf16, &dims),
            2 * 1024 * 2 * 4096
        );
    }

    #[test]
    fn logits_and_loss_scale_with_the_vocabulary() {
        let dims = gpt(12, 768);
        let shape = shape(1024, 1, AttentionKernel::Flash);
        let loss = loss_bytes(&shape, Precision::Bf16, &dims);
        assert_eq!(loss.logits, 2 * 1024 * 50_257);
        assert_eq!(loss.upcast + loss.log_softmax, 8 * 1024 * 50_257);
        // Backward's three fp32 tensors: the saved output and the gradients in and out.
        assert_eq!(
            loss.log_softmax + loss.log_softmax_output_grad + loss.log_softmax_grad,
            12 * 1024 * 50_257
        );
        assert_eq!(
            loss_bytes(&shape, Precision::Fp32, &dims).upcast,
            0,
            "no upcast in fp32"
        );
        let ends = input_ends(&shape, Precision::Bf16, &dims);
        assert_eq!(ends.ids_and_labels, 16 * 1024);
        assert_eq!(ends.embedding_mask, 1024 * 768);
        assert_eq!(
            ends.final_norm_input.model + ends.head_input,
            4 * 1024 * 768
        );
    }
}
