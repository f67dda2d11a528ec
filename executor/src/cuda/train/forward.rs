//! The device forward pass as ops, in the CPU model's order (`model/gpt2/forward.rs`):
//! embeddings, `L` blocks, `ln_f`, logits, then the fused classifier. Each residual addition
//! is fused into the LayerNorm after it (`residual_layernorm_forward`): block `l`'s
//! `residual3` is made by block `l + 1`'s `ln_1` (or by `ln_f`).

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::buffers::{DeviceLayout, Region, TensorRef};
use super::program::{AttentionShape, Op};
use crate::train::AttentionKernel;

/// The ops of one training forward, ending with the classifier (losses and dlogits).
pub fn forward_ops(layout: &DeviceLayout) -> Vec<Op> {
    let mut ops = Vec::new();
    let (c, v) = (layout.config.n_embd, layout.config.vocab_size);
    let n = layout.shape.tokens();
    let pl = &layout.params;
    let param = |span| layout.param(Region::Params, span);

    // encoded = wte[tokens] + wpe[t]
    ops.push(Op::EncoderForward {
        out: layout.encoded,
        tokens: layout.whole(Region::Step(CudaRegion::Tokens)),
        wte: param(pl.wte),
        wpe: param(pl.wpe),
        seq_len: layout.shape.seq_len,
    });

    // Each block's ln_1 takes the previous block's (attproj-free) residual stream: block 0
    // reads `encoded`; block l > 0 first forms block l-1's residual3 = residual2 + fcproj.
    for (l, a) in layout.blocks.iter().enumerate() {
        let w = &pl.blocks[l];
        let ln1 = |residual_from: Option<usize>| match residual_from {
            None => Op::LayerNormForward {
                out: a.ln1,
                mean: a.ln1_mean,
                rstd: a.ln1_rstd,
                inp: layout.encoded,
                weight: param(w.ln_1_weight),
                bias: param(w.ln_1_bias),
            },
            Some(prev) => {
                let p = &layout.blocks[prev];
                Op::ResidualLayerNormForward {
                    residual: p.residual3,
                    out: a.ln1,
                    mean: a.ln1_mean,
                    rstd: a.ln1_rstd,
                    a: p.residual2,
                    b: p.fcproj,
                    weight: param(w.ln_1_weight),
                    bias: param(w.ln_1_bias),
                }
            }
        };
        ops.push(ln1(l.checked_sub(1)));
        block_forward(&mut ops, layout, l);
    }

    // ln_f over the last residual stream (fused with the last block's residual3).
    let (mean, rstd) = (layout.lnf_mean, layout.lnf_rstd);
    let (weight, bias) = (param(pl.ln_f_weight), param(pl.ln_f_bias));
    ops.push(match layout.blocks.last() {
        Some(last) => Op::ResidualLayerNormForward {
            residual: last.residual3,
            out: layout.lnf,
            mean,
            rstd,
            a: last.residual2,
            b: last.fcproj,
            weight,
            bias,
        },
        None => Op::LayerNormForward {
            out: layout.lnf,
            mean,
            rstd,
            inp: layout.encoded,
            weight,
            bias,
        },
    });
    // The logits' rows are `Vp` apart (cuBLASLt's leading dimension, 16-byte aligned).
    let stride = layout.logits_stride;
    ops.push(Op::LogitsForward {
        logits: layout.logits,
        lnf: layout.lnf,
        wte: param(pl.wte),
        dims: (n, c, v),
        stride,
    });
    ops.push(Op::FusedClassifier {
        logits: layout.logits,
        losses: layout.losses,
        targets: layout.whole(Region::Step(CudaRegion::Targets)),
        vocab: v,
        stride,
    });
    ops
}

/// The input of block `l`'s residual stream (`encoded`, or the previous block's `residual3`).
pub fn block_input(layout: &DeviceLayout, l: usize) -> TensorRef {
    match l.checked_sub(1) {
        None => layout.encoded,
        Some(prev) => layout.blocks[prev].residual3,
    }
}

/// Attention's shape for the layout.
pub fn attention_shape(layout: &DeviceLayout) -> AttentionShape {
    AttentionShape {
        batch: layout.shape.batch,
        seq_len: layout.shape.seq_len,
        n_head: layout.config.n_head,
        head_dim: layout.config.head_dim(),
        kernel: AttentionKernel::Scalar,
    }
}

/// Block `l`'s forward again from its saved input (`block_input`), into the working set all
/// blocks share under activation checkpointing: `ln_1` as a plain LayerNorm (its input is
/// kept; the fused residual addition ran in forward), then the block up to `fch_gelu`
/// (`mlp.c_proj`'s output is not read by backward, so it is not recomputed).
pub fn recompute_block(ops: &mut Vec<Op>, layout: &DeviceLayout, l: usize) {
    let (a, w) = (&layout.blocks[l], &layout.params.blocks[l]);
    let param = |span| layout.param(Region::Params, span);
    ops.push(Op::LayerNormForward {
        out: a.ln1,
        mean: a.ln1_mean,
        rstd: a.ln1_rstd,
        inp: block_input(layout, l),
        weight: param(w.ln_1_weight),
        bias: param(w.ln_1_bias),
    });
    let mut block = Vec::new();
    block_forward(&mut block, layout, l);
    block.pop();
    ops.extend(block);
}

/// Block `l` after its `ln_1`: attention, `attn.c_proj`, `ln_2` (fused with residual2),
/// the MLP. Its `residual3` is left to the next LayerNorm.
fn block_forward(ops: &mut Vec<Op>, layout: &DeviceLayout, l: usize) {
    let (a, w) = (&layout.blocks[l], &layout.params.blocks[l]);
    let c = layout.config.n_embd;
    let n = layout.shape.tokens();
    let param = |span| layout.param(Region::Params, span);
    ops.push(Op::MatmulForward {
        out: a.qkv,
        inp: a.ln1,
        weight: param(w.c_attn_weight),
        bias: Some(param(w.c_attn_bias)),
        dims: (n, c, 3 * c),
    });
    ops.push(Op::AttentionForward {
        out: a.atty,
        lse: a.lse,
        qkv: a.qkv,
        shape: attention_shape(layout),
    });
    ops.push(Op::MatmulForward {
        out: a.attproj,
        inp: a.atty,
        weight: param(w.attn_proj_weight),
        bias: Some(param(w.attn_proj_bias)),
        dims: (n, c, c),
    });
    ops.push(Op::ResidualLayerNormForward {
        residual: a.residual2,
        out: a.ln2,
        mean: a.ln2_mean,
        rstd: a.ln2_rstd,
        a: block_input(layout, l),
        b: a.attproj,
        weight: param(w.ln_2_weight),
        bias: param(w.ln_2_bias),
    });
    ops.push(Op::MatmulForward {
        out: a.fch,
        inp: a.ln2,
        weight: param(w.fc_weight),
        bias: Some(param(w.fc_bias)),
        dims: (n, c, 4 * c),
    });
    ops.push(Op::GeluForward {
        out: a.fch_gelu,
        inp: a.fch,
    });
    ops.push(Op::MatmulForward {
        out: a.fcproj,
        inp: a.fch_gelu,
        weight: param(w.mlp_proj_weight),
        bias: Some(param(w.mlp_proj_bias)),
        dims: (n, 4 * c, c),
    });
}
