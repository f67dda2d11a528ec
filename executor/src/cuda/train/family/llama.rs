//! The Llama family on the device (Llama, Qwen2, Mistral without a sliding window): its
//! tensors in the step's step ([`LlamaTensors`]) and its recipe, the CPU model's forward and
//! backward (`model/llama/`) as ops, each part's forward next to its backward.
//!
//! The device keeps no `(B, NH, T, T)` probabilities (`lse` and `attention_delta`,
//! `(B, NH, T)`, replace `att` and `datt`), and it keeps the rotation table (`rope_cos`,
//! `rope_sin`, `(T, hs/2)`, f32) in the statistics region, uploaded once. The output and down
//! projections add into a copy of the residual stream (cuBLASLt with `beta = 1`), as the CPU
//! adds them in place. Every parameter gradient is accumulated (`+=`, a tied `lm_head` into
//! the embedding's), so micro-steps add up; with activation checkpointing each layer but the
//! last is re-run from its saved input just before its backward.

use dsplan_planner::memory::cuda_layout::{self, CudaAttentionBias, CudaTensor, LlamaCudaShape};

use super::{ConstantUpload, Recipe, Tensors, layout_shape};
use crate::cuda::element::strided_len;
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::cuda::launch::{GroupedAttention, Heads, Rotation};
use crate::cuda::train::mfu::Mfu;
use crate::cuda::train::program::{
    Attention, COLUMN_PARTIAL_ROWS, GemmDims, Op, ShapeError, check_head_size,
};
use crate::cuda::train::region::{Region, TensorRef};
use crate::cuda::train::step_tensors::{Products, StepTensors};
use crate::model::llama::{AttentionBias, LlamaBlockParams, LlamaConfig, LlamaLayout};
use crate::model::recompute::recomputes;
use crate::model::{BatchShape, ModelConfig, Recompute};
use crate::tensor::{Span, TensorTable};
use crate::train::AttentionKernel;

/// The activations one decoder layer keeps on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaBlock {
    /// `input_layernorm` output `(B, T, C)`.
    pub ln1: TensorRef,
    /// Its reciprocal RMS `(B, T)`, f32.
    pub ln1_rstd: TensorRef,
    /// `[q | k | v]`, `q` and `k` rotated `(B, T, QKV)`.
    pub qkv: TensorRef,
    /// Attention's log-sum-exp `(B, NH, T)`, f32 (replaces the CPU's `att`).
    pub lse: TensorRef,
    /// Attention output, heads side by side `(B, T, A)`.
    pub atty: TensorRef,
    /// The residual stream after attention `(B, T, C)`.
    pub residual2: TensorRef,
    /// `post_attention_layernorm` output `(B, T, C)`.
    pub ln2: TensorRef,
    /// Its reciprocal RMS, f32.
    pub ln2_rstd: TensorRef,
    /// `[gate | up]` `(B, T, 2I)`.
    pub gate_up: TensorRef,
    /// `silu(gate) * up` `(B, T, I)`.
    pub swiglu: TensorRef,
    /// The residual stream after the layer `(B, T, C)`.
    pub residual3: TensorRef,
}

/// The Llama family's own tensors of the step (the ones every family has are
/// `DeviceLayout`'s).
#[derive(Debug, Clone)]
pub struct LlamaTensors {
    /// The model.
    pub config: LlamaConfig,
    /// The parameter step (params, grads, master and moments share it).
    pub params: LlamaLayout,
    /// Per layer.
    pub blocks: Vec<LlamaBlock>,
    /// The rotation table's cosines `(T, hs/2)`, f32.
    pub rope_cos: TensorRef,
    /// Its sines `(T, hs/2)`, f32.
    pub rope_sin: TensorRef,
    /// `(B, T, max(QKV, 2I))`: `dqkv` or `dgate_up`.
    pub dwide: TensorRef,
    /// `(B, T, max(A, I))`: `datty` or `dswiglu`.
    pub dmid: TensorRef,
    /// RMSNorm backward's partials `ceil(N/32) x C`, f32.
    pub rmsnorm_partials: TensorRef,
}

/// One projection of a product split by columns (q, k, v; gate, up): its weight, bias, first
/// column in the output rows and width.
#[derive(Debug, Clone, Copy)]
struct Part {
    /// `(width, C)`.
    weight: Span,
    /// `(width)`.
    bias: Option<Span>,
    /// First column in an output row.
    column: usize,
    /// Columns.
    width: usize,
}

