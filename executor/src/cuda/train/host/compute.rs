//! The compute ops of a [`crate::cuda::train::StepProgram`] on [`HostBuffers`], each with the
//! semantics of the kernel or cuBLASLt call `execute.rs` makes for it: the same operands read,
//! the same written or accumulated (`+=`), computed by the CPU references the kernel checks
//! hold the kernels against (`cuda::check::kernels`: the CPU model's encoder, LayerNorm,
//! GELU, bias sums and cross-entropy; the CPU model's f32 product, `model::gemm::matmul`, for
//! every cuBLASLt product, over the same strided views and with the same accumulation: the
//! products' check holds cuBLASLt against a row-major reference that is itself held against
//! the CPU model's matmuls).
//!
//! Where the CPU model does not compute what the kernel does, the kernel is followed
//! (`kernels/cu/`): the embedding backward walks the uploaded token buckets
//! (`encoder.cu`), attention keeps a log-sum-exp instead of the probabilities and its backward
//! reads it and `delta = rowsum(dout * out)` (`attention.cu`, [`super::attention`]), the norm
//! pass stores `g * inv_scale` and sums the stored values' squares in f64, flagging inf/NaN
//! (`unscale_norm.cu`), and the fused AdamW indexes every view at `segment.offset + j`
//! (`adamw.cu`, through [`adamw_element`], the kernel's loop on the CPU).
//!
//! Scratch the kernels use only inside one op (LayerNorm's and the bias gradient's partials,
//! the norm's per-block partials) is left as it is: nothing else reads it.

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::HostError;
use super::attention;
use super::buffers::HostBuffers;
use super::llama::run_llama;
use crate::cuda::adamw::{Decay, adamw_element};
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::cuda::train::buffers::{Region, TensorRef};
use crate::cuda::train::execute::RunScalars;
use crate::cuda::train::program::{GemmDims, Op};
use crate::model::classifier::crossentropy_forward_backward;
use crate::model::encoder::encoder_forward;
use crate::model::gelu::{gelu_backward_inplace, gelu_forward};
use crate::model::gemm::{Accumulate as Mode, MatMut, MatRef, Threads, matmul};
use crate::model::layernorm::{layernorm_backward, layernorm_forward};
use crate::model::matmul::add_column_sums;
use crate::model::residual::residual_forward;

/// A GPT-2 `Conv1D` product over dense operands (`Gemm::matmul_*`'s).
fn conv1d(pass: Pass, dims: GemmDims, accumulate: Accumulate) -> Product {
    Product {
        pass,
        weight: WeightLayout::InOut,
        dims,
        stride: dims.2,
        accumulate,
    }
}

/// The weight `w` as an `(IC, OC)` view, whichever its layout.
fn weight_in_out(w: &[f32], layout: WeightLayout, ic: usize, oc: usize) -> MatRef<'_> {
    match layout {
        WeightLayout::InOut => MatRef::new(w, ic, oc),
        WeightLayout::OutIn => MatRef::new(w, oc, ic).t(),
    }
}

/// `out` (read first when the product accumulates) updated by `product` of `first` and
/// `second`, as `Gemm::run(product, out, first, second, bias)` computes it: the CPU model's
/// f32 product (`model::gemm::matmul`) over the same strided views, the bias added to every
/// row of the output's block first.
pub(super) fn product(
    bufs: &mut HostBuffers,
    product: Product,
    out: &TensorRef,
    (first, second): (&TensorRef, &TensorRef),
    bias: Option<&TensorRef>,
) -> Result<(), HostError> {
    let plan = product.plan();
    let [a, b, c] = plan.operands;
    let (first_shape, second_shape) = if plan.second_is_a { (b, a) } else { (a, b) };
    for (what, tensor, shape) in [
        ("output", out, c),
        ("first operand", first, first_shape),
        ("second operand", second, second_shape),
    ] {
        if tensor.len() != shape.len() {
            return Err(HostError(format!(
                "{product:?}: its {what} has {} elements, the product needs {}",
                tensor.len(),
                shape.len()
            )));
        }
    }
    let (x, y) = (bufs.read(first)?, bufs.read(second)?);
    let bias = bias.map(|b| bufs.read(b)).transpose()?;
    let mut result = bufs.read(out)?;
    let (n, ic, oc) = product.dims;
    let s = product.stride;
    let mut mode = match product.accumulate {
        Accumulate::Overwrite => Mode::Overwrite,
        Accumulate::Add => Mode::Add,
    };
    let weight = |w| weight_in_out(w, product.weight, ic, oc);
    match product.pass {
        Pass::Forward => {
            if let Some(bias) = &bias {
                if bias.len() != oc {
                    return Err(HostError(format!("{product:?}: a bias of {}", bias.len())));
                }
                for row in 0..n {
                    let cells = &mut result[row * s..row * s + oc];
                    for (cell, &b) in cells.iter_mut().zip(bias.iter()) {
                        *cell = if mode == Mode::Add { *cell + b } else { b };
                    }
                }
                mode = Mode::Add;
            }
            matmul(
                MatMut::strided(&mut result, n, oc, s),
                MatRef::new(&x, n, ic),
                weight(&y),
                mode,
                Threads::Pool,
            );
        }
        Pass::BackwardInput => matmul(
            MatMut::new(&mut result, n, ic),
            MatRef::strided(&x, n, oc, s),
            weight(&y).t(),
            mode,
            Threads::Pool,
        ),
        Pass::BackwardWeight => match product.weight {
            WeightLayout::InOut => matmul(
                MatMut::new(&mut result, ic, oc),
                MatRef::new(&x, n, ic).t(),
                MatRef::strided(&y, n, oc, s),
                mode,
                Threads::Pool,
            ),
            WeightLayout::OutIn => matmul(
                MatMut::new(&mut result, oc, ic),
                MatRef::strided(&y, n, oc, s).t(),
                MatRef::new(&x, n, ic),
                mode,
                Threads::Pool,
            ),
        },
    }
    bufs.write(out, &result)
}

