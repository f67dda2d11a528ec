//! The kernels' semantics on host vectors, one function per kernel the compute ops launch
//! ([`super::compute::run_compute`] picks them): the same operands read, the same written or
//! accumulated (`+=`), computed by the CPU references the kernel checks hold the kernels
//! against, or, where the CPU model does not compute what the kernel does, by the kernel's
//! own rule (`kernels/cu/`).

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::HostError;
use super::buffers::HostBuffers;
use crate::cuda::adamw::{AdamScalars, Decay, adamw_element};
use crate::cuda::element::strided_len;
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::cuda::launch::Rotation;
use crate::cuda::train::region::{Region, TensorRef};
use crate::model::classifier::crossentropy_forward_backward;
use crate::model::gemm::{Accumulate as Mode, MatMut, MatRef, Threads, matmul};
use crate::model::layernorm::layernorm_forward;
use crate::model::matmul::add_column_sums;

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
pub fn product(
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

/// The bias gradients of `dout (N, W)` (`column_partials` then `add_partials` per bias):
/// one pass of column sums, each bias adding the columns after the previous ones.
pub fn bias_backward(
    bufs: &mut HostBuffers,
    dbiases: &[TensorRef],
    dout: &TensorRef,
) -> Result<(), HostError> {
    let rows = bufs.read(dout)?;
    let width: usize = dbiases.iter().map(TensorRef::len).sum();
    if width == 0 || !rows.len().is_multiple_of(width) {
        return Err(HostError(format!(
            "bias gradients of {width} columns over {} elements",
            rows.len()
        )));
    }
    let mut sums = vec![0.0; width];
    add_column_sums(&mut sums, &rows);
    let mut column = 0;
    for dbias in dbiases {
        let mut g = bufs.read(dbias)?;
        for (slot, &s) in g.iter_mut().zip(&sums[column..column + dbias.len()]) {
            *slot += s;
        }
        bufs.write(dbias, &g)?;
        column += dbias.len();
    }
    Ok(())
}

/// The fused AdamW (`adamw.cu`): the kernel's loop over every segment of the table, each
/// view indexed at `segment.offset + j`; the 16-bit copy, where there is one, is the
/// master's value rounded by the buffers' store.
pub fn adamw(
    bufs: &mut HostBuffers,
    (master, params_out): (&TensorRef, Option<&TensorRef>),
    (grads, exp_avg, exp_avg_sq, segments): (&TensorRef, &TensorRef, &TensorRef, &TensorRef),
    adam: &AdamScalars,
) -> Result<(), HostError> {
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
            adamw_element(adam, decay, &mut p[i], g[i], &mut m[i], &mut v[i]);
        }
    }
    bufs.write(master, &p)?;
    bufs.write(exp_avg, &m)?;
    bufs.write(exp_avg_sq, &v)?;
    if let Some(out) = params_out {
        bufs.write(out, &p)?;
    }
    Ok(())
}

/// A memset (`cudaMemsetAsync`): f32 zeros, or the overflow flag cleared.
pub fn zero(bufs: &mut HostBuffers, tensor: &TensorRef) -> Result<(), HostError> {
    match tensor.region {
        Region::Step(CudaRegion::FoundInf) => bufs.i32s_mut(tensor)?.fill(0),
        _ => bufs.f32s_mut(tensor)?.fill(0.0),
    }
    Ok(())
}

/// A norm's shapes: `(inp, out)` elements, as many, in `rows` rows of `channels`.
pub fn check_norm(
    name: &str,
    (inp, out): (usize, usize),
    channels: usize,
    rows: usize,
) -> Result<(), HostError> {
    if channels == 0 || inp != out || rows * channels != inp {
        return Err(HostError(format!(
            "{name} of {inp} elements with {channels} channels into {rows} rows"
        )));
    }
    Ok(())
}

/// `out = LN(inp)` with its mean and rstd.
pub fn layernorm(
    bufs: &mut HostBuffers,
    inp: &[f32],
    (out, mean, rstd): (&TensorRef, &TensorRef, &TensorRef),
    (weight, bias): (&TensorRef, &TensorRef),
    eps: f32,
) -> Result<(), HostError> {
    let (w, b) = (bufs.read(weight)?, bufs.read(bias)?);
    check_norm("LayerNorm", (inp.len(), out.len()), w.len(), mean.len())?;
    let (mut y, mut m, mut s) = (
        vec![0.0; out.len()],
        vec![0.0; mean.len()],
        vec![0.0; rstd.len()],
    );
    layernorm_forward(&mut y, &mut m, &mut s, inp, &w, &b, eps);
    bufs.write(out, &y)?;
    bufs.write(mean, &m)?;
    bufs.write(rstd, &s)
}

/// The embedding backward as `encoder.cu` computes it: with a position table `(dwpe, T)`,
/// `dwpe[t] += dout[b, t]`, `b` ascending (GPT-2; the Llama family has none); then
/// `dwte[token] += dout[row]` for the rows of each uploaded token bucket, in the bucket's
/// order (`groups` buckets are live).
pub fn encoder_backward(
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

/// The fused classifier on logits rows `stride` apart (`classifier.cu`): each row's loss and,
/// in place of its `vocab` real columns, `dloss * (softmax - onehot)`; a row without a target
/// (`-1`) gets loss 0 and zero gradient; the padding between rows is not touched.
pub fn classifier(
    bufs: &mut HostBuffers,
    (logits, losses, targets): (&TensorRef, &TensorRef, &TensorRef),
    (vocab, stride): (usize, usize),
    dloss: f32,
) -> Result<(), HostError> {
    let rows = targets.len();
    let strided = bufs.read(logits)?;
    if stride < vocab || strided.len() != strided_len(rows, vocab, stride) {
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
pub fn unscale_norm(
    bufs: &mut HostBuffers,
    grads: &TensorRef,
    (total, found_inf): (&TensorRef, &TensorRef),
    inv_scale: f32,
) -> Result<(), HostError> {
    if inv_scale != 1.0 {
        let mut g = bufs.read(grads)?;
        g.iter_mut().for_each(|x| *x *= inv_scale);
        bufs.write(grads, &g)?;
    }
    // The squares of the values as stored (rounded to the model dtype).
    let mut sum = 0.0f64;
    let mut bad = false;
    for &x in bufs.f32s(grads)? {
        bad |= !x.is_finite();
        sum += f64::from(x) * f64::from(x);
    }
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

/// `rope.cu` on the host: row `r` at position `r % T`; each of its first `heads` heads of
/// `2 half` elements turns its pairs `(x[i], x[half + i])` by `+angle` (forward) or `-angle`
/// (the transpose, on a gradient).
pub fn rotate(
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
