//! The Llama family's compute ops ([`LlamaOp`]) on [`HostBuffers`], each with the semantics
//! of the launcher or cuBLASLt call `cuda/train/llama/execute.rs` makes for it, computed by
//! the CPU model's functions the kernel checks hold the kernels against
//! (`cuda::check::kernels::llama`: RMSNorm, RoPE, SwiGLU; the embedding; grouped-query
//! attention through [`super::attention`], which keeps the kernel's log-sum-exp):
//!
//! - the embedding is the encoder kernel over a zeroed position table, its backward the
//!   token buckets' walk without positions (`encoder.cu`'s `encoder_backward_wte`);
//! - RMSNorm's backward accumulates into `dinp` and `dweight` (`rmsnorm.cu`);
//! - RoPE turns the first `heads` heads of each row in place by the uploaded `(T, hs/2)`
//!   cosines and sines at position `row % T`, the two halves of a head paired (`rope.cu`);
//! - every `nn.Linear` product is the CPU model's f32 product over the same strided views
//!   (the shared ops' [`super::compute::product`]), overwriting or adding as the op says;
//! - the q, k and v bias gradients sum `dqkv`'s columns once and add each bias's block.

use super::HostError;
use super::attention;
use super::buffers::HostBuffers;
use super::compute::{encoder_backward, product};
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::cuda::launch::Rotation;
use crate::cuda::train::execute::RunScalars;
use crate::cuda::train::program::{GemmDims, LlamaOp};
use crate::model::encoder::encoder_forward;
use crate::model::matmul::add_column_sums;
use crate::model::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::model::swiglu::{swiglu_backward, swiglu_forward};

/// An `nn.Linear` product (`Gemm::linear_*`'s): weight `(OC, IC)`, the `(N, OC)` operand's
/// rows `stride` apart.
fn linear(pass: Pass, dims: GemmDims, stride: usize, accumulate: Accumulate) -> Product {
    Product {
        pass,
        weight: WeightLayout::OutIn,
        dims,
        stride,
        accumulate,
    }
}

