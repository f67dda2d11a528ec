//! The Llama family's device forward as ops, in the CPU model's order
//! (`model/llama/forward.rs`): embeddings, `L` decoder layers, `model.norm`, `lm_head`, then
//! the fused classifier. The output and down projections add into a copy of the residual
//! stream (cuBLASLt with `beta = 1`), as the CPU adds them in place.

use dsplan_planner::memory::cuda_layout::CudaRegion;
use dsplan_planner::plan::cuda_world::CudaScheme;

use super::buffers::LlamaDeviceLayout;
use crate::cuda::element::strided_len;
use crate::cuda::gemm::Accumulate;
use crate::cuda::launch::{GroupedAttention, Rotation};
use crate::cuda::train::buffers::{Region, TensorRef};
use crate::cuda::train::program::{LlamaOp, Op};
use crate::model::llama::LlamaBlockParams;
use crate::tensor::Span;
use crate::train::AttentionKernel;

/// The ops of one training forward, ending with the classifier (losses and dlogits).
pub fn llama_forward_ops(layout: &LlamaDeviceLayout) -> Vec<Op> {
    let mut ops = Vec::new();
    let config = &layout.config;
    let (c, v) = (config.hidden_size, config.vocab_size);
    let (n, seq_len) = (layout.shape.tokens(), layout.shape.seq_len);
    let pl = &layout.params;
    let param = |span| layout.param(Region::Params, span);

    // encoded = embed_tokens[tokens] (the encoder kernel over a zeroed position table).
    let zeros = layout.dbtc.prefix(seq_len * c);
    ops.push(Op::Zero { tensor: zeros });
    ops.push(Op::Llama(LlamaOp::Embed {
        out: layout.encoded,
        tokens: layout.whole(Region::Step(CudaRegion::Tokens)),
        wte: param(pl.embed),
        zeros,
        seq_len,
    }));
    for l in 0..layout.blocks.len() {
        llama_block_forward(&mut ops, layout, l);
    }
    ops.push(Op::Llama(LlamaOp::RmsNormForward {
        out: layout.lnf,
        rstd: layout.lnf_rstd,
        inp: block_input(layout, layout.blocks.len()),
        weight: param(pl.norm),
    }));
    ops.push(Op::Llama(LlamaOp::LinearForward {
        out: layout.logits,
        inp: layout.lnf,
        weight: param(pl.lm_head),
        bias: None,
        dims: (n, c, v),
        out_stride: layout.logits_stride,
        accumulate: Accumulate::Overwrite,
    }));
    ops.push(Op::FusedClassifier {
        logits: layout.logits,
        losses: layout.losses,
        targets: layout.whole(Region::Step(CudaRegion::Targets)),
        vocab: v,
        stride: layout.logits_stride,
    });
    ops
}

/// The input of layer `l`'s residual stream (`encoded`, or the previous layer's `residual3`).
pub fn block_input(layout: &LlamaDeviceLayout, l: usize) -> TensorRef {
    match l.checked_sub(1) {
        None => layout.encoded,
        Some(prev) => layout.blocks[prev].residual3,
    }
}

/// Grouped-query attention's sizes for the layout.
pub fn attention_dims(layout: &LlamaDeviceLayout) -> GroupedAttention {
    GroupedAttention {
        batch: layout.shape.batch,
        seq_len: layout.shape.seq_len,
        n_head: layout.config.num_attention_heads,
        kv_heads: layout.config.num_key_value_heads,
        head_dim: layout.config.head_dim,
    }
}

/// The rotation of layer rows `rows` (`qkv` forward, `dqkv` backward): q's and k's heads.
pub fn rope(layout: &LlamaDeviceLayout, rows: TensorRef, rotation: Rotation) -> Op {
    let config = &layout.config;
    Op::Llama(LlamaOp::Rope {
        rows,
        cos: layout.rope_cos,
        sin: layout.rope_sin,
        heads: config.num_attention_heads + config.num_key_value_heads,
        width: config.qkv_width(),
        seq_len: layout.shape.seq_len,
        rotation,
    })
}

/// Whether the layer's back-to-back weights (q, k and v without biases; gate and up) are
/// multiplied tensor by tensor rather than as one product: at ZeRO stage 3 (`W > 1`) each
/// parameter is gathered into its own place of the plan's arena, not next to the others.
pub fn split_products(layout: &LlamaDeviceLayout) -> bool {
    layout.shares.scheme == CudaScheme::Sharded
}

/// `[gate | up]` as the products compute them: one `(2I, C)` weight (the two are back to
/// back: no MLP biases), or each on its own columns of `gate_up` ([`split_products`]).
pub fn gate_up_parts(layout: &LlamaDeviceLayout, w: &LlamaBlockParams) -> Vec<QkvPart> {
    let i = layout.config.intermediate_size;
    if !split_products(layout) {
        return vec![QkvPart {
            weight: Span::new(
                w.gate_weight.offset,
                w.up_weight.end() - w.gate_weight.offset,
            ),
            bias: None,
            column: 0,
            width: 2 * i,
        }];
    }
    vec![
        QkvPart {
            weight: w.gate_weight,
            bias: None,
            column: 0,
            width: i,
        },
        QkvPart {
            weight: w.up_weight,
            bias: None,
            column: i,
            width: i,
        },
    ]
}

