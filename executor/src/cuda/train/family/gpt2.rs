//! GPT-2 on the device: its tensors in the step's step ([`Gpt2Tensors`]) and its recipe, the
//! CPU model's forward and backward (`model/gpt2/`) as ops, each part's forward next to its
//! backward.
//!
//! Each residual addition is fused into the LayerNorm after it (`residual_layernorm_forward`):
//! block `l`'s `residual3` is made by block `l + 1`'s `ln_1` (or by `ln_f`). Every parameter
//! gradient is accumulated (`+=`), so micro-steps add up; `dresidual` carries the residual
//! stream's gradient and is zeroed first. With activation checkpointing each block but the
//! last is re-run from its saved input just before its backward, as the CPU model does
//! (`model/recompute.rs`).

use dsplan_planner::memory::cuda_layout::{self, CudaTensor};

use super::{Recipe, Tensors, layout_shape};
use crate::cuda::gemm::{Accumulate, Pass, WeightLayout};
use crate::cuda::launch::Heads;
use crate::cuda::train::mfu::Mfu;
use crate::cuda::train::program::{Attention, GemmDims, Op, ShapeError, check_head_size, dense};
use crate::cuda::train::region::{Region, TensorRef};
use crate::cuda::train::step_tensors::StepTensors;
use crate::model::recompute::recomputes;
use crate::model::{BatchShape, Gpt2Config, ModelConfig, ParamLayout, Recompute};
use crate::tensor::TensorTable;
use crate::train::AttentionKernel;

/// The activations one block keeps on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gpt2Block {
    /// `ln_1` output `(B, T, C)`.
    pub ln1: TensorRef,
    /// Its mean `(B, T)`, f32.
    pub ln1_mean: TensorRef,
    /// Its rstd `(B, T)`, f32.
    pub ln1_rstd: TensorRef,
    /// `c_attn` output `(B, T, 3C)`.
    pub qkv: TensorRef,
    /// Attention's log-sum-exp `(B, NH, T)`, f32 (replaces the CPU's `att`).
    pub lse: TensorRef,
    /// Attention output `(B, T, C)`.
    pub atty: TensorRef,
    /// `attn.c_proj` output `(B, T, C)`.
    pub attproj: TensorRef,
    /// The residual stream after attention `(B, T, C)`.
    pub residual2: TensorRef,
    /// `ln_2` output `(B, T, C)`.
    pub ln2: TensorRef,
    /// Its mean, f32.
    pub ln2_mean: TensorRef,
    /// Its rstd, f32.
    pub ln2_rstd: TensorRef,
    /// `c_fc` output `(B, T, 4C)` (bias added).
    pub fch: TensorRef,
    /// GELU of it.
    pub fch_gelu: TensorRef,
    /// `mlp.c_proj` output `(B, T, C)`.
    pub fcproj: TensorRef,
    /// The residual stream after the block `(B, T, C)`.
    pub residual3: TensorRef,
}

/// GPT-2's own tensors of the step (the ones every family has are [`StepTensors`]).
#[derive(Debug, Clone)]
pub struct Gpt2Tensors {
    /// The model.
    pub config: Gpt2Config,
    /// The parameter step (params, grads, master and moments share it).
    pub params: ParamLayout,
    /// Per block.
    pub blocks: Vec<Gpt2Block>,
    /// `ln_f`'s mean `(B, T)`, f32.
    pub lnf_mean: TensorRef,
    /// A `(B, T, 4C)` gradient work buffer (also `dqkv`, its first `3C` columns).
    pub dbt4c: TensorRef,
    /// LayerNorm backward's partials `ceil(N/32) x 2 x C`, f32.
    pub layernorm_partials: TensorRef,
}

