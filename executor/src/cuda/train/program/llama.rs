//! [`LlamaOp`]: the operations only the Llama family's device step uses (RMSNorm, rotary
//! embeddings, SwiGLU, grouped-query attention, `nn.Linear` products with strided operands,
//! the embedding without positions), as data: what each touches, the region each operand
//! lives in, its shape rules and the kernels it launches, side by side.
//!
//! A "strided" operand is a column block of a wider row-major buffer: `(N, W)` with rows
//! `S >= W` elements apart, spanning `(N - 1)·S + W` elements from its first column (q, k
//! and v of `qkv` when each projection has its own bias).

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::launches::{described, library, one};
use super::{Access, GemmDims, Launch, ShapeError, divides, expect, expect_strided};
use crate::cuda::gemm::Accumulate;
use crate::cuda::launch::table::{self, Heads, RopeShape};
use crate::cuda::launch::{GroupedAttention, Rotation};
use crate::cuda::train::buffers::{Region, TensorRef};
use crate::train::AttentionKernel;

/// Rows per block of `rmsnorm_backward` (its `RMSNORM_BACKWARD_ROWS`).
const RMSNORM_BACKWARD_ROWS: usize = 32;
/// Rows per chunk of `column_partials`.
const COLUMN_PARTIAL_ROWS: usize = 64;

