//! The Llama family's device backward as ops, the CPU model's backward
//! (`model/llama/backward.rs`) layer for layer: classifier, `model.norm`, the layers in
//! reverse, the embeddings. Every parameter gradient is accumulated (`+=`) into region
//! `Grads` (a tied `lm_head` into the embedding's), so micro-steps add up; `dresidual`
//! carries the residual stream's gradient and is zeroed first. With activation checkpointing
//! each layer but the last is re-run from its saved input just before its backward
//! ([`recompute_block`]), as the CPU model does (`model/recompute.rs`).

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::buffers::LlamaDeviceLayout;
use super::forward::{
    attention_dims, block_input, columns, gate_up_parts, llama_block_forward, qkv_parts, rope,
};
use crate::cuda::gemm::Accumulate;
use crate::cuda::launch::Rotation;
use crate::cuda::train::buffers::{Region, TensorRef};
use crate::cuda::train::program::{GemmDims, LlamaOp, Op};
use crate::model::recompute::recomputes;
use crate::train::AttentionKernel;

/// The ops of one backward, after [`super::forward::llama_forward_ops`].
pub fn llama_backward_ops(layout: &LlamaDeviceLayout) -> Vec<Op> {
    let mut ops = Vec::new();
    let config = &layout.config;
    let (c, v) = (config.hidden_size, config.vocab_size);
    let n = layout.shape.tokens();
    let pl = &layout.params;
    let param = |span| layout.param(Region::Params, span);
    let grad = |span| layout.param(Region::Grads, span);
    ops.push(Op::Zero {
        tensor: layout.dresidual,
    });
    // lm_head: dlnf = dlogits @ W, dW += dlogits^T @ lnf.
    linear_backward(
        &mut ops,
        Linear {
            dinp: layout.dbtc,
            dweight: grad(pl.lm_head),
            dout: layout.logits,
            inp: layout.lnf,
            weight: param(pl.lm_head),
            dims: (n, c, v),
            dout_stride: layout.logits_stride,
            accumulate: Accumulate::Overwrite,
        },
    );
    ops.push(Op::Llama(LlamaOp::RmsNormBackward {
        dinp: layout.dresidual,
        dweight: grad(pl.norm),
        scratch: layout.rmsnorm_partials,
        dout: layout.dbtc,
        inp: block_input(layout, layout.blocks.len()),
        weight: param(pl.norm),
        rstd: layout.lnf_rstd,
    }));
    let layers = layout.blocks.len();
    for l in (0..layers).rev() {
        if recomputes(layout.recompute, l, layers) {
            recompute_block(&mut ops, layout, l);
        }
        llama_block_backward(&mut ops, layout, l);
    }
    ops.push(Op::Llama(LlamaOp::EmbedBackward {
        dwte: grad(pl.embed),
        dout: layout.dresidual,
        bucket_tokens: layout.whole(Region::Step(CudaRegion::BucketTokens)),
        bucket_starts: layout.whole(Region::Step(CudaRegion::BucketStarts)),
        bucket_rows: layout.whole(Region::Step(CudaRegion::BucketRows)),
    }));
    ops
}

/// Layer `l`'s forward again from its saved input, into the working set all layers share
/// under activation checkpointing: every op up to SwiGLU (the copy into `residual3` and
/// `down_proj`'s addition are not read by backward, and `residual3` is kept).
pub fn recompute_block(ops: &mut Vec<Op>, layout: &LlamaDeviceLayout, l: usize) {
    let mut block = Vec::new();
    llama_block_forward(&mut block, layout, l);
    block.truncate(block.len().saturating_sub(2));
    ops.extend(block);
}

/// The operands of one `nn.Linear` backward.
struct Linear {
    dinp: TensorRef,
    dweight: TensorRef,
    dout: TensorRef,
    inp: TensorRef,
    weight: TensorRef,
    dims: GemmDims,
    dout_stride: usize,
    accumulate: Accumulate,
}

/// `dinp (+)= dout @ W`, `dW += dout^T @ inp`.
fn linear_backward(ops: &mut Vec<Op>, p: Linear) {
    ops.push(Op::Llama(LlamaOp::LinearBackwardInput {
        dinp: p.dinp,
        dout: p.dout,
        weight: p.weight,
        dims: p.dims,
        dout_stride: p.dout_stride,
        accumulate: p.accumulate,
    }));
    ops.push(Op::Llama(LlamaOp::LinearBackwardWeight {
        dweight: p.dweight,
        inp: p.inp,
        dout: p.dout,
        dims: p.dims,
        dout_stride: p.dout_stride,
    }));
}