impl LlamaTensors {
    /// The planner's tensors of a step of `config` on `shape` (the list the `dsplan-cuda`
    /// plan counts).
    pub fn planner_tensors(
        config: &LlamaConfig,
        shape: BatchShape,
        recompute: Recompute,
    ) -> Vec<CudaTensor> {
        let params = LlamaLayout::new(config).table().entries().len();
        let as_u64 = |n: usize| n as u64;
        cuda_layout::llama_cuda_tensors(&LlamaCudaShape {
            base: layout_shape(ModelConfig::Llama(*config), shape, params),
            kv_heads: as_u64(config.num_key_value_heads),
            head_dim: as_u64(config.head_dim),
            intermediate: as_u64(config.intermediate_size),
            attention_bias: match config.attention_bias {
                AttentionBias::Absent => CudaAttentionBias::Absent,
                AttentionBias::Qkv => CudaAttentionBias::Qkv,
                AttentionBias::QkvO => CudaAttentionBias::QkvO,
            },
            recompute,
        })
    }

    /// The family's tensors, read by name from the planner's `tables`.
    pub fn new(config: LlamaConfig, recompute: Recompute, tables: &Tensors<'_>) -> Self {
        let blocks = (0..config.num_hidden_layers)
            .map(|l| {
                let block = tables.block(recompute, l);
                LlamaBlock {
                    ln1: block.act("ln1"),
                    ln1_rstd: block.stat("ln1_rstd"),
                    qkv: block.act("qkv"),
                    lse: block.stat("lse"),
                    atty: block.act("atty"),
                    residual2: block.act("residual2"),
                    ln2: block.act("ln2"),
                    ln2_rstd: block.stat("ln2_rstd"),
                    gate_up: block.act("gate_up"),
                    swiglu: block.act("swiglu"),
                    residual3: block.act("residual3"),
                }
            })
            .collect();
        Self {
            params: LlamaLayout::new(&config),
            config,
            blocks,
            rope_cos: tables.stat("rope_cos"),
            rope_sin: tables.stat("rope_sin"),
            dwide: tables.activation("dwide"),
            dmid: tables.activation("dmid"),
            rmsnorm_partials: tables.scratch("rmsnorm_partials"),
        }
    }

    /// The input of layer `l`'s residual stream (`encoded`, or the previous layer's
    /// `residual3`).
    fn block_input(&self, step: &StepTensors, l: usize) -> TensorRef {
        match l.checked_sub(1) {
            None => step.encoded,
            Some(prev) => self.blocks[prev].residual3,
        }
    }

    /// Layer `l`'s tensors and parameters, and the widths its ops use: hidden `C`,
    /// intermediate `I`, the query and q/k/v widths, the tokens `N`.
    fn layer(&self, step: &StepTensors, l: usize) -> (&LlamaBlock, &LlamaBlockParams, [usize; 5]) {
        let config = &self.config;
        let widths = [
            config.hidden_size,
            config.intermediate_size,
            config.q_width(),
            config.qkv_width(),
            step.shape.tokens(),
        ];
        (&self.blocks[l], &self.params.blocks[l], widths)
    }

    /// Grouped-query attention's sizes.
    fn attention(&self, step: &StepTensors) -> Attention {
        Attention {
            dims: GroupedAttention {
                batch: step.shape.batch,
                seq_len: step.shape.seq_len,
                n_head: self.config.num_attention_heads,
                kv_heads: self.config.num_key_value_heads,
                head_dim: self.config.head_dim,
            },
            heads: Heads::Grouped,
            kernel: AttentionKernel::Scalar,
        }
    }

    /// The rotation of layer rows `rows` (`qkv` forward, `dqkv` backward): q's and k's heads.
    fn rope(&self, step: &StepTensors, rows: TensorRef, rotation: Rotation) -> Op {
        let config = &self.config;
        Op::Rope {
            rows,
            cos: self.rope_cos,
            sin: self.rope_sin,
            heads: config.num_attention_heads + config.num_key_value_heads,
            width: config.qkv_width(),
            seq_len: step.shape.seq_len,
            rotation,
        }
    }

    /// `[gate | up]` as the products compute them: one `(2I, C)` weight (the two are back to
    /// back: no MLP biases), or each on its own columns of `gate_up` ([`Products::PerTensor`]).
    fn gate_up_parts(&self, step: &StepTensors, w: &LlamaBlockParams) -> Vec<Part> {
        let i = self.config.intermediate_size;
        if step.products == Products::Fused {
            let weight = Span::new(
                w.gate_weight.offset,
                w.up_weight.end() - w.gate_weight.offset,
            );
            return vec![part(weight, None, 0, 2 * i)];
        }
        vec![
            part(w.gate_weight, None, 0, i),
            part(w.up_weight, None, i, i),
        ]
    }

