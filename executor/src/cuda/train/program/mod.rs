//! [`Op`]: one step of the device program, with its tensors as [`TensorRef`]s, as data. One
//! vocabulary serves every model family: a family is a recipe of these ops over its layout
//! (`super::family`), not a vocabulary of its own.
//!
//! The family recipes build the step as a list of ops; `execute.rs` runs that same list on the
//! GPU (each op is one [`crate::cuda::launch::Launcher`] or [`crate::cuda::gemm::Gemm`] call, a
//! memset, a copy, or a host transfer), and the host interpreter (`super::host`) runs it on
//! host buffers. On the host the list is also what tests read: [`Op::check`] applies the
//! launcher's shape rules to the spans, and [`Op::launches`] lists the kernels each op
//! launches, with their argument types (checked against the `.cu` signatures) and grid sizes
//! from the registry's launch rules.
//!
//! This file holds the ops and what they touch; `shapes.rs` the shape and region checks,
//! `launches.rs` the kernels each op launches, `collectives.rs` the communication ops, `offload.rs` the host side of ZeRO-Offload.

pub mod collectives;
mod launches;
pub mod offload;
mod shapes;

pub use collectives::{
    CollectiveRecord, CommAction, CommOp, CommStream, CopyPiece, EventId, Marker, Purpose,
    collective_sequence,
};
pub use launches::{ArgType, Launch, attention_head_sizes, check_head_size};
pub use offload::{Direction, HostOp};

use std::fmt;

use super::region::TensorRef;
pub use crate::cuda::element::Access;
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::cuda::launch::{GroupedAttention, Heads, Rotation};
use crate::train::AttentionKernel;

/// One attention call: its sizes, whether keys and values have their own heads, and which
/// kernels compute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attention {
    /// `(B, T, NH, KV, hs)`.
    pub dims: GroupedAttention,
    /// One key/value head per query head (GPT-2's entry points), or grouped.
    pub heads: Heads,
    /// Which kernels compute it ([`super::StepProgram::with_attention`] sets it for a run).
    pub kernel: AttentionKernel,
}