/// Runs compute op `op` on `bufs` with the run's `scalars` (LayerNorm epsilon `eps`).
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
        Op::EncoderForward {
            out,
            tokens,
            wte,
            wpe,
            seq_len,
        } => {
            let ids = bufs.u32s(tokens)?.to_vec();
            let (wte, wpe) = (bufs.read(wte)?, bufs.read(wpe)?);
            let mut values = vec![0.0; out.len()];
            encoder_forward(&mut values, &ids, &wte, &wpe, *seq_len);
            bufs.write(out, &values)
        }
        Op::EncoderBackward {
            dwte,
            dwpe,
            dout,
            bucket_tokens,
            bucket_starts,
            bucket_rows,
            seq_len,
        } => encoder_backward(
            bufs,
            (dwte, Some((dwpe, *seq_len)), dout),
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
        Op::MatmulForward {
            out,
            inp,
            weight,
            bias,
            dims,
        } => product(
            bufs,
            conv1d(Pass::Forward, *dims, Accumulate::Overwrite),
            out,
            (inp, weight),
            bias.as_ref(),
        ),
        Op::MatmulBackwardInput {
            dinp,
            dout,
            weight,
            dims,
        } => product(
            bufs,
            conv1d(Pass::BackwardInput, *dims, Accumulate::Overwrite),
            dinp,
            (dout, weight),
            None,
        ),
        Op::MatmulBackwardWeight {
            dweight,
            inp,
            dout,
            dims,
        } => product(
            bufs,
            conv1d(Pass::BackwardWeight, *dims, Accumulate::Add),
            dweight,
            (inp, dout),
            None,
        ),
        Op::BiasBackward { dbias, dout, .. } => {
            let rows = bufs.read(dout)?;
            let mut sums = bufs.read(dbias)?;
            if sums.is_empty() || !rows.len().is_multiple_of(sums.len()) {
                return Err(HostError(format!(
                    "bias gradient of {} over {} elements",
                    sums.len(),
                    rows.len()
                )));
            }
            add_column_sums(&mut sums, &rows);
            bufs.write(dbias, &sums)
        }
        Op::LogitsForward {
            logits, lnf, wte, ..
        } => vocabulary(bufs, op, logits, (lnf, wte)),
        Op::LogitsBackwardInput {
            dlnf, dlogits, wte, ..
        } => vocabulary(bufs, op, dlnf, (dlogits, wte)),
        Op::LogitsBackwardWeight {
            dwte, lnf, dlogits, ..
        } => vocabulary(bufs, op, dwte, (lnf, dlogits)),
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
        Op::AttentionForward {
            out,
            lse,
            qkv,
            shape,
        } => {
            let qkv = bufs.read(qkv)?;
            let (mut y, mut l) = (vec![0.0; out.len()], vec![0.0; lse.len()]);
            attention::forward(&mut y, &mut l, &qkv, shape.heads())?;
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
            shape,
        } => {
            let (dout, out, qkv) = (bufs.read(dout)?, bufs.read(out)?, bufs.read(qkv)?);
            let lse = bufs.read(lse)?;
            let (mut dq, mut dl) = (vec![0.0; dqkv.len()], vec![0.0; delta.len()]);
            attention::backward(&mut dq, &mut dl, (&dout, &out, &qkv, &lse), shape.heads())?;
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
            params_out,
            grads,
            exp_avg,
            exp_avg_sq,
            segments,
        } => {
            let adam = scalars
                .adam
                .ok_or_else(|| HostError("AdamW ran without its scalars".into()))?;
            let table = bufs.segments(segments)?.to_vec();
            let g = bufs.read(grads)?;
            let (mut p, mut m, mut v) = (
                bufs.read(master)?,
                bufs.read(exp_avg)?,
                bufs.read(exp_avg_sq)?,
            );
            for seg in &table {
                let (offset, len) = (
                    usize::try_from(seg.offset).unwrap_or(usize::MAX),
                    usize::try_from(seg.len).unwrap_or(usize::MAX),
                );
                let end = offset.saturating_add(len);
                if [p.len(), g.len(), m.len(), v.len()]
                    .iter()
                    .any(|&n| end > n)
                {
                    return Err(HostError(format!(
                        "AdamW segment {offset}..{end} is past a view (master {}, grads {}, moments {})",
                        p.len(),
                        g.len(),
                        m.len()
                    )));
                }
                let decay = if seg.decay != 0 {
                    Decay::Apply
                } else {
                    Decay::Exempt
                };
                for i in offset..end {
                    adamw_element(&adam, decay, &mut p[i], g[i], &mut m[i], &mut v[i]);
                }
            }
            bufs.write(master, &p)?;
            bufs.write(exp_avg, &m)?;
            bufs.write(exp_avg_sq, &v)?;
            if let Some(out) = params_out {
                // f32 only: the model-dtype copy is the master's value.
                let copy = bufs.read(master)?;
                bufs.write(out, &copy)?;
            }
            Ok(())
        }
        Op::Llama(llama) => run_llama(llama, bufs, scalars, eps),
        Op::Collective(_) => Err(HostError(format!(
            "{op:?}: communication runs through the host collectives, not the compute ops"
        ))),
    }
}