/// Layer `l` in reverse; `dresidual` holds the gradient of its output on entry and of its
/// input on exit.
pub fn llama_block_backward(ops: &mut Vec<Op>, layout: &LlamaDeviceLayout, l: usize) {
    let (a, w) = (&layout.blocks[l], &layout.params.blocks[l]);
    let config = &layout.config;
    let (c, i) = (config.hidden_size, config.intermediate_size);
    let (q, qkv) = (config.q_width(), config.qkv_width());
    let n = layout.shape.tokens();
    let param = |span| layout.param(Region::Params, span);
    let grad = |span| layout.param(Region::Grads, span);
    let (dres, dbtc) = (layout.dresidual, layout.dbtc);

    // MLP: residual3 = residual2 + down(swiglu(gate_up(ln2(residual2)))).
    let dswiglu = layout.dmid.prefix(n * i);
    let dgate_up = layout.dwide.prefix(n * 2 * i);
    linear_backward(
        ops,
        Linear {
            dinp: dswiglu,
            dweight: grad(w.down_weight),
            dout: dres,
            inp: a.swiglu,
            weight: param(w.down_weight),
            dims: (n, i, c),
            dout_stride: c,
            accumulate: Accumulate::Overwrite,
        },
    );
    ops.push(Op::Llama(LlamaOp::SwiGluBackward {
        dgate_up,
        dout: dswiglu,
        gate_up: a.gate_up,
        inner: i,
    }));
    // The parts in reverse (up, then gate), the order their modules' backward runs in: the
    // order the plan's stage-3 schedule fetches and releases them.
    for (k, part) in gate_up_parts(layout, w).iter().rev().enumerate() {
        linear_backward(
            ops,
            Linear {
                dinp: dbtc,
                dweight: grad(part.weight),
                dout: columns(dgate_up, n, 2 * i, part),
                inp: a.ln2,
                weight: param(part.weight),
                dims: (n, c, part.width),
                dout_stride: 2 * i,
                accumulate: if k == 0 {
                    Accumulate::Overwrite
                } else {
                    Accumulate::Add
                },
            },
        );
    }
    ops.push(Op::Llama(LlamaOp::RmsNormBackward {
        dinp: dres,
        dweight: grad(w.post_attention_norm),
        scratch: layout.rmsnorm_partials,
        dout: dbtc,
        inp: a.residual2,
        weight: param(w.post_attention_norm),
        rstd: a.ln2_rstd,
    }));

    // Attention: residual2 = input + o(attn(rope(qkv(ln1(input))))).
    let datty = layout.dmid.prefix(n * q);
    let dqkv = layout.dwide.prefix(n * qkv);
    linear_backward(
        ops,
        Linear {
            dinp: datty,
            dweight: grad(w.o_weight),
            dout: dres,
            inp: a.atty,
            weight: param(w.o_weight),
            dims: (n, q, c),
            dout_stride: c,
            accumulate: Accumulate::Overwrite,
        },
    );
    if let Some(o_bias) = w.o_bias {
        ops.push(Op::BiasBackward {
            dbias: grad(o_bias),
            scratch: layout.bias_partials.prefix(n.div_ceil(64) * c),
            dout: dres,
        });
    }
    ops.push(Op::Llama(LlamaOp::AttentionBackward {
        dqkv,
        delta: layout.attention_delta,
        dout: datty,
        out: a.atty,
        qkv: a.qkv,
        lse: a.lse,
        dims: attention_dims(layout),
        kernel: AttentionKernel::Scalar,
    }));
    ops.push(rope(layout, dqkv, Rotation::Backward));
    let parts = qkv_parts(layout, w);
    // The biases first, as soon as `dqkv` is whole: v's bias is reduced with the modules
    // after it (o, the norm), before k's and q's products run.
    if let [qp, kp, vp] = parts.as_slice()
        && let (Some(qb), Some(kb), Some(vb)) = (qp.bias, kp.bias, vp.bias)
    {
        ops.push(Op::Llama(LlamaOp::QkvBiasBackward {
            dbiases: [grad(qb), grad(kb), grad(vb)],
            scratch: layout.bias_partials.prefix(n.div_ceil(64) * qkv),
            dqkv,
            widths: [qp.width, kp.width, vp.width],
        }));
    }
    // v, k, then q: the reverse of the modules' forward order, as for gate and up.
    for (k, part) in parts.iter().rev().enumerate() {
        linear_backward(
            ops,
            Linear {
                dinp: dbtc,
                dweight: grad(part.weight),
                dout: columns(dqkv, n, qkv, part),
                inp: a.ln1,
                weight: param(part.weight),
                dims: (n, c, part.width),
                dout_stride: qkv,
                accumulate: if k == 0 {
                    Accumulate::Overwrite
                } else {
                    Accumulate::Add
                },
            },
        );
    }
    ops.push(Op::Llama(LlamaOp::RmsNormBackward {
        dinp: dres,
        dweight: grad(w.input_norm),
        scratch: layout.rmsnorm_partials,
        dout: dbtc,
        inp: block_input(layout, l),
        weight: param(w.input_norm),
        rstd: a.ln1_rstd,
    }));
}
