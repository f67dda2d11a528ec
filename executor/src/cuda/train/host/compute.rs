//! The compute ops of a [`crate::cuda::train::StepProgram`] on [`HostBuffers`], each with the
//! semantics of the kernel or cuBLASLt call `execute.rs` makes for it ([`super::kernels`]):
//! the CPU references the kernel checks hold the kernels against (`cuda::check::kernels`: the
//! CPU model's encoder, LayerNorm, RMSNorm, RoPE, GELU, SwiGLU, bias sums and cross-entropy;
//! the CPU model's f32 product, `model::gemm::matmul`, for every cuBLASLt product, over the
//! same strided views and with the same accumulation).
//!
//! Where the CPU model does not compute what the kernel does, the kernel is followed
//! (`kernels/cu/`): the embedding backward walks the uploaded token buckets (`encoder.cu`),
//! attention keeps a log-sum-exp instead of the probabilities and its backward reads it and
//! `delta = rowsum(dout * out)` (`attention.cu`, [`super::attention`]), the norm pass stores
//! `g * inv_scale` and sums the stored values' squares in f64, flagging inf/NaN
//! (`unscale_norm.cu`), and the fused AdamW indexes every view at `segment.offset + j`
//! (`adamw.cu`, through `adamw_element`, the kernel's loop on the CPU).
//!
//! ZeRO-Offload's host ops ([`HostOp`]) share these arms: a copy across the link or within
//! the host is the device copy's read and rounded write, the host optimizer is the fused
//! AdamW's `adamw_element` loop on the host buffers (what `optim::offload`'s pool computes,
//! bit for bit: `tests/cuda_offload_host_step.rs`).
//!
//! Scratch the kernels use only inside one op (the norms' and the bias gradient's partials,
//! the norm's per-block partials) is left as it is: nothing else reads it.

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::HostError;
use super::attention;
use super::buffers::HostBuffers;
use super::kernels::{
    adamw, bias_backward, check_norm, classifier, encoder_backward, layernorm, product, rotate,
    unscale_norm, zero,
};
use crate::cuda::train::execute::RunScalars;
use crate::cuda::train::program::{HostOp, Op};
use crate::cuda::train::region::Region;
use crate::model::encoder::encoder_forward;
use crate::model::gelu::{gelu_backward_inplace, gelu_forward};
use crate::model::layernorm::layernorm_backward;
use crate::model::residual::residual_forward;
use crate::model::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::model::swiglu::{swiglu_backward, swiglu_forward};