    /// The q, k and v projections as the products compute them: one `(QKV, C)` weight when
    /// the three weights are back to back (no biases) and the products are fused
    /// ([`Products::Fused`]), else each on its own columns.
    fn qkv_parts(&self, step: &StepTensors, w: &LlamaBlockParams) -> Vec<Part> {
        let (a, kv) = (self.config.q_width(), self.config.kv_width());
        if w.q_bias.is_none() && step.products == Products::Fused {
            let weight = Span::new(w.q_weight.offset, w.v_weight.end() - w.q_weight.offset);
            return vec![part(weight, None, 0, self.config.qkv_width())];
        }
        vec![
            part(w.q_weight, w.q_bias, 0, a),
            part(w.k_weight, w.k_bias, a, kv),
            part(w.v_weight, w.v_bias, a + kv, kv),
        ]
    }
}

fn part(weight: Span, bias: Option<Span>, column: usize, width: usize) -> Part {
    Part {
        weight,
        bias,
        column,
        width,
    }
}

/// Columns `column..column + width` of the `(N, stride)` buffer `whole`, as a strided operand.
fn columns(whole: TensorRef, rows: usize, stride: usize, part: &Part) -> TensorRef {
    TensorRef {
        region: whole.region,
        span: Span::new(
            whole.span.offset + part.column,
            strided_len(rows, part.width, stride),
        ),
    }
}

/// An `nn.Linear` product: weight `(OC, IC)`, the `(N, OC)` operand's rows `stride` apart.
fn linear(pass: Pass, dims: GemmDims, stride: usize, accumulate: Accumulate) -> Product {
    Product {
        pass,
        weight: WeightLayout::OutIn,
        dims,
        stride,
        accumulate,
    }
}

/// The operands of one `nn.Linear` backward.
struct LinearBackward {
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
fn linear_backward(ops: &mut Vec<Op>, p: LinearBackward) {
    ops.push(Op::Linear {
        product: linear(Pass::BackwardInput, p.dims, p.dout_stride, p.accumulate),
        out: p.dinp,
        first: p.dout,
        second: p.weight,
        bias: None,
    });
    ops.push(Op::Linear {
        product: linear(Pass::BackwardWeight, p.dims, p.dout_stride, Accumulate::Add),
        out: p.dweight,
        first: p.inp,
        second: p.dout,
        bias: None,
    });
}

/// The first product of a split one overwrites, the others add.
fn first_overwrites(k: usize) -> Accumulate {
    if k == 0 {
        Accumulate::Overwrite
    } else {
        Accumulate::Add
    }
}

impl Recipe for LlamaTensors {
    fn model(&self) -> ModelConfig {
        ModelConfig::Llama(self.config)
    }

    fn param_table(&self) -> &TensorTable {
        self.params.table()
    }

    /// The head size has attention kernels, and the model has no sliding window shorter than
    /// the rows (the kernels are causal over the whole row).
    fn check(&self, step: &StepTensors) -> Result<(), ShapeError> {
        check_head_size(self.config.head_dim, step.dtype)?;
        if let Some(window) = self.config.sliding_window
            && window < step.shape.seq_len
        {
            return Err(ShapeError(format!(
                "sliding_window {window} is shorter than the rows ({} tokens): the CUDA \
                 attention kernels are causal over the whole row; train with --device cpu",
                step.shape.seq_len
            )));
        }
        Ok(())
    }

    fn constants(&self, step: &StepTensors) -> Vec<ConstantUpload> {
        let table = self
            .config
            .rope
            .table(self.config.head_dim, step.shape.seq_len);
        vec![
            ConstantUpload {
                at: self.rope_cos,
                values: table.cos().to_vec(),
            },
            ConstantUpload {
                at: self.rope_sin,
                values: table.sin().to_vec(),
            },
        ]
    }

    fn mfu(&self, _seq_len: usize, _device: &str) -> Option<Mfu> {
        None
    }

    fn forward(&self, step: &StepTensors) -> Vec<Op> {
        let mut ops = self.embed_forward(step);
        for l in 0..self.blocks.len() {
            self.block_forward(&mut ops, step, l);
        }
        ops.push(self.norm_forward(step));
        ops.extend(step.lm_head_forward(TensorRef::of(Region::Params, self.params.lm_head)));
        ops
    }