/// One operation of the Llama family's device step.
#[derive(Debug, Clone, PartialEq)]
pub enum LlamaOp {
    /// `out = wte[tokens]`: the encoder kernel with a zeroed position table `zeros` `(T, C)`.
    Embed {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        tokens: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(T, C)` zeros.
        zeros: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `dwte[token] += dout` rows, by token buckets (`encoder_backward_wte`).
    EmbedBackward {
        /// `(V, C)`.
        dwte: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// Distinct tokens (at most `N`).
        bucket_tokens: TensorRef,
        /// Group starts.
        bucket_starts: TensorRef,
        /// `(N)`.
        bucket_rows: TensorRef,
    },
    /// `out = weight * inp * rstd`, saving `rstd`.
    RmsNormForward {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)` f32.
        rstd: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
    },
    /// `dinp += RMSNorm'`, `dweight += ...`.
    RmsNormBackward {
        /// `(N, C)`, accumulated.
        dinp: TensorRef,
        /// `(C)`, accumulated.
        dweight: TensorRef,
        /// f32 partials `ceil(N/32) x C`.
        scratch: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(N)` f32.
        rstd: TensorRef,
    },
    /// `dst = src` (a device copy: the residual stream before a projection adds to it).
    Copy {
        /// Destination.
        dst: TensorRef,
        /// Source, as long.
        src: TensorRef,
    },
    /// `out (+)= inp @ weight^T (+ bias)`, weight `(OC, IC)`.
    LinearForward {
        /// `(N, OC)`, rows `out_stride` apart.
        out: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(OC, IC)`.
        weight: TensorRef,
        /// `(OC)`.
        bias: Option<TensorRef>,
        /// `(N, IC, OC)`.
        dims: GemmDims,
        /// Row pitch of `out`.
        out_stride: usize,
        /// Overwrite or add.
        accumulate: Accumulate,
    },
    /// `dinp (+)= dout @ weight`.
    LinearBackwardInput {
        /// `(N, IC)`.
        dinp: TensorRef,
        /// `(N, OC)`, rows `dout_stride` apart.
        dout: TensorRef,
        /// `(OC, IC)`.
        weight: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
        /// Row pitch of `dout`.
        dout_stride: usize,
        /// Overwrite or add.
        accumulate: Accumulate,
    },
    /// `dweight += dout^T @ inp`.
    LinearBackwardWeight {
        /// `(OC, IC)`.
        dweight: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(N, OC)`, rows `dout_stride` apart.
        dout: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
        /// Row pitch of `dout`.
        dout_stride: usize,
    },
    /// The q, k and v bias gradients from `dqkv (N, QKV)`: one pass of column sums, then each
    /// bias adds its columns (`dbiases[i]` takes the `widths[i]` columns after the previous).
    QkvBiasBackward {
        /// `dq_bias`, `dk_bias`, `dv_bias`, accumulated.
        dbiases: [TensorRef; 3],
        /// f32 partials `ceil(N/64) x QKV`.
        scratch: TensorRef,
        /// `(N, QKV)`.
        dqkv: TensorRef,
        /// `[A, KV·hs, KV·hs]`.
        widths: [usize; 3],
    },
    /// Rotary embedding in place on the first `heads·hs` columns of each row.
    Rope {
        /// `(N, width)`.
        rows: TensorRef,
        /// `(T, hs/2)` f32.
        cos: TensorRef,
        /// `(T, hs/2)` f32.
        sin: TensorRef,
        /// Heads rotated (`NH + KV`: q and k).
        heads: usize,
        /// Row width.
        width: usize,
        /// `T`.
        seq_len: usize,
        /// Forward, or its transpose on the gradient.
        rotation: Rotation,
    },
    /// `out = silu(gate) * up`.
    SwiGluForward {
        /// `(N, I)`.
        out: TensorRef,
        /// `(N, 2I)`.
        gate_up: TensorRef,
        /// `I`.
        inner: usize,
    },
    /// `dgate_up` from `dout` (written).
    SwiGluBackward {
        /// `(N, 2I)`.
        dgate_up: TensorRef,
        /// `(N, I)`.
        dout: TensorRef,
        /// `(N, 2I)`.
        gate_up: TensorRef,
        /// `I`.
        inner: usize,
    },
    /// Causal grouped-query attention forward.
    AttentionForward {
        /// `(B, T, NH·hs)`.
        out: TensorRef,
        /// `(B, NH, T)` f32.
        lse: TensorRef,
        /// `(B, T, (NH + 2KV)·hs)`.
        qkv: TensorRef,
        /// Its sizes.
        dims: GroupedAttention,
        /// Which kernels compute it (`StepProgram::with_attention` sets it for a run).
        kernel: AttentionKernel,
    },
    /// Causal grouped-query attention backward (written, not accumulated).
    AttentionBackward {
        /// `(B, T, (NH + 2KV)·hs)`.
        dqkv: TensorRef,
        /// `(B, NH, T)` f32 scratch.
        delta: TensorRef,
        /// `(B, T, NH·hs)`.
        dout: TensorRef,
        /// `(B, T, NH·hs)`.
        out: TensorRef,
        /// `(B, T, (NH + 2KV)·hs)`.
        qkv: TensorRef,
        /// `(B, NH, T)` f32.
        lse: TensorRef,
        /// Its sizes.
        dims: GroupedAttention,
        /// Which kernels compute it.
        kernel: AttentionKernel,
    },
}

fn attention_sizes(dims: &GroupedAttention) -> Result<(usize, usize), ShapeError> {
    if dims.kv_heads == 0 || !dims.n_head.is_multiple_of(dims.kv_heads) {
        return Err(ShapeError(format!(
            "{} key/value heads do not divide {} query heads",
            dims.kv_heads, dims.n_head
        )));
    }
    let rows = dims.batch * dims.seq_len;
    Ok((
        rows * (dims.n_head + 2 * dims.kv_heads) * dims.head_dim,
        rows * dims.n_head * dims.head_dim,
    ))
}

impl LlamaOp {
    /// Every tensor the op touches, with whether it writes it.
    pub fn tensors(&self) -> Vec<(TensorRef, Access)> {
        let mut op = self.clone();
        op.tensors_mut().into_iter().map(|(t, a)| (*t, a)).collect()
    }

    /// [`Self::tensors`], each to be moved (the one list of an op's operands).
    pub fn tensors_mut(&mut self) -> Vec<(&mut TensorRef, Access)> {
        use Access::{Read, Write};
        match self {
            LlamaOp::Embed {
                out,
                tokens,
                wte,
                zeros,
                ..
            } => vec![(out, Write), (tokens, Read), (wte, Read), (zeros, Read)],
            LlamaOp::EmbedBackward {
                dwte,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
            } => vec![
                (dwte, Write),
                (dout, Read),
                (bucket_tokens, Read),
                (bucket_starts, Read),
                (bucket_rows, Read),
            ],
            LlamaOp::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => vec![(out, Write), (rstd, Write), (inp, Read), (weight, Read)],
            LlamaOp::RmsNormBackward {
                dinp,
                dweight,
                scratch,
                dout,
                inp,
                weight,
                rstd,
            } => vec![
                (dinp, Write),
                (dweight, Write),
                (scratch, Write),
                (dout, Read),
                (inp, Read),
                (weight, Read),
                (rstd, Read),
            ],
            LlamaOp::Copy { dst, src } => vec![(dst, Write), (src, Read)],
            LlamaOp::LinearForward {
                out,
                inp,
                weight,
                bias,
                ..
            } => {
                let mut list = vec![(out, Write), (inp, Read), (weight, Read)];
                list.extend(bias.as_mut().map(|b| (b, Read)));
                list
            }
            LlamaOp::LinearBackwardInput {
                dinp, dout, weight, ..
            } => vec![(dinp, Write), (dout, Read), (weight, Read)],
            LlamaOp::LinearBackwardWeight {
                dweight, inp, dout, ..
            } => vec![(dweight, Write), (inp, Read), (dout, Read)],
            LlamaOp::QkvBiasBackward {
                dbiases,
                scratch,
                dqkv,
                ..
            } => {
                let mut list: Vec<(&mut TensorRef, Access)> =
                    dbiases.iter_mut().map(|b| (b, Write)).collect();
                list.extend([(scratch, Write), (dqkv, Read)]);
                list
            }
            LlamaOp::Rope { rows, cos, sin, .. } => {
                vec![(rows, Write), (cos, Read), (sin, Read)]
            }
            LlamaOp::SwiGluForward { out, gate_up, .. } => {
                vec![(out, Write), (gate_up, Read)]
            }
            LlamaOp::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                ..
            } => vec![(dgate_up, Write), (dout, Read), (gate_up, Read)],
            LlamaOp::AttentionForward { out, lse, qkv, .. } => {
                vec![(out, Write), (lse, Write), (qkv, Read)]
            }
            LlamaOp::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                ..
            } => vec![
                (dqkv, Write),
                (delta, Write),
                (dout, Read),
                (out, Read),
                (qkv, Read),
                (lse, Read),
            ],
        }
    }

    /// The region each operand must live in, in [`LlamaOp::tensors`] order.
    pub fn expected_regions(&self) -> Vec<Region> {
        use Region::{Grads as G, Params as P};
        const A: Region = Region::Step(CudaRegion::Activations);
        const S: Region = Region::Step(CudaRegion::Stats);
        const SCRATCH: Region = Region::Step(CudaRegion::Scratch);
        const TOKENS: Region = Region::Step(CudaRegion::Tokens);
        const BUCKET_TOKENS: Region = Region::Step(CudaRegion::BucketTokens);
        const BUCKET_STARTS: Region = Region::Step(CudaRegion::BucketStarts);
        const BUCKET_ROWS: Region = Region::Step(CudaRegion::BucketRows);
        match self {
            LlamaOp::Embed { .. } => vec![A, TOKENS, P, A],
            LlamaOp::EmbedBackward { .. } => vec![G, A, BUCKET_TOKENS, BUCKET_STARTS, BUCKET_ROWS],
            LlamaOp::RmsNormForward { .. } => vec![A, S, A, P],
            LlamaOp::RmsNormBackward { .. } => vec![A, G, SCRATCH, A, A, P, S],
            LlamaOp::Copy { .. } | LlamaOp::SwiGluForward { .. } => vec![A, A],
            LlamaOp::LinearForward { bias, .. } => {
                let mut list = vec![A, A, P];
                list.extend(bias.map(|_| P));
                list
            }
            LlamaOp::LinearBackwardInput { .. } => vec![A, A, P],
            LlamaOp::LinearBackwardWeight { .. } => vec![G, A, A],
            LlamaOp::QkvBiasBackward { .. } => vec![G, G, G, SCRATCH, A],
            LlamaOp::Rope { .. } => vec![A, S, S],
            LlamaOp::SwiGluBackward { .. } => vec![A, A, A],
            LlamaOp::AttentionForward { .. } => vec![A, S, A],
            LlamaOp::AttentionBackward { .. } => vec![A, SCRATCH, A, A, A, S],
        }
    }

    /// The launcher's shape rules on the op's spans.
    pub fn check_shapes(&self) -> Result<(), ShapeError> {
        match self {
            LlamaOp::Embed {
                out,
                tokens,
                wte,
                zeros,
                seq_len,
            } => {
                let rows = tokens.len();
                let c = divides("out", out.len(), rows)?;
                divides("wte", wte.len(), c)?;
                if *seq_len == 0 || rows % seq_len != 0 {
                    return Err(ShapeError(format!(
                        "{rows} tokens do not form rows of T = {seq_len}"
                    )));
                }
                expect("zeros", zeros, seq_len * c)
            }
            LlamaOp::EmbedBackward {
                dwte,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
            } => {
                let c = divides("dout", dout.len(), bucket_rows.len())?;
                expect("bucket starts", bucket_starts, bucket_tokens.len() + 1)?;
                divides("dwte", dwte.len(), c).map(|_| ())
            }
            LlamaOp::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => {
                let (c, n) = (weight.len(), rstd.len());
                expect("inp", inp, n * c)?;
                expect("out", out, n * c)
            }
            LlamaOp::RmsNormBackward {
                dinp,
                dweight,
                scratch,
                dout,
                inp,
                weight,
                rstd,
            } => {
                let (c, n) = (weight.len(), rstd.len());
                for (what, t) in [("dinp", dinp), ("dout", dout), ("inp", inp)] {
                    expect(what, t, n * c)?;
                }
                expect("dweight", dweight, c)?;
                expect("scratch", scratch, n.div_ceil(RMSNORM_BACKWARD_ROWS) * c)
            }
            LlamaOp::Copy { dst, src } => expect("dst", dst, src.len()),
            LlamaOp::LinearForward {
                out,
                inp,
                weight,
                bias,
                dims: (n, ic, oc),
                out_stride,
                ..
            } => {
                expect_strided("out", out, (*n, *oc, *out_stride))?;
                expect("inp", inp, n * ic)?;
                expect("weight", weight, oc * ic)?;
                bias.map_or(Ok(()), |b| expect("bias", &b, *oc))
            }
            LlamaOp::LinearBackwardInput {
                dinp,
                dout,
                weight,
                dims: (n, ic, oc),
                dout_stride,
                ..
            } => {
                expect("dinp", dinp, n * ic)?;
                expect_strided("dout", dout, (*n, *oc, *dout_stride))?;
                expect("weight", weight, oc * ic)
            }
            LlamaOp::LinearBackwardWeight {
                dweight,
                inp,
                dout,
                dims: (n, ic, oc),
                dout_stride,
            } => {
                expect("dweight", dweight, oc * ic)?;
                expect("inp", inp, n * ic)?;
                expect_strided("dout", dout, (*n, *oc, *dout_stride))
            }
            LlamaOp::QkvBiasBackward {
                dbiases,
                scratch,
                dqkv,
                widths,
            } => {
                for (what, (bias, width)) in ["dq_bias", "dk_bias", "dv_bias"]
                    .iter()
                    .zip(dbiases.iter().zip(widths))
                {
                    expect(what, bias, *width)?;
                }
                let width: usize = widths.iter().sum();
                let rows = divides("dqkv", dqkv.len(), width)?;
                expect(
                    "scratch",
                    scratch,
                    rows.div_ceil(COLUMN_PARTIAL_ROWS) * width,
                )
            }
            LlamaOp::Rope {
                rows,
                cos,
                sin,
                heads,
                width,
                seq_len,
                ..
            } => {
                expect("sin", sin, cos.len())?;
                let half = divides("cos", cos.len(), *seq_len)?;
                let n = divides("rows", rows.len(), *width)?;
                if heads * 2 * half > *width || !n.is_multiple_of(*seq_len) {
                    return Err(ShapeError(format!(
                        "{heads} heads of {} in rows of {width}, {n} rows of T = {seq_len}",
                        2 * half
                    )));
                }
                Ok(())
            }
            LlamaOp::SwiGluForward {
                out,
                gate_up,
                inner,
            } => {
                let n = divides("gate_up", gate_up.len(), 2 * inner)?;
                expect("out", out, n * inner)
            }
            LlamaOp::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                inner,
            } => {
                let n = divides("gate_up", gate_up.len(), 2 * inner)?;
                expect("dgate_up", dgate_up, gate_up.len())?;
                expect("dout", dout, n * inner)
            }
            LlamaOp::AttentionForward {
                out,
                lse,
                qkv,
                dims,
                ..
            } => {
                let (qkv_len, out_len) = attention_sizes(dims)?;
                expect("qkv", qkv, qkv_len)?;
                expect("out", out, out_len)?;
                expect("lse", lse, dims.batch * dims.n_head * dims.seq_len)
            }
            LlamaOp::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                dims,
                ..
            } => {
                let (qkv_len, out_len) = attention_sizes(dims)?;
                expect("qkv", qkv, qkv_len)?;
                expect("dqkv", dqkv, qkv_len)?;
                expect("dout", dout, out_len)?;
                expect("out", out, out_len)?;
                let stats = dims.batch * dims.n_head * dims.seq_len;
                expect("lse", lse, stats)?;
                expect("delta", delta, stats)
            }
        }
    }

    /// The kernels the op launches in order, for model dtype `dtype` (the embedding's bucket
    /// count taken at its largest, one group per row).
    pub fn launches(&self, dtype: Dtype) -> Result<Vec<Launch>, ShapeError> {
        match self {
            LlamaOp::Embed {
                out,
                tokens,
                seq_len,
                ..
            } => {
                let c = divides("out", out.len(), tokens.len())?;
                one(table::encoder_forward(dtype, tokens.len(), *seq_len, c))
            }
            LlamaOp::EmbedBackward {
                dout, bucket_rows, ..
            } => {
                let rows = bucket_rows.len();
                let c = divides("dout", dout.len(), rows)?;
                described(table::embedding_backward(dtype, rows, rows, c))
            }
            LlamaOp::RmsNormForward { rstd, weight, .. } => {
                one(table::rmsnorm_forward(dtype, rstd.len(), weight.len()))
            }
            LlamaOp::RmsNormBackward { rstd, weight, .. } => {
                described(table::rmsnorm_backward(dtype, rstd.len(), weight.len()))
            }
            LlamaOp::Copy { .. } => Ok(vec![library("memcpy")]),
            LlamaOp::LinearForward { .. }
            | LlamaOp::LinearBackwardInput { .. }
            | LlamaOp::LinearBackwardWeight { .. } => Ok(vec![library("cublasLt")]),
            LlamaOp::QkvBiasBackward { dqkv, widths, .. } => {
                let rows = divides("dqkv", dqkv.len(), widths.iter().sum())?;
                described(table::bias_backward(dtype, rows, widths))
            }
            LlamaOp::Rope {
                rows,
                cos,
                heads,
                width,
                seq_len,
                rotation,
                ..
            } => {
                let shape = RopeShape {
                    len: rows.len(),
                    table: cos.len(),
                    width: *width,
                    heads: *heads,
                    seq_len: *seq_len,
                };
                one(table::rope(dtype, shape, *rotation))
            }
            LlamaOp::SwiGluForward { out, inner, .. } => {
                let rows = divides("out", out.len(), *inner)?;
                one(table::swiglu_forward(dtype, rows, *inner))
            }
            LlamaOp::SwiGluBackward { dout, inner, .. } => {
                let rows = divides("dout", dout.len(), *inner)?;
                one(table::swiglu_backward(dtype, rows, *inner))
            }
            LlamaOp::AttentionForward { dims, kernel, .. } => one(table::attention_forward(
                dtype,
                *dims,
                Heads::Grouped,
                *kernel,
            )),
            LlamaOp::AttentionBackward { dims, kernel, .. } => described(
                table::attention_backward(dtype, *dims, Heads::Grouped, *kernel),
            ),
        }
    }
}