/// Runs compute op `op` on `bufs` with the run's `scalars` (normalisation epsilon `eps`).
pub fn run_compute(
    op: &Op,
    bufs: &mut HostBuffers,
    scalars: &RunScalars,
    eps: f32,
) -> Result<(), HostError> {
    match op {
        Op::Zero { tensor } => match tensor.region {
            Region::Grads
            | Region::Step(CudaRegion::Activations)
            | Region::Step(CudaRegion::FoundInf) => zero(bufs, tensor),
            other => Err(HostError(format!(
                "a memset of {other:?}, which the device executor does not zero"
            ))),
        },
        Op::Embed {
            out,
            tokens,
            wte,
            positions,
            seq_len,
        } => {
            let ids = bufs.u32s(tokens)?.to_vec();
            let (wte, positions) = (bufs.read(wte)?, bufs.read(positions)?);
            let c = out.len() / ids.len().max(1);
            if ids.is_empty() || out.len() != ids.len() * c || positions.len() < *seq_len * c {
                return Err(HostError(format!(
                    "embedding of {} tokens into {} elements over a position table of {}",
                    ids.len(),
                    out.len(),
                    positions.len()
                )));
            }
            let mut values = vec![0.0; out.len()];
            encoder_forward(&mut values, &ids, &wte, &positions, *seq_len);
            bufs.write(out, &values)
        }
        Op::EmbedBackward {
            dwte,
            dwpe,
            dout,
            bucket_tokens,
            bucket_starts,
            bucket_rows,
            seq_len,
        } => encoder_backward(
            bufs,
            (dwte, dwpe.as_ref().map(|d| (d, *seq_len)), dout),
            (bucket_tokens, bucket_starts, bucket_rows),
            scalars.bucket_groups,
        ),
        Op::LayerNormForward {
            out,
            mean,
            rstd,
            inp,
            weight,
            bias,
        } => {
            let inp = bufs.read(inp)?;
            layernorm(bufs, &inp, (out, mean, rstd), (weight, bias), eps)
        }
        Op::ResidualLayerNormForward {
            residual,
            out,
            mean,
            rstd,
            a,
            b,
            weight,
            bias,
        } => {
            let (a, b) = (bufs.read(a)?, bufs.read(b)?);
            let mut sum = vec![0.0; residual.len()];
            residual_forward(&mut sum, &a, &b);
            bufs.write(residual, &sum)?;
            // The kernel normalises the residual as stored (rounded to the model dtype).
            let sum = bufs.read(residual)?;
            layernorm(bufs, &sum, (out, mean, rstd), (weight, bias), eps)
        }
        Op::LayerNormBackward {
            dinp,
            dweight,
            dbias,
            dout,
            inp,
            weight,
            mean,
            rstd,
            ..
        } => {
            let (dout_v, inp_v, weight_v) = (bufs.read(dout)?, bufs.read(inp)?, bufs.read(weight)?);
            let (mean_v, rstd_v) = (bufs.read(mean)?, bufs.read(rstd)?);
            let mut dinp_v = bufs.read(dinp)?;
            let (mut dw, mut db) = (bufs.read(dweight)?, bufs.read(dbias)?);
            layernorm_backward(
                &mut dinp_v,
                &mut dw,
                &mut db,
                &dout_v,
                &inp_v,
                &weight_v,
                &mean_v,
                &rstd_v,
            );
            bufs.write(dinp, &dinp_v)?;
            bufs.write(dweight, &dw)?;
            bufs.write(dbias, &db)
        }
        Op::RmsNormForward {
            out,
            rstd,
            inp,
            weight,
        } => {
            let (x, w) = (bufs.read(inp)?, bufs.read(weight)?);
            check_norm("RMSNorm", (x.len(), out.len()), w.len(), rstd.len())?;
            let (mut y, mut s) = (vec![0.0; out.len()], vec![0.0; rstd.len()]);
            rmsnorm_forward(&mut y, &mut s, &x, &w, eps);
            bufs.write(out, &y)?;
            bufs.write(rstd, &s)
        }
        Op::RmsNormBackward {
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
        Op::Linear {
            product: p,
            out,
            first,
            second,
            bias,
        } => product(bufs, *p, out, (first, second), bias.as_ref()),
        Op::BiasBackward { dbiases, dout, .. } => bias_backward(bufs, dbiases, dout),
        Op::GeluForward { out, inp } => {
            let x = bufs.read(inp)?;
            let mut y = vec![0.0; out.len()];
            gelu_forward(&mut y, &x);
            bufs.write(out, &y)
        }
        Op::GeluBackward { d, inp } => {
            let x = bufs.read(inp)?;
            let mut grad = bufs.read(d)?;
            gelu_backward_inplace(&mut grad, &x);
            bufs.write(d, &grad)
        }
        Op::SwiGluForward {
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
        Op::SwiGluBackward {
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
        Op::Rope {
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
        Op::AttentionForward {
            out,
            lse,
            qkv,
            attention: a,
        } => {
            let qkv = bufs.read(qkv)?;
            let (mut y, mut l) = (vec![0.0; out.len()], vec![0.0; lse.len()]);
            attention::forward(&mut y, &mut l, &qkv, a.dims)?;
            bufs.write(out, &y)?;
            bufs.write(lse, &l)
        }
        Op::AttentionBackward {
            dqkv,
            delta,
            dout,
            out,
            qkv,
            lse,
            attention: a,
        } => {
            let (dy, y, x, l) = (
                bufs.read(dout)?,
                bufs.read(out)?,
                bufs.read(qkv)?,
                bufs.read(lse)?,
            );
            let (mut dq, mut dl) = (vec![0.0; dqkv.len()], vec![0.0; delta.len()]);
            attention::backward(&mut dq, &mut dl, (&dy, &y, &x, &l), a.dims)?;
            bufs.write(dqkv, &dq)?;
            bufs.write(delta, &dl)
        }
        Op::FusedClassifier {
            logits,
            losses,
            targets,
            vocab,
            stride,
        } => classifier(
            bufs,
            (logits, losses, targets),
            (*vocab, *stride),
            scalars.dloss,
        ),
        Op::UnscaleNorm {
            grads,
            total,
            found_inf,
            ..
        } => unscale_norm(bufs, grads, (total, found_inf), scalars.inv_scale),
        Op::AdamW {
            master,
            grads,
            exp_avg,
            exp_avg_sq,
            segments,
            ..
        }
        | Op::Host(HostOp::AdamW {
            master,
            grads,
            exp_avg,
            exp_avg_sq,
            segments,
        }) => {
            // The host optimizer writes no 16-bit copy: the copy back to the device rounds.
            let params_out = match op {
                Op::AdamW { params_out, .. } => params_out.as_ref(),
                _ => None,
            };
            let adam = scalars
                .adam
                .ok_or_else(|| HostError("AdamW ran without its scalars".into()))?;
            adamw(
                bufs,
                (master, params_out),
                (grads, exp_avg, exp_avg_sq, segments),
                &adam,
            )
        }
        Op::Copy { dst, src } | Op::Host(HostOp::Copy { dst, src }) => {
            let values = bufs.read(src)?;
            bufs.write(dst, &values)
        }
        Op::Collective(_) => Err(HostError(format!(
            "{op:?}: communication runs through the host collectives, not the compute ops"
        ))),
    }
}
