//! [`Op`]: one step of the device program, with its tensors as [`TensorRef`]s, as data.
//!
//! `forward.rs`, `backward.rs` and `step.rs` build the step as a list of ops; `execute.rs`
//! runs that same list on the GPU (each op is one [`crate::cuda::launch::Launcher`] or
//! [`crate::cuda::gemm::Gemm`] call, a memset, or a host transfer). On the host the list is
//! what tests read: [`Op::check`] applies the launcher's shape rules to the spans, and
//! [`Op::launches`] lists the kernels each op launches, with their argument types (checked
//! against the `.cu` signatures) and grid sizes from the registry's launch rules.
//!
//! This file holds the ops and what they touch; `shapes.rs` the shape and layout checks,
//! `launches.rs` the kernels each op launches; `llama.rs` the Llama family's ops, all three
//! side by side.

pub mod collectives;
mod launches;
pub mod llama;
mod shapes;

pub use collectives::{
    CollectiveRecord, CommAction, CommOp, CommStream, CopyPiece, EventId, Marker, Purpose,
    collective_sequence,
};
pub use launches::{ArgType, Launch, attention_head_sizes, check_head_size};
pub use llama::LlamaOp;

use std::fmt;

use super::buffers::TensorRef;
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::train::AttentionKernel;

/// `(B, T, NH, hs)` of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch.
    pub batch: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Heads.
    pub n_head: usize,
    /// Head size.
    pub head_dim: usize,
    /// Which kernels compute it ([`StepProgram::with_attention`] sets it for a run).
    ///
    /// [`StepProgram::with_attention`]: super::StepProgram::with_attention
    pub kernel: AttentionKernel,
}

impl AttentionShape {
    /// The launcher's sizes: one key/value head per query head.
    pub fn heads(&self) -> crate::cuda::launch::GroupedAttention {
        crate::cuda::launch::GroupedAttention {
            batch: self.batch,
            seq_len: self.seq_len,
            n_head: self.n_head,
            kv_heads: self.n_head,
            head_dim: self.head_dim,
        }
    }
}

/// `(rows, in_features, out_features)` of a product.
pub type GemmDims = (usize, usize, usize);

