//! Runs a [`LlamaOp`] on the GPU: each op is one launcher or cuBLASLt call on views of the
//! step's allocations ([`DeviceBuffers`]), as `super::super::execute` runs the shared ops.
//! **Needs a GPU**; nothing here is reached without one.

use crate::cuda::gemm::GemmElement;

use crate::cuda::error::CudaError;
use crate::cuda::launch::Heads;
use crate::cuda::train::execute::{
    DeviceBuffers, Executor, RunScalars, carve, range, self_channels, shape_error,
};
use crate::cuda::train::program::{LlamaOp, Op};

impl Executor<'_> {
    /// Runs `op` on `bufs` (its operands' regions checked by the caller).
    pub(crate) fn run_llama<T: GemmElement>(
        &self,
        op: &LlamaOp,
        bufs: &mut DeviceBuffers<T>,
        scalars: &RunScalars,
    ) -> Result<(), CudaError> {
        let l = &self.launcher;
        let g = &self.gemm;
        let eps = self.eps;
        let stream = l.stream().clone();
        let wrong = || shape_error(&Op::Llama(op.clone()));
        let DeviceBuffers {
            params,
            grads,
            activations,
            stats,
            scratch,
            tokens,
            bucket_tokens,
            bucket_starts,
            bucket_rows,
            ..
        } = bufs;
        match op {
            LlamaOp::Embed {
                out,
                tokens: t,
                wte,
                zeros,
                seq_len,
            } => carve(activations, &[out.span, zeros.span], |a| {
                let [out_v, zeros_v] = a else {
                    return Err(wrong());
                };
                l.encoder_forward(
                    out_v,
                    &tokens.slice(range(t)),
                    &params.slice(range(wte)),
                    &zeros_v.as_view(),
                    *seq_len,
                    self_channels(out, t)?,
                )
            }),
            LlamaOp::EmbedBackward {
                dwte,
                dout,
                bucket_rows: rows,
                ..
            } => {
                let groups = scalars.bucket_groups;
                l.embedding_backward(
                    &mut grads.slice_mut(range(dwte)),
                    &activations.slice(range(dout)),
                    &bucket_tokens.slice(0..groups),
                    &bucket_starts.slice(0..groups + 1),
                    &bucket_rows.slice(range(rows)),
                )
            }
            LlamaOp::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => carve(activations, &[out.span, inp.span], |a| {
                let [out_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.rmsnorm_forward(
                    out_v,
                    &mut stats.slice_mut(range(rstd)),
                    &inp_v.as_view(),
                    &params.slice(range(weight)),
                    eps,
                )
            }),
            LlamaOp::RmsNormBackward {
                dinp,
                dweight,
                scratch: partials,
                dout,
                inp,
                weight,
                rstd,
            } => carve(activations, &[dinp.span, dout.span, inp.span], |a| {
                let [dinp_v, dout_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.rmsnorm_backward(
                    dinp_v,
                    &mut grads.slice_mut(range(dweight)),
                    &mut scratch.slice_mut(range(partials)),
                    &dout_v.as_view(),
                    &inp_v.as_view(),
                    &params.slice(range(weight)),
                    &stats.slice(range(rstd)),
                )
            }),
            LlamaOp::Copy { dst, src } => carve(activations, &[dst.span, src.span], |a| {
                let [dst_v, src_v] = a else {
                    return Err(wrong());
                };
                stream.memcpy_dtod(&src_v.as_view(), dst_v)?;
                Ok(())
            }),
            LlamaOp::LinearForward {
                out,
                inp,
                weight,
                bias,
                dims,
                out_stride,
                accumulate,
            } => carve(activations, &[out.span, inp.span], |a| {
                let [out_v, inp_v] = a else {
                    return Err(wrong());
                };
                let bias_v = bias.map(|b| params.slice(range(&b)));
                g.linear_forward(
                    out_v,
                    &inp_v.as_view(),
                    &params.slice(range(weight)),
                    bias_v.as_ref(),
                    *dims,
                    *out_stride,
                    *accumulate,
                )
            }),
            LlamaOp::LinearBackwardInput {
                dinp,
                dout,
                weight,
                dims,
                dout_stride,
                accumulate,
            } => carve(activations, &[dinp.span, dout.span], |a| {
                let [dinp_v, dout_v] = a else {
                    return Err(wrong());
                };
                g.linear_backward_input(
                    dinp_v,
                    &dout_v.as_view(),
                    &params.slice(range(weight)),
                    *dims,
                    *dout_stride,
                    *accumulate,
                )
            }),
            LlamaOp::LinearBackwardWeight {
                dweight,
                inp,
                dout,
                dims,
                dout_stride,
            } => g.linear_backward_weight(
                &mut grads.slice_mut(range(dweight)),
                &activations.slice(range(inp)),
                &activations.slice(range(dout)),
                *dims,
                *dout_stride,
            ),
            LlamaOp::QkvBiasBackward {
                dbiases,
                scratch: partials,
                dqkv,
                ..
            } => carve(grads, &dbiases.map(|b| b.span), |views| {
                l.split_bias_backward(
                    views,
                    &mut scratch.slice_mut(range(partials)),
                    &activations.slice(range(dqkv)),
                )
            }),
            LlamaOp::Rope {
                rows,
                cos,
                sin,
                heads,
                width,
                seq_len,
                rotation,
            } => l.rope(
                &mut activations.slice_mut(range(rows)),
                &stats.slice(range(cos)),
                &stats.slice(range(sin)),
                (*width, *heads, *seq_len),
                *rotation,
            ),
            LlamaOp::SwiGluForward {
                out,
                gate_up,
                inner,
            } => carve(activations, &[out.span, gate_up.span], |a| {
                let [out_v, gate_up_v] = a else {
                    return Err(wrong());
                };
                l.swiglu_forward(out_v, &gate_up_v.as_view(), *inner)
            }),
            LlamaOp::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                inner,
            } => carve(
                activations,
                &[dgate_up.span, dout.span, gate_up.span],
                |a| {
                    let [dgate_up_v, dout_v, gate_up_v] = a else {
                        return Err(wrong());
                    };
                    l.swiglu_backward(dgate_up_v, &dout_v.as_view(), &gate_up_v.as_view(), *inner)
                },
            ),
            LlamaOp::AttentionForward {
                out,
                lse,
                qkv,
                dims,
                kernel,
            } => carve(activations, &[out.span, qkv.span], |a| {
                let [out_v, qkv_v] = a else {
                    return Err(wrong());
                };
                l.attention_forward(
                    out_v,
                    &mut stats.slice_mut(range(lse)),
                    &qkv_v.as_view(),
                    *dims,
                    (Heads::Grouped, *kernel),
                )
            }),
            LlamaOp::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                dims,
                kernel,
            } => carve(
                activations,
                &[dqkv.span, dout.span, out.span, qkv.span],
                |a| {
                    let [dqkv_v, dout_v, out_v, qkv_v] = a else {
                        return Err(wrong());
                    };
                    l.attention_backward(
                        dqkv_v,
                        &mut scratch.slice_mut(range(delta)),
                        &dout_v.as_view(),
                        &out_v.as_view(),
                        &qkv_v.as_view(),
                        &stats.slice(range(lse)),
                        *dims,
                        (Heads::Grouped, *kernel),
                    )
                },
            ),
        }
    }
}