/// One projection of a product split by columns (q, k, v; gate, up): its weight, bias, first
/// column in the output rows and width.
#[derive(Debug, Clone, Copy)]
pub struct QkvPart {
    /// `(width, C)`.
    pub weight: Span,
    /// `(width)`.
    pub bias: Option<Span>,
    /// First column in a `qkv` row.
    pub column: usize,
    /// Columns.
    pub width: usize,
}

/// The q, k and v projections as the products compute them: one `(QKV, C)` weight when the
/// three weights are back to back (no biases) and the product is not split
/// ([`split_products`]), else each on its own columns.
pub fn qkv_parts(layout: &LlamaDeviceLayout, w: &LlamaBlockParams) -> Vec<QkvPart> {
    let config = &layout.config;
    let (a, kv) = (config.q_width(), config.kv_width());
    if w.q_bias.is_none() && !split_products(layout) {
        return vec![QkvPart {
            weight: Span::new(w.q_weight.offset, w.v_weight.end() - w.q_weight.offset),
            bias: None,
            column: 0,
            width: config.qkv_width(),
        }];
    }
    vec![
        QkvPart {
            weight: w.q_weight,
            bias: w.q_bias,
            column: 0,
            width: a,
        },
        QkvPart {
            weight: w.k_weight,
            bias: w.k_bias,
            column: a,
            width: kv,
        },
        QkvPart {
            weight: w.v_weight,
            bias: w.v_bias,
            column: a + kv,
            width: kv,
        },
    ]
}

/// Columns `column..column + width` of the `(N, stride)` buffer `whole`, as a strided operand.
pub fn columns(whole: TensorRef, rows: usize, stride: usize, part: &QkvPart) -> TensorRef {
    TensorRef {
        region: whole.region,
        span: Span::new(
            whole.span.offset + part.column,
            strided_len(rows, part.width, stride),
        ),
    }
}

/// Decoder layer `l`: `input_layernorm`, q/k/v, the rotation, attention, `o_proj` into the
/// residual stream, `post_attention_layernorm`, `[gate | up]`, SwiGLU, `down_proj` into the
/// residual stream.
pub fn llama_block_forward(ops: &mut Vec<Op>, layout: &LlamaDeviceLayout, l: usize) {
    let (a, w) = (&layout.blocks[l], &layout.params.blocks[l]);
    let config = &layout.config;
    let (c, i) = (config.hidden_size, config.intermediate_size);
    let (q, qkv) = (config.q_width(), config.qkv_width());
    let n = layout.shape.tokens();
    let param = |span| layout.param(Region::Params, span);
    let input = block_input(layout, l);
    let linear = |out, inp, weight, bias, dims, out_stride, accumulate| {
        Op::Llama(LlamaOp::LinearForward {
            out,
            inp,
            weight,
            bias,
            dims,
            out_stride,
            accumulate,
        })
    };
    ops.push(Op::Llama(LlamaOp::RmsNormForward {
        out: a.ln1,
        rstd: a.ln1_rstd,
        inp: input,
        weight: param(w.input_norm),
    }));
    for part in qkv_parts(layout, w) {
        ops.push(linear(
            columns(a.qkv, n, qkv, &part),
            a.ln1,
            param(part.weight),
            part.bias.map(param),
            (n, c, part.width),
            qkv,
            Accumulate::Overwrite,
        ));
    }
    ops.push(rope(layout, a.qkv, Rotation::Forward));
    ops.push(Op::Llama(LlamaOp::AttentionForward {
        out: a.atty,
        lse: a.lse,
        qkv: a.qkv,
        dims: attention_dims(layout),
        kernel: AttentionKernel::Scalar,
    }));
    ops.push(Op::Llama(LlamaOp::Copy {
        dst: a.residual2,
        src: input,
    }));
    ops.push(linear(
        a.residual2,
        a.atty,
        param(w.o_weight),
        w.o_bias.map(param),
        (n, q, c),
        c,
        Accumulate::Add,
    ));
    ops.push(Op::Llama(LlamaOp::RmsNormForward {
        out: a.ln2,
        rstd: a.ln2_rstd,
        inp: a.residual2,
        weight: param(w.post_attention_norm),
    }));
    for part in gate_up_parts(layout, w) {
        ops.push(linear(
            columns(a.gate_up, n, 2 * i, &part),
            a.ln2,
            param(part.weight),
            None,
            (n, c, part.width),
            2 * i,
            Accumulate::Overwrite,
        ));
    }
    ops.push(Op::Llama(LlamaOp::SwiGluForward {
        out: a.swiglu,
        gate_up: a.gate_up,
        inner: i,
    }));
    ops.push(Op::Llama(LlamaOp::Copy {
        dst: a.residual3,
        src: a.residual2,
    }));
    ops.push(linear(
        a.residual3,
        a.swiglu,
        param(w.down_weight),
        None,
        (n, i, c),
        c,
        Accumulate::Add,
    ));
}