fn zero(bufs: &mut HostBuffers, tensor: &TensorRef) -> Result<(), HostError> {
    match tensor.region {
        Region::Step(CudaRegion::FoundInf) => bufs.i32s_mut(tensor)?.fill(0),
        _ => bufs.f32s_mut(tensor)?.fill(0.0),
    }
    Ok(())
}

/// `out = LN(inp)` with its mean and rstd.
fn layernorm(
    bufs: &mut HostBuffers,
    inp: &[f32],
    (out, mean, rstd): (&TensorRef, &TensorRef, &TensorRef),
    (weight, bias): (&TensorRef, &TensorRef),
    eps: f32,
) -> Result<(), HostError> {
    let (w, b) = (bufs.read(weight)?, bufs.read(bias)?);
    let (mut y, mut m, mut s) = (
        vec![0.0; out.len()],
        vec![0.0; mean.len()],
        vec![0.0; rstd.len()],
    );
    if w.is_empty() || y.len() != inp.len() || m.len() * w.len() != inp.len() {
        return Err(HostError(format!(
            "LayerNorm of {} elements with {} channels into {} rows",
            inp.len(),
            w.len(),
            m.len()
        )));
    }
    layernorm_forward(&mut y, &mut m, &mut s, inp, &w, &b, eps);
    bufs.write(out, &y)?;
    bufs.write(mean, &m)?;
    bufs.write(rstd, &s)
}

/// The embedding backward as `encoder.cu` computes it: with a position table `(dwpe, T)`,
/// `dwpe[t] += dout[b, t]`, `b` ascending (GPT-2; the Llama family has none); then
/// `dwte[token] += dout[row]` for the rows of each uploaded token bucket, in the bucket's
/// order (`groups` buckets are live).
pub(super) fn encoder_backward(
    bufs: &mut HostBuffers,
    (dwte, positions, dout): (&TensorRef, Option<(&TensorRef, usize)>, &TensorRef),
    (bucket_tokens, bucket_starts, bucket_rows): (&TensorRef, &TensorRef, &TensorRef),
    groups: usize,
) -> Result<(), HostError> {
    let rows = bucket_rows.len();
    if rows == 0 || !dout.len().is_multiple_of(rows) || positions.is_some_and(|(_, t)| t == 0) {
        return Err(HostError(format!(
            "embedding backward: {} elements are not {rows} rows",
            dout.len()
        )));
    }
    let c = dout.len() / rows;
    let d = bufs.read(dout)?;
    let tokens = bufs.u32s(&bucket_tokens.prefix(groups))?.to_vec();
    let starts = bufs.i32s(&bucket_starts.prefix(groups + 1))?.to_vec();
    let order = bufs.i32s(bucket_rows)?.to_vec();
    let mut gte = bufs.read(dwte)?;
    if starts.len() != groups + 1 || tokens.len() != groups {
        return Err(HostError(format!(
            "{groups} token buckets, the buffers hold {} tokens and {} starts",
            tokens.len(),
            starts.len()
        )));
    }
    if let Some((dwpe, seq_len)) = positions {
        let mut gpe = bufs.read(dwpe)?;
        for row in 0..rows {
            let t = row % seq_len;
            let dst = gpe
                .get_mut(t * c..(t + 1) * c)
                .ok_or_else(|| HostError(format!("position {t} past dwpe")))?;
            for (g, &x) in dst.iter_mut().zip(&d[row * c..(row + 1) * c]) {
                *g += x;
            }
        }
        bufs.write(dwpe, &gpe)?;
    }
    let index = |v: i32| usize::try_from(v).map_err(|_| HostError(format!("bucket index {v}")));
    for (k, &token) in tokens.iter().enumerate() {
        let token = token as usize;
        let (from, to) = (index(starts[k])?, index(starts[k + 1])?);
        for &row in order.get(from..to).ok_or_else(|| {
            HostError(format!(
                "bucket {k}: rows {from}..{to} past {}",
                order.len()
            ))
        })? {
            let row = index(row)?;
            let src = d
                .get(row * c..(row + 1) * c)
                .ok_or_else(|| HostError(format!("row {row} past dout")))?;
            let dst = gte
                .get_mut(token * c..(token + 1) * c)
                .ok_or_else(|| HostError(format!("token {token} past dwte")))?;
            for (g, &x) in dst.iter_mut().zip(src) {
                *g += x;
            }
        }
    }
    bufs.write(dwte, &gte)
}