/// Runs the Llama-family compute op `op` on `bufs` (RMSNorm epsilon `eps`).
pub fn run_llama(
    op: &LlamaOp,
    bufs: &mut HostBuffers,
    scalars: &RunScalars,
    eps: f32,
) -> Result<(), HostError> {
    match op {
        LlamaOp::Embed {
            out,
            tokens,
            wte,
            zeros,
            seq_len,
        } => {
            let ids = bufs.u32s(tokens)?.to_vec();
            let (wte, zeros) = (bufs.read(wte)?, bufs.read(zeros)?);
            let c = out.len() / ids.len().max(1);
            if ids.is_empty() || out.len() != ids.len() * c || zeros.len() < *seq_len * c {
                return Err(HostError(format!(
                    "embedding of {} tokens into {} elements over {} position zeros",
                    ids.len(),
                    out.len(),
                    zeros.len()
                )));
            }
            let mut values = vec![0.0; out.len()];
            encoder_forward(&mut values, &ids, &wte, &zeros, *seq_len);
            bufs.write(out, &values)
        }
        LlamaOp::EmbedBackward {
            dwte,
            dout,
            bucket_tokens,
            bucket_starts,
            bucket_rows,
        } => encoder_backward(
            bufs,
            (dwte, None, dout),
            (bucket_tokens, bucket_starts, bucket_rows),
            scalars.bucket_groups,
        ),
        LlamaOp::RmsNormForward {
            out,
            rstd,
            inp,
            weight,
        } => {
            let (x, w) = (bufs.read(inp)?, bufs.read(weight)?);
            if w.is_empty() || x.len() != out.len() || rstd.len() * w.len() != x.len() {
                return Err(HostError(format!(
                    "RMSNorm of {} elements with {} channels into {} rows",
                    x.len(),
                    w.len(),
                    rstd.len()
                )));
            }
            let (mut y, mut s) = (vec![0.0; out.len()], vec![0.0; rstd.len()]);
            rmsnorm_forward(&mut y, &mut s, &x, &w, eps);
            bufs.write(out, &y)?;
            bufs.write(rstd, &s)
        }
        LlamaOp::RmsNormBackward {
            dinp,
            dweight,
            dout,
            inp,
            weight,
            rstd,
            ..
        } => {
            let (dy, x, w, s) = (
                bufs.read(dout)?,
                bufs.read(inp)?,
                bufs.read(weight)?,
                bufs.read(rstd)?,
            );
            if w.is_empty() || dy.len() != x.len() || s.len() * w.len() != x.len() {
                return Err(HostError(format!(
                    "RMSNorm backward of {} elements with {} channels over {} rows",
                    x.len(),
                    w.len(),
                    s.len()
                )));
            }
            let (mut dx, mut dw) = (bufs.read(dinp)?, bufs.read(dweight)?);
            rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &s);
            bufs.write(dinp, &dx)?;
            bufs.write(dweight, &dw)
        }
        LlamaOp::Copy { dst, src } => {
            let values = bufs.read(src)?;
            bufs.write(dst, &values)
        }
        LlamaOp::LinearForward {
            out,
            inp,
            weight,
            bias,
            dims,
            out_stride,
            accumulate,
        } => product(
            bufs,
            linear(Pass::Forward, *dims, *out_stride, *accumulate),
            out,
            (inp, weight),
            bias.as_ref(),
        ),
        LlamaOp::LinearBackwardInput {
            dinp,
            dout,
            weight,
            dims,
            dout_stride,
            accumulate,
        } => product(
            bufs,
            linear(Pass::BackwardInput, *dims, *dout_stride, *accumulate),
            dinp,
            (dout, weight),
            None,
        ),
        LlamaOp::LinearBackwardWeight {
            dweight,
            inp,
            dout,
            dims,
            dout_stride,
        } => product(
            bufs,
            linear(Pass::BackwardWeight, *dims, *dout_stride, Accumulate::Add),
            dweight,
            (inp, dout),
            None,
        ),
        LlamaOp::QkvBiasBackward {
            dbiases,
            dqkv,
            widths,
            ..
        } => {
            let rows = bufs.read(dqkv)?;
            let total: usize = widths.iter().sum();
            if total == 0 || !rows.len().is_multiple_of(total) {
                return Err(HostError(format!(
                    "q, k, v bias gradients of widths {widths:?} over {} elements",
                    rows.len()
                )));
            }
            let mut sums = vec![0.0; total];
            add_column_sums(&mut sums, &rows);
            let mut column = 0;
            for (dbias, &width) in dbiases.iter().zip(widths) {
                let mut g = bufs.read(dbias)?;
                if g.len() != width {
                    return Err(HostError(format!(
                        "a bias gradient of {} elements for {width} columns",
                        g.len()
                    )));
                }
                for (slot, &s) in g.iter_mut().zip(&sums[column..column + width]) {
                    *slot += s;
                }
                bufs.write(dbias, &g)?;
                column += width;
            }
            Ok(())
        }
        LlamaOp::Rope {
            rows,
            cos,
            sin,
            heads,
            width,
            seq_len,
            rotation,
        } => {
            let mut values = bufs.read(rows)?;
            let (cos, sin) = (bufs.read(cos)?, bufs.read(sin)?);
            rotate(
                &mut values,
                (&cos, &sin),
                (*width, *heads, *seq_len),
                *rotation,
            )?;
            bufs.write(rows, &values)
        }
        LlamaOp::SwiGluForward {
            out,
            gate_up,
            inner,
        } => {
            let gu = bufs.read(gate_up)?;
            if *inner == 0 || gu.len() != 2 * out.len() || !out.len().is_multiple_of(*inner) {
                return Err(HostError(format!(
                    "SwiGLU of {} elements into {} of width {inner}",
                    gu.len(),
                    out.len()
                )));
            }
            let mut h = vec![0.0; out.len()];
            swiglu_forward(&mut h, &gu, *inner);
            bufs.write(out, &h)
        }
        LlamaOp::SwiGluBackward {
            dgate_up,
            dout,
            gate_up,
            inner,
        } => {
            let (dh, gu) = (bufs.read(dout)?, bufs.read(gate_up)?);
            if *inner == 0 || gu.len() != 2 * dh.len() || dgate_up.len() != gu.len() {
                return Err(HostError(format!(
                    "SwiGLU backward of {} elements from {} of width {inner}",
                    gu.len(),
                    dh.len()
                )));
            }
            let mut d = vec![0.0; dgate_up.len()];
            swiglu_backward(&mut d, &dh, &gu, *inner);
            bufs.write(dgate_up, &d)
        }
        LlamaOp::AttentionForward {
            out,
            lse,
            qkv,
            dims,
            ..
        } => {
            let qkv = bufs.read(qkv)?;
            let (mut y, mut l) = (vec![0.0; out.len()], vec![0.0; lse.len()]);
            attention::forward(&mut y, &mut l, &qkv, *dims)?;
            bufs.write(out, &y)?;
            bufs.write(lse, &l)
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
            let (dy, y, x, l) = (
                bufs.read(dout)?,
                bufs.read(out)?,
                bufs.read(qkv)?,
                bufs.read(lse)?,
            );
            let (mut dq, mut dl) = (vec![0.0; dqkv.len()], vec![0.0; delta.len()]);
            attention::backward(&mut dq, &mut dl, (&dy, &y, &x, &l), *dims)?;
            bufs.write(dqkv, &dq)?;
            bufs.write(delta, &dl)
        }
    }
}

