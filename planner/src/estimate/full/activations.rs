//! Activation memory: what each transformer layer stores for backward, the working set of the
//! layer being run, the embedding ends and the logits/loss buffers.
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
//! | output-projection input | `e·sb·q` |
//! | attention dropout mask | `sbh` (with dropout) |
//! | MLP input (norm output) | `e·sbh` |
//! | dense MLP: activation input and output | `2·e·sb·i` |
//! | gated MLP: gate, up, activation output, product | `4·e·sb·i` |
//! | MLP dropout mask | `sbh` (with dropout) |
//!
//! For GPT-2 with eager attention this is Korthikanti's `sbh·(34 + 5as/h)`. Selective
//! recomputation and flash attention drop the `s²` terms (flash adds its fp32 statistics);
//! full checkpointing keeps only each layer's input, `e·sbh`. T5's decoder blocks add a
//! cross-attention block of the same form.
//!
//! The working set of the running layer is the largest intermediate tensor twice (an
//! operation's output, or in backward the gradients of its output and input), plus in backward
//! what is recomputed: a whole layer under full checkpointing, the score tensors under
//! selective recomputation.
//!
//! The loss follows Hugging Face's causal-LM loss: logits in the model dtype (kept by the
//! returned output), upcast to fp32, then cross-entropy, whose log-softmax output is saved;
//! in backward its gradient joins it.

use super::model_dims::{Dropout, LayerDims, Mlp, NormKind};
use super::rows::{Category, Device, Phase, PhaseBytes, Row, Term, saturate};
use super::setup::{AttentionKernel, CheckpointPlacement, Checkpointing, Precision, TrainingShape};

/// The tokens of one micro-step and the element sizes.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    s: u128,
    b: u128,
    e: u128,
    mask: u128,
    norm: u128,
}

impl Sizes {
    fn new(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> Sizes {
        let e = u128::from(precision.element_bytes());
        Sizes {
            s: u128::from(shape.seq_len),
            b: u128::from(shape.micro_batch),
            e,
            mask: match dims.dropout {
                Dropout::Present => 1,
                Dropout::Absent => 0,
            },
            norm: match dims.norm {
                NormKind::RmsNormUpcast => 4,
                NormKind::LayerNorm => e,
            },
        }
    }

    /// `s·b·width` elements.
    fn tokens_times(&self, width: u64) -> u128 {
        self.s * self.b * u128::from(width)
    }
}

/// Bytes one layer stores, split into the part that scales with `s²` (attention scores) and
/// the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerBytes {
    /// Everything that is linear in the sequence length.
    pub linear: u128,
    /// The attention-score tensors (eager attention only).
    pub scores: u128,
}

impl LayerBytes {
    /// Both parts.
    pub fn total(self) -> u128 {
        self.linear + self.scores
    }
}

/// One attention block (self or cross) with its norm.
fn attention_block(sizes: &Sizes, dims: &LayerDims, attention: AttentionKernel) -> LayerBytes {
    let h = sizes.tokens_times(dims.hidden);
    let q = sizes.tokens_times(dims.attention_width);
    let kv = sizes.tokens_times(dims.kv_width);
    let heads = u128::from(dims.heads);
    let linear = sizes.norm * h       // norm input
        + sizes.e * h                 // QKV input
        + sizes.e * (q + 2 * kv)      // Q, K, V
        + sizes.e * q                 // output-projection input
        + sizes.mask * h; // attention dropout mask
    match attention {
        AttentionKernel::Eager => {
            let square = heads * sizes.s * sizes.s * sizes.b;
            // Softmax output, plus the dropout mask and dropout output when there is dropout.
            let per_score = sizes.e + sizes.mask * (1 + sizes.e);
            LayerBytes {
                linear,
                scores: per_score * square,
            }
        }
        AttentionKernel::Flash => LayerBytes {
            linear: linear + 4 * heads * sizes.s * sizes.b,
            scores: 0,
        },
    }
}

/// The MLP block with its norm.
fn mlp_block(sizes: &Sizes, dims: &LayerDims) -> u128 {
    let h = sizes.tokens_times(dims.hidden);
    let i = sizes.tokens_times(dims.intermediate);
    let inner = match dims.mlp {
        Mlp::Dense => 2 * sizes.e * i,
        Mlp::Gated => 4 * sizes.e * i,
    };
    sizes.norm * h + sizes.e * h + inner + sizes.mask * h
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
        linear: attention.linear + mlp_block(&sizes, dims),
        scores: attention.scores,
    }
}

/// Bytes stored by all layers, and by the largest single layer, without recomputation.
struct ModelLayers {
    all: LayerBytes,
    largest: LayerBytes,
    layers: u128,
}