impl Gpt2Tensors {
    /// The planner's tensors of a step of `config` on `shape` (the list the `dsplan-cuda`
    /// plan counts).
    pub fn planner_tensors(
        config: &Gpt2Config,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Vec<CudaTensor> {
        let params = ParamLayout::new(config).table().entries().len();
        let dims = layout_shape(ModelConfig::Gpt2(*config), shape, params);
        cuda_layout::gpt2_cuda_tensors(&dims, recompute)
    }

    /// GPT-2's tensors, read by name from the planner's `tables`.
    pub fn new(config: Gpt2Config, recompute: Recompute, tables: &Tensors<'_>) -> Self {
        let blocks = (0..config.n_layer)
            .map(|l| {
                let block = tables.block(recompute, l);
                Gpt2Block {
                    ln1: block.act("ln1"),
                    ln1_mean: block.stat("ln1_mean"),
                    ln1_rstd: block.stat("ln1_rstd"),
                    qkv: block.act("qkv"),
                    lse: block.stat("lse"),
                    atty: block.act("atty"),
                    attproj: block.act("attproj"),
                    residual2: block.act("residual2"),
                    ln2: block.act("ln2"),
                    ln2_mean: block.stat("ln2_mean"),
                    ln2_rstd: block.stat("ln2_rstd"),
                    fch: block.act("fch"),
                    fch_gelu: block.act("fch_gelu"),
                    fcproj: block.act("fcproj"),
                    residual3: block.act("residual3"),
                }
            })
            .collect();
        Self {
            params: ParamLayout::new(&config),
            config,
            blocks,
            lnf_mean: tables.stat("lnf_mean"),
            dbt4c: tables.activation("dbt4c"),
            layernorm_partials: tables.scratch("layernorm_partials"),
        }
    }

    /// Attention's sizes: one key/value head per query head.
    fn attention(&self, step: &StepTensors) -> Attention {
        Attention {
            dims: crate::cuda::launch::GroupedAttention {
                batch: step.shape.batch,
                seq_len: step.shape.seq_len,
                n_head: self.config.n_head,
                kv_heads: self.config.n_head,
                head_dim: self.config.head_dim(),
            },
            heads: Heads::Shared,
            kernel: AttentionKernel::Scalar,
        }
    }

    /// The input of block `l`'s residual stream (`encoded`, or the previous block's
    /// `residual3`).
    fn block_input(&self, step: &StepTensors, l: usize) -> TensorRef {
        match l.checked_sub(1) {
            None => step.encoded,
            Some(prev) => self.blocks[prev].residual3,
        }
    }
}

impl Recipe for Gpt2Tensors {
    fn model(&self) -> ModelConfig {
        ModelConfig::Gpt2(self.config)
    }

    fn param_table(&self) -> &TensorTable {
        self.params.table()
    }

    fn check(&self, step: &StepTensors) -> Result<(), ShapeError> {
        check_head_size(self.config.head_dim(), step.dtype)
    }

    fn mfu(&self, seq_len: usize, device: &str) -> Option<Mfu> {
        Mfu::of(&self.config, seq_len, device)
    }

    fn forward(&self, step: &StepTensors) -> Vec<Op> {
        let mut ops = vec![self.embed_forward(step)];
        for l in 0..self.blocks.len() {
            ops.push(self.ln1_forward(step, l, Fused::WithResidual));
            self.block_forward(&mut ops, step, l);
        }
        self.head_forward(&mut ops, step);
        ops
    }

    fn backward(&self, step: &StepTensors) -> Vec<Op> {
        let mut ops = vec![Op::Zero {
            tensor: step.dresidual,
        }];
        self.head_backward(&mut ops, step);
        let layers = self.blocks.len();
        for l in (0..layers).rev() {
            if recomputes(step.recompute, l, layers) {
                self.recompute_block(&mut ops, step, l);
            }
            self.block_backward(&mut ops, step, l);
        }
        // `dwpe[t] += dresidual`, `dwte[token] += dresidual`.
        let grad = |span| TensorRef::of(Region::Grads, span);
        ops.push(step.embed_backward(grad(self.params.wte), Some(grad(self.params.wpe))));
        ops
    }
}

/// Whether a block's `ln_1` also forms the previous block's residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fused {
    /// Forward: `residual3 = residual2 + fcproj` of the block before, then the LayerNorm.
    WithResidual,
    /// Recompute: the LayerNorm of the kept input alone.
    Alone,
}

impl Gpt2Tensors {
    /// `encoded = wte[tokens] + wpe[t]`.
    fn embed_forward(&self, step: &StepTensors) -> Op {
        Op::Embed {
            out: step.encoded,
            tokens: step.tokens,
            wte: TensorRef::of(Region::Params, self.params.wte),
            positions: TensorRef::of(Region::Params, self.params.wpe),
            seq_len: step.shape.seq_len,
        }
    }