/// One of the tied `lm_head`'s products ([`Op::vocabulary_product`]).
fn vocabulary(
    bufs: &mut HostBuffers,
    op: &Op,
    out: &TensorRef,
    operands: (&TensorRef, &TensorRef),
) -> Result<(), HostError> {
    let p = op
        .vocabulary_product()
        .ok_or_else(|| HostError(format!("{op:?} is not a vocabulary product")))?;
    product(bufs, p, out, operands, None)
}

/// The fused classifier on logits rows `stride` apart (`classifier.cu`): each row's loss and,
/// in place of its `vocab` real columns, `dloss * (softmax - onehot)`; a row without a target
/// (`-1`) gets loss 0 and zero gradient; the padding between rows is not touched.
fn classifier(
    bufs: &mut HostBuffers,
    (logits, losses, targets): (&TensorRef, &TensorRef, &TensorRef),
    (vocab, stride): (usize, usize),
    dloss: f32,
) -> Result<(), HostError> {
    let rows = targets.len();
    let strided = bufs.read(logits)?;
    if stride < vocab || strided.len() != crate::cuda::element::strided_len(rows, vocab, stride) {
        return Err(HostError(format!(
            "classifier logits of {} elements are not {rows} rows of {vocab} in rows {stride} apart",
            strided.len()
        )));
    }
    let wanted: Vec<Option<u32>> = bufs
        .i32s(targets)?
        .iter()
        .map(|&t| u32::try_from(t).ok())
        .collect();
    if let Some(bad) = wanted.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(HostError(format!("target {bad} is not below {vocab}")));
    }
    let mut dense = Vec::with_capacity(rows * vocab);
    for r in 0..rows {
        dense.extend_from_slice(&strided[r * stride..r * stride + vocab]);
    }
    let mut row_losses = vec![0.0; rows];
    crossentropy_forward_backward(&mut dense, &mut row_losses, &wanted, dloss);
    let mut out = strided;
    for r in 0..rows {
        out[r * stride..r * stride + vocab].copy_from_slice(&dense[r * vocab..(r + 1) * vocab]);
    }
    bufs.write(logits, &out)?;
    bufs.write(losses, &row_losses)
}

/// `unscale_norm.cu`: `g = g * inv_scale` stored (skipped when `inv_scale == 1`), the stored
/// values' squares summed in f64 into `total[0]`, `found_inf[0] = 1` when any is inf or NaN
/// (left as it was otherwise: the program zeroes it first).
fn unscale_norm(
    bufs: &mut HostBuffers,
    grads: &TensorRef,
    (total, found_inf): (&TensorRef, &TensorRef),
    inv_scale: f32,
) -> Result<(), HostError> {
    let mut g = bufs.read(grads)?;
    let mut sum = 0.0f64;
    let mut bad = false;
    for x in &mut g {
        if inv_scale != 1.0 {
            *x *= inv_scale;
        }
        bad |= !x.is_finite();
        sum += f64::from(*x) * f64::from(*x);
    }
    bufs.write(grads, &g)?;
    let slot = bufs.f64s_mut(total)?;
    let first = slot
        .first_mut()
        .ok_or_else(|| HostError("the norm's total has no element".into()))?;
    *first = sum;
    if bad {
        let flag = bufs.i32s_mut(found_inf)?;
        let first = flag
            .first_mut()
            .ok_or_else(|| HostError("the overflow flag has no element".into()))?;
        *first = 1;
    }
    Ok(())
}
