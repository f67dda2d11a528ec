//! The device backward pass as ops, the CPU model's backward (`model/gpt2/backward.rs`) layer
//! for layer: classifier, `ln_f`, the blocks in reverse, the embeddings. Every parameter
//! gradient is accumulated (`+=`) into region `Grads`, so micro-steps add up; `dresidual`
//! carries the residual stream's gradient and is zeroed first. With activation checkpointing
//! each block but the last is re-run from its saved input just before its backward
//! ([`recompute_block`]), as the CPU model does (`model/recompute.rs`).

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::buffers::{DeviceLayout, Region, TensorRef};
use super::forward::{attention_shape, block_input, recompute_block};
use super::program::Op;
use crate::model::recompute::recomputes;

/// The ops of one backward, after [`super::forward::forward_ops`].
pub fn backward_ops(layout: &DeviceLayout) -> Vec<Op> {
    let mut ops = Vec::new();
    let (c, v) = (layout.config.n_embd, layout.config.vocab_size);
    let n = layout.shape.tokens();
    let pl = &layout.params;
    let param = |span| layout.param(Region::Params, span);
    let grad = |span| layout.param(Region::Grads, span);
    ops.push(Op::Zero {
        tensor: layout.dresidual,
    });

    // Classifier: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf (dlogits' rows `Vp` apart).
    let stride = layout.logits_stride;
    ops.push(Op::LogitsBackwardInput {
        dlnf: layout.dbtc,
        dlogits: layout.logits,
        wte: param(pl.wte),
        dims: (n, c, v),
        stride,
    });
    ops.push(Op::LogitsBackwardWeight {
        dwte: grad(pl.wte),
        lnf: layout.lnf,
        dlogits: layout.logits,
        dims: (n, c, v),
        stride,
    });

    // ln_f: from dlnf (dbtc) into dresidual.
    let last_residual = block_input(layout, layout.blocks.len());
    ops.push(Op::LayerNormBackward {
        dinp: layout.dresidual,
        dweight: grad(pl.ln_f_weight),
        dbias: grad(pl.ln_f_bias),
        scratch: layout.layernorm_partials,
        dout: layout.dbtc,
        inp: last_residual,
        weight: param(pl.ln_f_weight),
        mean: layout.lnf_mean,
        rstd: layout.lnf_rstd,
    });

    let layers = layout.blocks.len();
    for l in (0..layers).rev() {
        if recomputes(layout.recompute, l, layers) {
            recompute_block(&mut ops, layout, l);
        }
        block_backward(&mut ops, layout, l);
    }

    ops.push(Op::EncoderBackward {
        dwte: grad(pl.wte),
        dwpe: grad(pl.wpe),
        dout: layout.dresidual,
        bucket_tokens: layout.whole(Region::Step(CudaRegion::BucketTokens)),
        bucket_starts: layout.whole(Region::Step(CudaRegion::BucketStarts)),
        bucket_rows: layout.whole(Region::Step(CudaRegion::BucketRows)),
        seq_len: layout.shape.seq_len,
    });
    ops
}

/// `matmul_backward` of the CPU model: `dinp = dout @ W^T`, `dW += inp^T @ dout`,
/// `db += colsum(dout)`.
#[allow(clippy::too_many_arguments)]
fn matmul_backward(
    ops: &mut Vec<Op>,
    layout: &DeviceLayout,
    dinp: TensorRef,
    (dweight, dbias): (TensorRef, TensorRef),
    dout: TensorRef,
    inp: TensorRef,
    weight: TensorRef,
    dims: (usize, usize, usize),
) {
    ops.push(Op::MatmulBackwardInput {
        dinp,
        dout,
        weight,
        dims,
    });
    ops.push(Op::MatmulBackwardWeight {
        dweight,
        inp,
        dout,
        dims,
    });
    let chunks = dims.0.div_ceil(64);
    ops.push(Op::BiasBackward {
        dbias,
        scratch: layout.bias_partials.prefix(chunks * dims.2),
        dout,
    });
}

/// Block `l` in reverse; `dresidual` holds the gradient of its output on entry and of its
/// input on exit.
fn block_backward(ops: &mut Vec<Op>, layout: &DeviceLayout, l: usize) {
    let (a, w) = (&layout.blocks[l], &layout.params.blocks[l]);
    let c = layout.config.n_embd;
    let n = layout.shape.tokens();
    let param = |span| layout.param(Region::Params, span);
    let grad = |span| layout.param(Region::Grads, span);
    let (dres, dbtc, dbt4c) = (layout.dresidual, layout.dbtc, layout.dbt4c);
    let dqkv = dbt4c.prefix(n * 3 * c);

    // MLP: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2)))).
    matmul_backward(
        ops,
        layout,
        dbt4c,
        (grad(w.mlp_proj_weight), grad(w.mlp_proj_bias)),
        dres,
        a.fch_gelu,
        param(w.mlp_proj_weight),
        (n, 4 * c, c),
    );
    ops.push(Op::GeluBackward {
        d: dbt4c,
        inp: a.fch,
    });
    matmul_backward(
        ops,
        layout,
        dbtc,
        (grad(w.fc_weight), grad(w.fc_bias)),
        dbt4c,
        a.ln2,
        param(w.fc_weight),
        (n, c, 4 * c),
    );
    ops.push(Op::LayerNormBackward {
        dinp: dres,
        dweight: grad(w.ln_2_weight),
        dbias: grad(w.ln_2_bias),
        scratch: layout.layernorm_partials,
        dout: dbtc,
        inp: a.residual2,
        weight: param(w.ln_2_weight),
        mean: a.ln2_mean,
        rstd: a.ln2_rstd,
    });

    // Attention: residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))).
    matmul_backward(
        ops,
        layout,
        dbtc,
        (grad(w.attn_proj_weight), grad(w.attn_proj_bias)),
        dres,
        a.atty,
        param(w.attn_proj_weight),
        (n, c, c),
    );
    ops.push(Op::AttentionBackward {
        dqkv,
        delta: layout.attention_delta,
        dout: dbtc,
        out: a.atty,
        qkv: a.qkv,
        lse: a.lse,
        shape: attention_shape(layout),
    });
    matmul_backward(
        ops,
        layout,
        dbtc,
        (grad(w.c_attn_weight), grad(w.c_attn_bias)),
        dqkv,
        a.ln1,
        param(w.c_attn_weight),
        (n, c, 3 * c),
    );
    ops.push(Op::LayerNormBackward {
        dinp: dres,
        dweight: grad(w.ln_1_weight),
        dbias: grad(w.ln_1_bias),
        scratch: layout.layernorm_partials,
        dout: dbtc,
        inp: block_input(layout, l),
        weight: param(w.ln_1_weight),
        mean: a.ln1_mean,
        rstd: a.ln1_rstd,
    });
}