    fn backward(&self, step: &StepTensors) -> Vec<Op> {
        let pl = &self.params;
        let mut ops = vec![Op::Zero {
            tensor: step.dresidual,
        }];
        ops.extend(step.lm_head_backward(
            TensorRef::of(Region::Params, pl.lm_head),
            TensorRef::of(Region::Grads, pl.lm_head),
        ));
        ops.push(self.norm_backward(step));
        let layers = self.blocks.len();
        for l in (0..layers).rev() {
            if recomputes(step.recompute, l, layers) {
                self.recompute_block(&mut ops, step, l);
            }
            self.block_backward(&mut ops, step, l);
        }
        // `dembed[token] += dresidual`.
        ops.push(step.embed_backward(TensorRef::of(Region::Grads, pl.embed), None));
        ops
    }
}

impl LlamaTensors {
    /// `encoded = embed_tokens[tokens]`: the encoder kernel over a zeroed position table
    /// (the first `T` rows of `dbtc`, zeroed first).
    fn embed_forward(&self, step: &StepTensors) -> Vec<Op> {
        let zeros = step
            .dbtc
            .prefix(step.shape.seq_len * self.config.hidden_size);
        vec![
            Op::Zero { tensor: zeros },
            Op::Embed {
                out: step.encoded,
                tokens: step.tokens,
                wte: TensorRef::of(Region::Params, self.params.embed),
                positions: zeros,
                seq_len: step.shape.seq_len,
            },
        ]
    }

    /// `model.norm` over the last residual stream.
    fn norm_forward(&self, step: &StepTensors) -> Op {
        Op::RmsNormForward {
            out: step.lnf,
            rstd: step.lnf_rstd,
            inp: self.block_input(step, self.blocks.len()),
            weight: TensorRef::of(Region::Params, self.params.norm),
        }
    }

    /// `model.norm`'s backward from `dlnf` (`dbtc`) into `dresidual`.
    fn norm_backward(&self, step: &StepTensors) -> Op {
        self.rmsnorm_backward(
            step,
            self.params.norm,
            self.block_input(step, self.blocks.len()),
            step.lnf_rstd,
        )
    }

    /// An RMSNorm's backward from `dbtc` into `dresidual`.
    fn rmsnorm_backward(
        &self,
        step: &StepTensors,
        weight: Span,
        inp: TensorRef,
        rstd: TensorRef,
    ) -> Op {
        Op::RmsNormBackward {
            dinp: step.dresidual,
            dweight: TensorRef::of(Region::Grads, weight),
            scratch: self.rmsnorm_partials,
            dout: step.dbtc,
            inp,
            weight: TensorRef::of(Region::Params, weight),
            rstd,
        }
    }

    /// Decoder layer `l`: `input_layernorm`, q/k/v, the rotation, attention, `o_proj` into
    /// the residual stream, `post_attention_layernorm`, `[gate | up]`, SwiGLU, `down_proj`
    /// into the residual stream.
    fn block_forward(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        let (a, w, [c, i, q, qkv, n]) = self.layer(step, l);
        let param = |span| TensorRef::of(Region::Params, span);
        let input = self.block_input(step, l);
        let forward = |out, inp, weight, bias: Option<Span>, dims, stride, accumulate| Op::Linear {
            product: linear(Pass::Forward, dims, stride, accumulate),
            out,
            first: inp,
            second: param(weight),
            bias: bias.map(param),
        };
        ops.push(Op::RmsNormForward {
            out: a.ln1,
            rstd: a.ln1_rstd,
            inp: input,
            weight: param(w.input_norm),
        });
        for part in self.qkv_parts(step, w) {
            ops.push(forward(
                columns(a.qkv, n, qkv, &part),
                a.ln1,
                part.weight,
                part.bias,
                (n, c, part.width),
                qkv,
                Accumulate::Overwrite,
            ));
        }
        ops.push(self.rope(step, a.qkv, Rotation::Forward));
        ops.push(Op::AttentionForward {
            out: a.atty,
            lse: a.lse,
            qkv: a.qkv,
            attention: self.attention(step),
        });
        ops.push(Op::Copy {
            dst: a.residual2,
            src: input,
        });
        ops.push(forward(
            a.residual2,
            a.atty,
            w.o_weight,
            w.o_bias,
            (n, q, c),
            c,
            Accumulate::Add,
        ));
        ops.push(Op::RmsNormForward {
            out: a.ln2,
            rstd: a.ln2_rstd,
            inp: a.residual2,
            weight: param(w.post_attention_norm),
        });
        for part in self.gate_up_parts(step, w) {
            ops.push(forward(
                columns(a.gate_up, n, 2 * i, &part),
                a.ln2,
                part.weight,
                None,
                (n, c, part.width),
                2 * i,
                Accumulate::Overwrite,
            ));
        }
        ops.push(Op::SwiGluForward {
            out: a.swiglu,
            gate_up: a.gate_up,
            inner: i,
        });
        ops.push(Op::Copy {
            dst: a.residual3,
            src: a.residual2,
        });
        ops.push(forward(
            a.residual3,
            a.swiglu,
            w.down_weight,
            None,
            (n, i, c),
            c,
            Accumulate::Add,
        ));
    }