/// Rows per block of `layernorm_backward` and `rmsnorm_backward` (their partial sums'
/// `*_BACKWARD_ROWS`).
pub const NORM_BACKWARD_ROWS: usize = 32;
/// Rows per chunk of `column_partials` (the bias gradients' partial sums).
pub const COLUMN_PARTIAL_ROWS: usize = 64;

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
    /// `dst = src` (a device copy: the residual stream before a projection adds to it).
    Copy {
        /// Destination.
        dst: TensorRef,
        /// Source, as long.
        src: TensorRef,
    },
    /// `out = wte[tokens] + positions[t]`: GPT-2's `wpe`, or a zeroed table where the family
    /// has no learned positions (the encoder kernel either way).
    Embed {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        tokens: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(T, C)` at least: `wpe` (parameters) or zeros (a work buffer).
        positions: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `dwpe[t] += ...` (with learned positions), then `dwte[token] += ...` by the token
    /// buckets uploaded per micro-batch.
    EmbedBackward {
        /// `(V, C)`.
        dwte: TensorRef,
        /// `(maxT, C)`: GPT-2's position gradient; `None` without learned positions.
        dwpe: Option<TensorRef>,
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
    /// One cuBLASLt product of a linear layer ([`Product`]: the pass, the weight's layout,
    /// `(N, IC, OC)`, the strided operand's row pitch, overwrite or add), on the operands
    /// `(out, first, second)` of its pass: forward `(out, inp, weight)` plus the bias,
    /// backward input `(dinp, dout, weight)`, backward weight `(dweight, inp, dout)`.
    Linear {
        /// The product.
        product: Product,
        /// Its output.
        out: TensorRef,
        /// Its first operand.
        first: TensorRef,
        /// Its second operand.
        second: TensorRef,
        /// `(OC)`, forward only.
        bias: Option<TensorRef>,
    },
    /// Bias gradients from `dout (N, W)`: one pass of column sums, then each bias adds its
    /// columns (`dbiases[i]` takes the columns after the previous ones: GPT-2's one bias, or
    /// the q, k and v biases of a fused projection).
    BiasBackward {
        /// The biases' gradients, accumulated; their lengths add up to `W`.
        dbiases: Vec<TensorRef>,
        /// f32 partials `ceil(N/64) x W`.
        scratch: TensorRef,
        /// `(N, W)`.
        dout: TensorRef,
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
    /// Causal attention forward.
    AttentionForward {
        /// `(B, T, NH·hs)`.
        out: TensorRef,
        /// `(B, NH, T)` f32.
        lse: TensorRef,
        /// `(B, T, (NH + 2KV)·hs)`.
        qkv: TensorRef,
        /// Its sizes and kernels.
        attention: Attention,
    },
    /// Causal attention backward (written, not accumulated).
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
        /// Its sizes and kernels.
        attention: Attention,
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
    /// Communication: a collective, its pack and unpack copies, stream events, position
    /// markers ([`collectives`]).
    Collective(CommOp),
    /// ZeRO-Offload's host side: a copy to or from the host's buffers, or the host
    /// optimizer ([`offload`]).
    Host(HostOp),
}

/// The dense product of a linear layer whose weight is stored `layout` (an `(N, OC)` operand
/// with rows `OC` apart).
pub fn dense(pass: Pass, layout: WeightLayout, dims: GemmDims, accumulate: Accumulate) -> Product {
    Product {
        pass,
        weight: layout,
        dims,
        stride: dims.2,
        accumulate,
    }
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
    /// Every tensor the op touches, with whether it writes it.
    pub fn tensors(&self) -> Vec<(TensorRef, Access)> {
        self.operands()
            .into_iter()
            .map(|o| (o.tensor, o.access))
            .collect()
    }

    /// [`Self::tensors`], each to be moved.
    pub fn tensors_mut(&mut self) -> Vec<(&mut TensorRef, Access)> {
        self.operands_mut()
            .into_iter()
            .map(|(_, t, a)| (t, a))
            .collect()
    }

    /// Every operand under the name its kernels' arguments bind it by (the `.cu` parameter
    /// name of its first kernel; [`crate::cuda::launch::table::Source`]), with whether the op
    /// writes it.
    pub fn operands(&self) -> Vec<Operand> {
        let mut op = self.clone();
        op.operands_mut()
            .into_iter()
            .map(|(name, tensor, access)| Operand {
                name,
                tensor: *tensor,
                access,
            })
            .collect()
    }

    /// [`Self::operands`], each to be moved (the one list of an op's operands).
    fn operands_mut(&mut self) -> Vec<(&'static str, &mut TensorRef, Access)> {
        use Access::{Read, Write};
        match self {
            Op::Zero { tensor } => vec![("tensor", tensor, Write)],
            Op::Copy { dst, src } => vec![("dst", dst, Write), ("src", src, Read)],
            Op::Embed {
                out,
                tokens,
                wte,
                positions,
                ..
            } => vec![
                ("out", out, Write),
                ("tokens", tokens, Read),
                ("wte", wte, Read),
                ("wpe", positions, Read),
            ],
            Op::EmbedBackward {
                dwte,
                dwpe,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
                ..
            } => {
                let mut list = vec![("dwte", dwte, Write)];
                list.extend(dwpe.as_mut().map(|t| ("dwpe", t, Write)));
                list.extend([
                    ("dout", dout, Read),
                    ("bucket_token", bucket_tokens, Read),
                    ("bucket_start", bucket_starts, Read),
                    ("bucket_rows", bucket_rows, Read),
                ]);
                list
            }
            Op::LayerNormForward {
                out,
                mean,
                rstd,
                inp,
                weight,
                bias,
            } => vec![
                ("out", out, Write),
                ("mean", mean, Write),
                ("rstd", rstd, Write),
                ("inp", inp, Read),
                ("weight", weight, Read),
                ("bias", bias, Read),
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
                ("residual", residual, Write),
                ("out", out, Write),
                ("mean", mean, Write),
                ("rstd", rstd, Write),
                ("a", a, Read),
                ("b", b, Read),
                ("weight", weight, Read),
                ("bias", bias, Read),
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
                ("dinp", dinp, Write),
                ("dweight", dweight, Write),
                ("dbias", dbias, Write),
                ("partials", scratch, Write),
                ("dout", dout, Read),
                ("inp", inp, Read),
                ("weight", weight, Read),
                ("mean", mean, Read),
                ("rstd", rstd, Read),
            ],
            Op::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => vec![
                ("out", out, Write),
                ("rstd", rstd, Write),
                ("inp", inp, Read),
                ("weight", weight, Read),
            ],
            Op::RmsNormBackward {
                dinp,
                dweight,
                scratch,
                dout,
                inp,
                weight,
                rstd,
            } => vec![
                ("dinp", dinp, Write),
                ("dweight", dweight, Write),
                ("partials", scratch, Write),
                ("dout", dout, Read),
                ("inp", inp, Read),
                ("weight", weight, Read),
                ("rstd", rstd, Read),
            ],
            Op::Linear {
                out,
                first,
                second,
                bias,
                ..
            } => {
                let mut list = vec![
                    ("out", out, Write),
                    ("first", first, Read),
                    ("second", second, Read),
                ];
                list.extend(bias.as_mut().map(|b| ("bias", b, Read)));
                list
            }
            Op::BiasBackward {
                dbiases,
                scratch,
                dout,
            } => {
                let mut list: Vec<_> = dbiases.iter_mut().map(|b| ("dbias", b, Write)).collect();
                list.extend([("partials", scratch, Write), ("data", dout, Read)]);
                list
            }
            Op::GeluForward { out, inp } => vec![("out", out, Write), ("inp", inp, Read)],
            Op::GeluBackward { d, inp } => vec![("d", d, Write), ("inp", inp, Read)],
            Op::SwiGluForward { out, gate_up, .. } => {
                vec![("out", out, Write), ("gate_up", gate_up, Read)]
            }
            Op::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                ..
            } => vec![
                ("dgate_up", dgate_up, Write),
                ("dout", dout, Read),
                ("gate_up", gate_up, Read),
            ],
            Op::Rope { rows, cos, sin, .. } => vec![
                ("rows", rows, Write),
                ("cos_t", cos, Read),
                ("sin_t", sin, Read),
            ],
            Op::AttentionForward { out, lse, qkv, .. } => {
                vec![("out", out, Write), ("lse", lse, Write), ("qkv", qkv, Read)]
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
                ("dqkv", dqkv, Write),
                ("delta", delta, Write),
                ("dout", dout, Read),
                ("out", out, Read),
                ("qkv", qkv, Read),
                ("lse", lse, Read),
            ],
            Op::FusedClassifier {
                logits,
                losses,
                targets,
                ..
            } => vec![
                ("logits", logits, Write),
                ("losses", losses, Write),
                ("targets", targets, Read),
            ],
            Op::UnscaleNorm {
                grads,
                partials,
                total,
                found_inf,
            } => vec![
                ("grads", grads, Write),
                ("partials", partials, Write),
                ("total", total, Write),
                ("found_inf", found_inf, Write),
            ],
            Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg,
                exp_avg_sq,
                segments,
            } => {
                let mut list = vec![("master", master, Write)];
                list.extend(params_out.as_mut().map(|p| ("params_out", p, Write)));
                list.extend([
                    ("grads", grads, Read),
                    ("exp_avg", exp_avg, Write),
                    ("exp_avg_sq", exp_avg_sq, Write),
                    ("segments", segments, Read),
                ]);
                list
            }
            Op::Collective(comm) => comm
                .tensors_mut()
                .into_iter()
                .map(|(t, a)| ("piece", t, a))
                .collect(),
            Op::Host(host) => host.operands_mut(),
        }
    }
}

/// One operand of an op: the name its kernels bind it by, the tensor, read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Its name.
    pub name: &'static str,
    /// The tensor.
    pub tensor: TensorRef,
    /// Whether the op writes it.
    pub access: Access,
}