    /// Block `l`'s `ln_1`: block 0 reads `encoded`; block `l > 0` first forms block
    /// `l - 1`'s `residual3` ([`Fused::WithResidual`]), or reads it when recomputing.
    fn ln1_forward(&self, step: &StepTensors, l: usize, fused: Fused) -> Op {
        let (a, w) = (&self.blocks[l], &self.params.blocks[l]);
        let param = |span| TensorRef::of(Region::Params, span);
        match (l.checked_sub(1), fused) {
            (Some(prev), Fused::WithResidual) => {
                let p = &self.blocks[prev];
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
            _ => Op::LayerNormForward {
                out: a.ln1,
                mean: a.ln1_mean,
                rstd: a.ln1_rstd,
                inp: self.block_input(step, l),
                weight: param(w.ln_1_weight),
                bias: param(w.ln_1_bias),
            },
        }
    }

    /// Block `l` after its `ln_1`: attention, `attn.c_proj`, `ln_2` (fused with residual2),
    /// the MLP. Its `residual3` is left to the next LayerNorm.
    fn block_forward(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        let (a, w) = (&self.blocks[l], &self.params.blocks[l]);
        let c = self.config.n_embd;
        let n = step.shape.tokens();
        let param = |span| TensorRef::of(Region::Params, span);
        let conv1d = |out, inp, weight, bias, dims| Op::Linear {
            product: dense(
                Pass::Forward,
                WeightLayout::InOut,
                dims,
                Accumulate::Overwrite,
            ),
            out,
            first: inp,
            second: param(weight),
            bias: Some(param(bias)),
        };
        ops.push(conv1d(
            a.qkv,
            a.ln1,
            w.c_attn_weight,
            w.c_attn_bias,
            (n, c, 3 * c),
        ));
        ops.push(Op::AttentionForward {
            out: a.atty,
            lse: a.lse,
            qkv: a.qkv,
            attention: self.attention(step),
        });
        ops.push(conv1d(
            a.attproj,
            a.atty,
            w.attn_proj_weight,
            w.attn_proj_bias,
            (n, c, c),
        ));
        ops.push(Op::ResidualLayerNormForward {
            residual: a.residual2,
            out: a.ln2,
            mean: a.ln2_mean,
            rstd: a.ln2_rstd,
            a: self.block_input(step, l),
            b: a.attproj,
            weight: param(w.ln_2_weight),
            bias: param(w.ln_2_bias),
        });
        ops.push(conv1d(a.fch, a.ln2, w.fc_weight, w.fc_bias, (n, c, 4 * c)));
        ops.push(Op::GeluForward {
            out: a.fch_gelu,
            inp: a.fch,
        });
        ops.push(conv1d(
            a.fcproj,
            a.fch_gelu,
            w.mlp_proj_weight,
            w.mlp_proj_bias,
            (n, 4 * c, c),
        ));
    }

    /// Block `l`'s forward again from its saved input, into the working set all blocks
    /// share under activation checkpointing: `ln_1` alone (the fused residual addition ran
    /// in forward), then the block up to `fch_gelu` (`mlp.c_proj`'s output is not read by
    /// backward, so it is not recomputed).
    fn recompute_block(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        ops.push(self.ln1_forward(step, l, Fused::Alone));
        let mut block = Vec::new();
        self.block_forward(&mut block, step, l);
        block.pop();
        ops.extend(block);
    }

    /// Block `l` in reverse; `dresidual` holds the gradient of its output on entry and of
    /// its input on exit.
    fn block_backward(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        let (a, w) = (&self.blocks[l], &self.params.blocks[l]);
        let c = self.config.n_embd;
        let n = step.shape.tokens();
        let param = |span| TensorRef::of(Region::Params, span);
        let grad = |span| TensorRef::of(Region::Grads, span);
        let (dres, dbtc, dbt4c) = (step.dresidual, step.dbtc, self.dbt4c);
        let dqkv = dbt4c.prefix(n * 3 * c);
        let conv1d = |ops: &mut Vec<Op>, dinp, (weight, bias), dout, inp, dims: GemmDims| {
            conv1d_backward(
                ops,
                step,
                [dinp, grad(weight), grad(bias), dout, inp],
                param(weight),
                dims,
            )
        };

        // MLP: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2)))).
        conv1d(
            ops,
            dbt4c,
            (w.mlp_proj_weight, w.mlp_proj_bias),
            dres,
            a.fch_gelu,
            (n, 4 * c, c),
        );
        ops.push(Op::GeluBackward {
            d: dbt4c,
            inp: a.fch,
        });
        conv1d(
            ops,
            dbtc,
            (w.fc_weight, w.fc_bias),
            dbt4c,
            a.ln2,
            (n, c, 4 * c),
        );
        ops.push(self.layernorm_backward(
            step,
            [grad(w.ln_2_weight), grad(w.ln_2_bias)],
            a.residual2,
            param(w.ln_2_weight),
            [a.ln2_mean, a.ln2_rstd],
        ));

        // Attention: residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))).
        conv1d(
            ops,
            dbtc,
            (w.attn_proj_weight, w.attn_proj_bias),
            dres,
            a.atty,
            (n, c, c),
        );
        ops.push(Op::AttentionBackward {
            dqkv,
            delta: step.attention_delta,
            dout: dbtc,
            out: a.atty,
            qkv: a.qkv,
            lse: a.lse,
            attention: self.attention(step),
        });
        conv1d(
            ops,
            dbtc,
            (w.c_attn_weight, w.c_attn_bias),
            dqkv,
            a.ln1,
            (n, c, 3 * c),
        );
        ops.push(self.layernorm_backward(
            step,
            [grad(w.ln_1_weight), grad(w.ln_1_bias)],
            self.block_input(step, l),
            param(w.ln_1_weight),
            [a.ln1_mean, a.ln1_rstd],
        ));
    }

    /// `ln_f` over the last residual stream (fused with the last block's `residual3`), the
    /// tied `lm_head` (an `nn.Linear` product over `wte`, the logits' rows `Vp` apart:
    /// cuBLASLt's leading dimension, 16-byte aligned), then the classifier.
    fn head_forward(&self, ops: &mut Vec<Op>, step: &StepTensors) {
        let pl = &self.params;
        let param = |span| TensorRef::of(Region::Params, span);
        let (mean, rstd) = (self.lnf_mean, step.lnf_rstd);
        let (weight, bias) = (param(pl.ln_f_weight), param(pl.ln_f_bias));
        ops.push(match self.blocks.last() {
            Some(last) => Op::ResidualLayerNormForward {
                residual: last.residual3,
                out: step.lnf,
                mean,
                rstd,
                a: last.residual2,
                b: last.fcproj,
                weight,
                bias,
            },
            None => Op::LayerNormForward {
                out: step.lnf,
                mean,
                rstd,
                inp: step.encoded,
                weight,
                bias,
            },
        });
        ops.extend(step.lm_head_forward(param(pl.wte)));
    }

    /// The classifier's gradient through the tied `lm_head` (`dlnf = dlogits @ wte`,
    /// `dwte += dlogits^T @ lnf`), then `ln_f` into `dresidual`.
    fn head_backward(&self, ops: &mut Vec<Op>, step: &StepTensors) {
        let pl = &self.params;
        let param = |span| TensorRef::of(Region::Params, span);
        let grad = |span| TensorRef::of(Region::Grads, span);
        ops.extend(step.lm_head_backward(param(pl.wte), grad(pl.wte)));
        let last_residual = self.block_input(step, self.blocks.len());
        ops.push(self.layernorm_backward(
            step,
            [grad(pl.ln_f_weight), grad(pl.ln_f_bias)],
            last_residual,
            param(pl.ln_f_weight),
            [self.lnf_mean, step.lnf_rstd],
        ));
    }

    /// A LayerNorm's backward from `dbtc` into `dresidual`.
    fn layernorm_backward(
        &self,
        step: &StepTensors,
        [dweight, dbias]: [TensorRef; 2],
        inp: TensorRef,
        weight: TensorRef,
        [mean, rstd]: [TensorRef; 2],
    ) -> Op {
        Op::LayerNormBackward {
            dinp: step.dresidual,
            dweight,
            dbias,
            scratch: self.layernorm_partials,
            dout: step.dbtc,
            inp,
            weight,
            mean,
            rstd,
        }
    }
}

/// `matmul_backward` of the CPU model for a `Conv1D`: `dinp = dout @ W^T`,
/// `dW += inp^T @ dout`, `db += colsum(dout)`.
fn conv1d_backward(
    ops: &mut Vec<Op>,
    step: &StepTensors,
    [dinp, dweight, dbias, dout, inp]: [TensorRef; 5],
    weight: TensorRef,
    dims: GemmDims,
) {
    let product = |pass, accumulate| dense(pass, WeightLayout::InOut, dims, accumulate);
    ops.push(Op::Linear {
        product: product(Pass::BackwardInput, Accumulate::Overwrite),
        out: dinp,
        first: dout,
        second: weight,
        bias: None,
    });
    ops.push(Op::Linear {
        product: product(Pass::BackwardWeight, Accumulate::Add),
        out: dweight,
        first: inp,
        second: dout,
        bias: None,
    });
    let chunks = dims
        .0
        .div_ceil(crate::cuda::train::program::COLUMN_PARTIAL_ROWS);
    ops.push(Op::BiasBackward {
        dbiases: vec![dbias],
        scratch: step.bias_partials.prefix(chunks * dims.2),
        dout,
    });
}