    /// Layer `l`'s forward again from its saved input, into the working set all layers share
    /// under activation checkpointing: every op up to SwiGLU (the copy into `residual3` and
    /// `down_proj`'s addition are not read by backward, and `residual3` is kept).
    fn recompute_block(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        let mut block = Vec::new();
        self.block_forward(&mut block, step, l);
        block.truncate(block.len().saturating_sub(2));
        ops.extend(block);
    }

    /// Layer `l` in reverse; `dresidual` holds the gradient of its output on entry and of
    /// its input on exit.
    fn block_backward(&self, ops: &mut Vec<Op>, step: &StepTensors, l: usize) {
        let (a, w, [c, i, q, qkv, n]) = self.layer(step, l);
        let param = |span| TensorRef::of(Region::Params, span);
        let grad = |span| TensorRef::of(Region::Grads, span);
        let (dres, dbtc) = (step.dresidual, step.dbtc);

        // MLP: residual3 = residual2 + down(swiglu(gate_up(ln2(residual2)))).
        let dswiglu = self.dmid.prefix(n * i);
        let dgate_up = self.dwide.prefix(n * 2 * i);
        linear_backward(
            ops,
            LinearBackward {
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
        ops.push(Op::SwiGluBackward {
            dgate_up,
            dout: dswiglu,
            gate_up: a.gate_up,
            inner: i,
        });
        // The parts in reverse (up, then gate), the order their modules' backward runs in:
        // the order the plan's stage-3 schedule fetches and releases them.
        for (k, part) in self.gate_up_parts(step, w).iter().rev().enumerate() {
            linear_backward(
                ops,
                LinearBackward {
                    dinp: dbtc,
                    dweight: grad(part.weight),
                    dout: columns(dgate_up, n, 2 * i, part),
                    inp: a.ln2,
                    weight: param(part.weight),
                    dims: (n, c, part.width),
                    dout_stride: 2 * i,
                    accumulate: first_overwrites(k),
                },
            );
        }
        ops.push(self.rmsnorm_backward(step, w.post_attention_norm, a.residual2, a.ln2_rstd));

        // Attention: residual2 = input + o(attn(rope(qkv(ln1(input))))).
        let datty = self.dmid.prefix(n * q);
        let dqkv = self.dwide.prefix(n * qkv);
        linear_backward(
            ops,
            LinearBackward {
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
                dbiases: vec![grad(o_bias)],
                scratch: step
                    .bias_partials
                    .prefix(n.div_ceil(COLUMN_PARTIAL_ROWS) * c),
                dout: dres,
            });
        }
        ops.push(Op::AttentionBackward {
            dqkv,
            delta: step.attention_delta,
            dout: datty,
            out: a.atty,
            qkv: a.qkv,
            lse: a.lse,
            attention: self.attention(step),
        });
        ops.push(self.rope(step, dqkv, Rotation::Backward));
        let parts = self.qkv_parts(step, w);
        // The biases first, as soon as `dqkv` is whole: v's bias is reduced with the modules
        // after it (o, the norm), before k's and q's products run.
        let biases: Vec<TensorRef> = parts.iter().filter_map(|p| p.bias.map(grad)).collect();
        if !biases.is_empty() && biases.len() == parts.len() {
            ops.push(Op::BiasBackward {
                dbiases: biases,
                scratch: step
                    .bias_partials
                    .prefix(n.div_ceil(COLUMN_PARTIAL_ROWS) * qkv),
                dout: dqkv,
            });
        }
        // v, k, then q: the reverse of the modules' forward order, as for gate and up.
        for (k, part) in parts.iter().rev().enumerate() {
            linear_backward(
                ops,
                LinearBackward {
                    dinp: dbtc,
                    dweight: grad(part.weight),
                    dout: columns(dqkv, n, qkv, part),
                    inp: a.ln1,
                    weight: param(part.weight),
                    dims: (n, c, part.width),
                    dout_stride: qkv,
                    accumulate: first_overwrites(k),
                },
            );
        }
        ops.push(self.rmsnorm_backward(step, w.input_norm, self.block_input(step, l), a.ln1_rstd));
    }
}