/// One operation of the device step.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `tensor = 0` (a memset).
    Zero {
        /// The tensor.
        tensor: TensorRef,
    },
    /// `out = wte[tokens] + wpe[t]`.
    EncoderForward {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        tokens: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(maxT, C)`.
        wpe: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `dwpe += ...`, `dwte[token] += ...` (the token buckets are uploaded per micro-batch).
    EncoderBackward {
        /// `(V, C)`.
        dwte: TensorRef,
        /// `(maxT, C)`.
        dwpe: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// Distinct tokens (at most `N`; the live count is known per batch).
        bucket_tokens: TensorRef,
        /// Group starts (`groups + 1`).
        bucket_starts: TensorRef,
        /// `(N)`.
        bucket_rows: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `out = LN(inp)`, saving mean and rstd.
    LayerNormForward {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(C)`.
        bias: TensorRef,
    },
    /// `residual = a + b`, `out = LN(residual)`.
    ResidualLayerNormForward {
        /// `(N, C)`.
        residual: TensorRef,
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
        /// `(N, C)`.
        a: TensorRef,
        /// `(N, C)`.
        b: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(C)`.
        bias: TensorRef,
    },
    /// `dinp += LN'`, `dweight += ...`, `dbias += ...`.
    LayerNormBackward {
        /// `(N, C)`, accumulated.
        dinp: TensorRef,
        /// `(C)`.
        dweight: TensorRef,
        /// `(C)`.
        dbias: TensorRef,
        /// f32 partials.
        scratch: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
    },
    /// `out = inp @ weight (+ bias)` (cuBLASLt).
    MatmulForward {
        /// `(N, OC)`.
        out: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(IC, OC)`.
        weight: TensorRef,
        /// `(OC)`.
        bias: Option<TensorRef>,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dinp = dout @ weight^T` (cuBLASLt, overwrites).
    MatmulBackwardInput {
        /// `(N, IC)`.
        dinp: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
        /// `(IC, OC)`.
        weight: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dweight += inp^T @ dout` (cuBLASLt, accumulates).
    MatmulBackwardWeight {
        /// `(IC, OC)`.
        dweight: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dbias += column sums of dout`.
    BiasBackward {
        /// `(OC)`.
        dbias: TensorRef,
        /// f32 partials `ceil(N/64) x OC`.
        scratch: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
    },
    /// `logits = lnf @ wte^T` (cuBLASLt; the tied `lm_head`, an `nn.Linear` product over
    /// `wte`), the logits' rows `stride` apart.
    LogitsForward {
        /// `(N, V)`, rows `stride` apart.
        logits: TensorRef,
        /// `(N, C)`.
        lnf: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(N, C, V)`.
        dims: GemmDims,
        /// Elements between the logits' rows (`Vp`).
        stride: usize,
    },
    /// `dlnf = dlogits @ wte` (cuBLASLt, overwrites): [`Op::LogitsForward`]'s input gradient.
    LogitsBackwardInput {
        /// `(N, C)`.
        dlnf: TensorRef,
        /// `(N, V)`, rows `stride` apart.
        dlogits: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(N, C, V)`.
        dims: GemmDims,
        /// Elements between the rows of `dlogits` (`Vp`).
        stride: usize,
    },
    /// `dwte += dlogits^T @ lnf` (cuBLASLt, accumulates): [`Op::LogitsForward`]'s weight
    /// gradient.
    LogitsBackwardWeight {
        /// `(V, C)`.
        dwte: TensorRef,
        /// `(N, C)`.
        lnf: TensorRef,
        /// `(N, V)`, rows `stride` apart.
        dlogits: TensorRef,
        /// `(N, C, V)`.
        dims: GemmDims,
        /// Elements between the rows of `dlogits` (`Vp`).
        stride: usize,
    },
    /// `out = gelu(inp)`.
    GeluForward {
        /// Output.
        out: TensorRef,
        /// Input.
        inp: TensorRef,
    },
    /// `d *= gelu'(inp)`.
    GeluBackward {
        /// In place.
        d: TensorRef,
        /// The forward input.
        inp: TensorRef,
    },
    /// Causal attention forward.
    AttentionForward {
        /// `(B, T, C)`.
        out: TensorRef,
        /// `(B, NH, T)`.
        lse: TensorRef,
        /// `(B, T, 3C)`.
        qkv: TensorRef,
        /// Its shape.
        shape: AttentionShape,
    },
    /// Causal attention backward (written, not accumulated).
    AttentionBackward {
        /// `(B, T, 3C)`.
        dqkv: TensorRef,
        /// `(B, NH, T)` f32 scratch.
        delta: TensorRef,
        /// `(B, T, C)`.
        dout: TensorRef,
        /// `(B, T, C)`.
        out: TensorRef,
        /// `(B, T, 3C)`.
        qkv: TensorRef,
        /// `(B, NH, T)`.
        lse: TensorRef,
        /// Its shape.
        shape: AttentionShape,
    },
    /// Softmax cross-entropy: losses, and `dloss * (softmax - onehot)` in place of the logits
    /// (`dloss` is the step's, given at run time).
    FusedClassifier {
        /// `(N, V)`, rows `stride` apart (the padding between them is not touched).
        logits: TensorRef,
        /// `(N)`.
        losses: TensorRef,
        /// `(N)`.
        targets: TensorRef,
        /// `V`.
        vocab: usize,
        /// Elements between the logits' rows (`Vp`).
        stride: usize,
    },
    /// `grads *= inv_scale`, sum of squares and inf/NaN flag (`inv_scale` at run time).
    UnscaleNorm {
        /// The flat gradients.
        grads: TensorRef,
        /// f64 partials.
        partials: TensorRef,
        /// f64 total.
        total: TensorRef,
        /// i32 flag.
        found_inf: TensorRef,
    },
    /// Fused AdamW over the segment table (scalars at run time).
    AdamW {
        /// fp32 weights the optimizer steps (the parameters themselves in f32 training).
        master: TensorRef,
        /// The 16-bit copy written in the same pass (`None` in f32 training).
        params_out: Option<TensorRef>,
        /// The gradients.
        grads: TensorRef,
        /// First moment.
        exp_avg: TensorRef,
        /// Second moment.
        exp_avg_sq: TensorRef,
        /// The segment table.
        segments: TensorRef,
    },
    /// An operation of the Llama family's step ([`LlamaOp`]).
    Llama(LlamaOp),
    /// Communication: a collective, its pack and unpack copies, stream events, position
    /// markers ([`collectives`]).
    Collective(CommOp),
}

/// A shape rule an op breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

/// `len` elements or a [`ShapeError`] naming `what`.
fn expect(what: &str, tensor: &TensorRef, len: usize) -> Result<(), ShapeError> {
    if tensor.len() == len {
        Ok(())
    } else {
        Err(ShapeError(format!(
            "{what} has {} elements, the shape needs {len}",
            tensor.len()
        )))
    }
}

/// `(N, W)` with rows `S` apart, or a [`ShapeError`] naming `what`.
fn expect_strided(
    what: &str,
    tensor: &TensorRef,
    (rows, cols, stride): (usize, usize, usize),
) -> Result<(), ShapeError> {
    if stride < cols {
        return Err(ShapeError(format!(
            "{what}: rows {stride} apart cannot hold {cols} columns"
        )));
    }
    expect(
        what,
        tensor,
        crate::cuda::element::strided_len(rows, cols, stride),
    )
}

/// How many rows of `part` elements `whole` elements make, or a [`ShapeError`] naming `what`.
fn divides(what: &str, whole: usize, part: usize) -> Result<usize, ShapeError> {
    if part == 0 || !whole.is_multiple_of(part) {
        return Err(ShapeError(format!(
            "{what}: {whole} elements are not rows of {part}"
        )));
    }
    Ok(whole / part)
}

impl Op {
    /// The cuBLASLt product a vocabulary op issues (the executor runs exactly this one, on
    /// the operands in [`Op::tensors`] order): the tied `lm_head` over `wte (V, C)`, an
    /// `nn.Linear` product whose `(N, V)` operand has rows `stride` apart. `None` for the
    /// other ops.
    pub fn vocabulary_product(&self) -> Option<Product> {
        let (pass, dims, stride, accumulate) = match *self {
            Op::LogitsForward { dims, stride, .. } => {
                (Pass::Forward, dims, stride, Accumulate::Overwrite)
            }
            Op::LogitsBackwardInput { dims, stride, .. } => {
                (Pass::BackwardInput, dims, stride, Accumulate::Overwrite)
            }
            Op::LogitsBackwardWeight { dims, stride, .. } => {
                (Pass::BackwardWeight, dims, stride, Accumulate::Add)
            }
            _ => return None,
        };
        Some(Product {
            pass,
            weight: WeightLayout::OutIn,
            dims,
            stride,
            accumulate,
        })
    }

    /// Every tensor the op touches, with whether it writes it.
    pub fn tensors(&self) -> Vec<(TensorRef, Access)> {
        let mut op = self.clone();
        op.tensors_mut().into_iter().map(|(t, a)| (*t, a)).collect()
    }

    /// [`Self::tensors`], each to be moved (the one list of an op's operands).
    pub fn tensors_mut(&mut self) -> Vec<(&mut TensorRef, Access)> {
        use Access::{Read, Write};
        match self {
            Op::Zero { tensor } => vec![(tensor, Write)],
            Op::EncoderForward {
                out,
                tokens,
                wte,
                wpe,
                ..
            } => vec![(out, Write), (tokens, Read), (wte, Read), (wpe, Read)],
            Op::EncoderBackward {
                dwte,
                dwpe,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
                ..
            } => vec![
                (dwte, Write),
                (dwpe, Write),
                (dout, Read),
                (bucket_tokens, Read),
                (bucket_starts, Read),
                (bucket_rows, Read),
            ],
            Op::LayerNormForward {
                out,
                mean,
                rstd,
                inp,
                weight,
                bias,
            } => vec![
                (out, Write),
                (mean, Write),
                (rstd, Write),
                (inp, Read),
                (weight, Read),
                (bias, Read),
            ],
            Op::ResidualLayerNormForward {
                residual,
                out,
                mean,
                rstd,
                a,
                b,
                weight,
                bias,
            } => vec![
                (residual, Write),
                (out, Write),
                (mean, Write),
                (rstd, Write),
                (a, Read),
                (b, Read),
                (weight, Read),
                (bias, Read),
            ],
            Op::LayerNormBackward {
                dinp,
                dweight,
                dbias,
                scratch,
                dout,
                inp,
                weight,
                mean,
                rstd,
            } => vec![
                (dinp, Write),
                (dweight, Write),
                (dbias, Write),
                (scratch, Write),
                (dout, Read),
                (inp, Read),
                (weight, Read),
                (mean, Read),
                (rstd, Read),
            ],
            Op::MatmulForward {
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
            Op::MatmulBackwardInput {
                dinp, dout, weight, ..
            } => vec![(dinp, Write), (dout, Read), (weight, Read)],
            Op::MatmulBackwardWeight {
                dweight, inp, dout, ..
            } => vec![(dweight, Write), (inp, Read), (dout, Read)],
            Op::BiasBackward {
                dbias,
                scratch,
                dout,
            } => vec![(dbias, Write), (scratch, Write), (dout, Read)],
            Op::LogitsForward {
                logits, lnf, wte, ..
            } => vec![(logits, Write), (lnf, Read), (wte, Read)],
            Op::LogitsBackwardInput {
                dlnf, dlogits, wte, ..
            } => vec![(dlnf, Write), (dlogits, Read), (wte, Read)],
            Op::LogitsBackwardWeight {
                dwte, lnf, dlogits, ..
            } => vec![(dwte, Write), (lnf, Read), (dlogits, Read)],
            Op::GeluForward { out, inp } => vec![(out, Write), (inp, Read)],
            Op::GeluBackward { d, inp } => vec![(d, Write), (inp, Read)],
            Op::AttentionForward { out, lse, qkv, .. } => {
                vec![(out, Write), (lse, Write), (qkv, Read)]
            }
            Op::AttentionBackward {
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
            Op::FusedClassifier {
                logits,
                losses,
                targets,
                ..
            } => vec![(logits, Write), (losses, Write), (targets, Read)],
            Op::UnscaleNorm {
                grads,
                partials,
                total,
                found_inf,
            } => vec![
                (grads, Write),
                (partials, Write),
                (total, Write),
                (found_inf, Write),
            ],
            Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg,
                exp_avg_sq,
                segments,
            } => {
                let mut list = vec![(master, Write)];
                list.extend(params_out.as_mut().map(|p| (p, Write)));
                list.extend([
                    (grads, Read),
                    (exp_avg, Write),
                    (exp_avg_sq, Write),
                    (segments, Read),
                ]);
                list
            }
            Op::Llama(op) => op.tensors_mut(),
            Op::Collective(comm) => comm.tensors_mut(),
        }
    }
}

/// Whether an op reads or writes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Written (or accumulated into).
    Write,
}