fn model_layers(shape: &TrainingShape, precision: Precision, dims: &LayerDims) -> ModelLayers {
    let sizes = Sizes::new(shape, precision, dims);
    let plain = layer_bytes(shape, precision, dims, shape.attention);
    let cross = attention_block(&sizes, dims, shape.attention);
    let layers = u128::from(dims.self_attention_layers);
    let crossed = u128::from(dims.cross_attention_layers);
    let all = LayerBytes {
        linear: layers * plain.linear + crossed * cross.linear,
        scores: layers * plain.scores + crossed * cross.scores,
    };
    let largest = if crossed > 0 {
        LayerBytes {
            linear: plain.linear + cross.linear,
            scores: plain.scores + cross.scores,
        }
    } else {
        plain
    };
    ModelLayers {
        all,
        largest,
        layers: layers.max(1),
    }
}

/// The activation rows (all on the GPU except checkpoints kept in host memory).
pub fn activation_rows(
    shape: &TrainingShape,
    precision: Precision,
    dims: &LayerDims,
    ranks_per_node: u64,
) -> Vec<Row> {
    let sizes = Sizes::new(shape, precision, dims);
    let layers = model_layers(shape, precision, dims);
    let s_b_h = sizes.tokens_times(dims.hidden);
    let mut rows = Vec::new();
    let live = [Phase::Forward, Phase::Backward];
    let kernel = match shape.attention {
        AttentionKernel::Eager => "eager attention",
        AttentionKernel::Flash => "flash attention",
    };

    // Token ids and labels (int64), the embedding dropout mask, the final norm's input and the
    // LM head's input.
    let embedding = 16 * sizes.s * sizes.b + sizes.mask * s_b_h + (sizes.norm + sizes.e) * s_b_h;
    rows.push(Row::new(
        Term::EmbeddingActivations,
        Category::Activations,
        Device::Gpu,
        PhaseBytes::during(&live, saturate(embedding)),
        format!(
            "ids+labels 16·s·b + final norm input {}·s·b·h + head input {}·s·b·h{}",
            sizes.norm,
            sizes.e,
            if sizes.mask > 0 {
                " + embedding dropout mask s·b·h"
            } else {
                ""
            }
        ),
    ));

    let (stored, stored_formula) = match shape.checkpointing {
        Checkpointing::None => (
            layers.all.total(),
            format!("{} layers, nothing recomputed, {kernel}", layers.layers),
        ),
        Checkpointing::Selective => (
            layers.all.linear,
            format!(
                "{} layers, attention scores recomputed, {kernel}",
                layers.layers
            ),
        ),
        Checkpointing::Full => (
            layers.layers * sizes.e * s_b_h,
            format!(
                "{} layer inputs (full checkpointing): {}·s·b·h each",
                layers.layers, sizes.e
            ),
        ),
    };
    let checkpoints_on_host = shape.checkpointing == Checkpointing::Full
        && shape.checkpoint_placement == CheckpointPlacement::Cpu;
    if checkpoints_on_host {
        let per_node = stored * u128::from(ranks_per_node);
        rows.push(Row::new(
            Term::LayerActivations,
            Category::Activations,
            Device::CpuPinned,
            PhaseBytes::during(&live, saturate(per_node)),
            if ranks_per_node > 1 {
                format!(
                    "{stored_formula}, in host memory (cpu_checkpointing) x {ranks_per_node} ranks"
                )
            } else {
                format!("{stored_formula}, in host memory (cpu_checkpointing)")
            },
        ));
    } else {
        rows.push(Row::new(
            Term::LayerActivations,
            Category::Activations,
            Device::Gpu,
            PhaseBytes::during(&live, saturate(stored)),
            stored_formula,
        ));
    }

    // Working set of the running layer.
    let largest_intermediate = {
        let scores = match shape.attention {
            AttentionKernel::Eager => {
                sizes.e * u128::from(dims.heads) * sizes.s * sizes.s * sizes.b
            }
            AttentionKernel::Flash => 0,
        };
        let mlp = sizes.e * sizes.tokens_times(dims.intermediate);
        scores.max(mlp)
    };
    let forward = 2 * largest_intermediate;
    let recomputed = match shape.checkpointing {
        Checkpointing::None => 0,
        Checkpointing::Selective => layers.largest.scores,
        Checkpointing::Full => layers.largest.total(),
    };
    let backward = recomputed + 2 * largest_intermediate;
    let mut working = PhaseBytes::default();
    working.set(Phase::Forward, saturate(forward));
    working.set(Phase::Backward, saturate(backward));
    rows.push(Row::new(
        Term::LayerWorkingSet,
        Category::Activations,
        Device::Gpu,
        working,
        format!(
            "2 x largest intermediate{}",
            match shape.checkpointing {
                Checkpointing::None => "",
                Checkpointing::Selective =>
                    "; backward adds one layer's recomputed attention scores",
                Checkpointing::Full => "; backward adds the recomputed layer",
            }
        ),
    ));

    // Logits and loss.
    let s_b_v = sizes.tokens_times(dims.vocab);
    rows.push(Row::new(
        Term::Logits,
        Category::Activations,
        Device::Gpu,
        PhaseBytes::during(&live, saturate(sizes.e * s_b_v)),
        format!("{}·s·b·vocab (vocab {})", sizes.e, dims.vocab),
    ));
    let mut loss = PhaseBytes::default();
    let upcast = if precision.is_mixed() { 4 * s_b_v } else { 0 };
    loss.set(Phase::Forward, saturate(upcast + 4 * s_b_v));
    loss.set(Phase::Backward, saturate(8 * s_b_v));
    rows.push(Row::new(
        Term::LossBuffers,
        Category::Activations,
        Device::Gpu,
        loss,
        if precision.is_mixed() {
            "forward: fp32 logits 4·s·b·vocab + log-softmax 4·s·b·vocab; backward: log-softmax and its gradient 8·s·b·vocab"
        } else {
            "forward: log-softmax 4·s·b·vocab; backward: log-softmax and its gradient 8·s·b·vocab"
        },
    ));
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(bytes.linear, 34 * sbh);
        assert_eq!(bytes.scores, 5 * u128::from(a * s * s * b));
        // Flash attention drops the score term and adds fp32 statistics per row and head.
        let flash = layer_bytes(
            &shape(s, b, AttentionKernel::Flash),
            Precision::Fp16,
            &dims,
            AttentionKernel::Flash,
        );
        assert_eq!(flash.scores, 0);
        assert_eq!(flash.linear, 34 * sbh + 4 * u128::from(a * s * b));
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
            norm: NormKind::RmsNormUpcast,
            dropout: Dropout::Absent,
        };
        let bytes = layer_bytes(
            &shape(1, 1, AttentionKernel::Eager),
            Precision::Bf16,
            &dims,
            AttentionKernel::Eager,
        );
        // Per token: norms 2·4h, QKV input 2h, Q K V 6h, out input 2h, MLP input 2h, 4 x 2i.
        assert_eq!(
            bytes.linear,
            8 * 4096 + 2 * 4096 + 6 * 4096 + 2 * 4096 + 2 * 4096 + 8 * 11_008_u128
        );
        assert_eq!(bytes.scores, 2 * 32);
    }

    #[test]
    fn full_checkpointing_keeps_layer_inputs_and_recomputes_one_layer() {
        let dims = LayerDims {
            self_attention_layers: 10,
            ..gpt(16, 1024)
        };
        let mut shape = shape(1024, 2, AttentionKernel::Flash);
        shape.checkpointing = Checkpointing::Full;
        let rows = activation_rows(&shape, Precision::Bf16, &dims, 8);
        let stored = rows
            .iter()
            .find(|r| r.term == Term::LayerActivations)
            .expect("layer row");
        assert_eq!(stored.bytes.forward, 10 * 2 * 1024 * 2 * 1024);
        let working = rows
            .iter()
            .find(|r| r.term == Term::LayerWorkingSet)
            .expect("working row");
        // The recomputed layer plus twice the MLP intermediate (the largest tensor under flash).
        let one = layer_bytes(&shape, Precision::Bf16, &dims, AttentionKernel::Flash).total();
        let intermediate = 2 * 1024 * 2 * 4096;
        assert_eq!(u128::from(working.bytes.backward), one + 2 * intermediate);
        assert_eq!(u128::from(working.bytes.forward), 2 * intermediate);
        // cpu_checkpointing moves the checkpoints to host memory, per node.
        shape.checkpoint_placement = CheckpointPlacement::Cpu;
        let rows = activation_rows(&shape, Precision::Bf16, &dims, 8);
        let host = rows
            .iter()
            .find(|r| r.term == Term::LayerActivations)
            .expect("layer row");
        assert_eq!(host.device, Device::CpuPinned);
        assert_eq!(host.bytes.forward, 8 * stored.bytes.forward);
    }

    #[test]
    fn logits_and_loss_scale_with_the_vocabulary() {
        let dims = gpt(12, 768);
        let rows = activation_rows(
            &shape(1024, 1, AttentionKernel::Flash),
            Precision::Bf16,
            &dims,
            1,
        );
        let logits = rows
            .iter()
            .find(|r| r.term == Term::Logits)
            .expect("logits");
        assert_eq!(logits.bytes.forward, 2 * 1024 * 50_257);
        let loss = rows
            .iter()
            .find(|r| r.term == Term::LossBuffers)
            .expect("loss");
        assert_eq!(loss.bytes.forward, 8 * 1024 * 50_257);
        assert_eq!(loss.bytes.step, 0);
    }
}