/// `rope.cu` on the host: row `r` at position `r % T`; each of its first `heads` heads of
/// `2 half` elements turns its pairs `(x[i], x[half + i])` by `+angle` (forward) or `-angle`
/// (the transpose, on a gradient).
fn rotate(
    rows: &mut [f32],
    (cos, sin): (&[f32], &[f32]),
    (width, heads, seq_len): (usize, usize, usize),
    rotation: Rotation,
) -> Result<(), HostError> {
    let half = cos.len() / seq_len.max(1);
    if width == 0
        || seq_len == 0
        || half == 0
        || cos.len() != seq_len * half
        || sin.len() != cos.len()
        || !rows.len().is_multiple_of(width)
        || heads * 2 * half > width
    {
        return Err(HostError(format!(
            "RoPE of {heads} heads over rows of {width} ({} elements) by a table of {} for {seq_len} positions",
            rows.len(),
            cos.len()
        )));
    }
    for (r, row) in rows.chunks_exact_mut(width).enumerate() {
        let t = r % seq_len;
        let (c, s) = (&cos[t * half..][..half], &sin[t * half..][..half]);
        for head in row[..heads * 2 * half].chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x, y) = (a[i], b[i]);
                match rotation {
                    Rotation::Forward => {
                        a[i] = x * c[i] - y * s[i];
                        b[i] = y * c[i] + x * s[i];
                    }
                    Rotation::Backward => {
                        a[i] = x * c[i] + y * s[i];
                        b[i] = y * c[i] - x * s[i];
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rope::{Rope, RopeScaling, rope_backward, rope_forward};

    /// The host RoPE is the CPU model's, both ways, from the same table.
    #[test]
    fn the_rotation_is_the_cpu_models() {
        let table = Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        }
        .table(8, 5);
        let (width, heads) = (28, 3);
        let original: Vec<f32> = (0..10 * width).map(|i| (i as f32 * 0.37).sin()).collect();
        for rotation in [Rotation::Forward, Rotation::Backward] {
            let mut host = original.clone();
            rotate(
                &mut host,
                (table.cos(), table.sin()),
                (width, heads, 5),
                rotation,
            )
            .expect("rotate");
            let mut cpu = original.clone();
            match rotation {
                Rotation::Forward => rope_forward(&mut cpu, width, heads, &table),
                Rotation::Backward => rope_backward(&mut cpu, width, heads, &table),
            }
            assert_eq!(host, cpu, "{rotation:?}");
            assert_ne!(host, original, "{rotation:?} turns something");
        }
    }
}
