//! Causal multi-head self-attention (Hugging Face `eager`):
//! per head, `att = softmax(q @ k^T * head_dim^-0.5 + causal mask)`, `y = att @ v`.
//!
//! `qkv` rows are `[q | k | v]`, each `C` wide; head `h` is the column block
//! `h*hs .. (h+1)*hs` inside each. The probabilities are kept `(B, NH, T, T)` for backward
//! (zero above the diagonal). Work is split over the `B * NH` (batch, head) pairs; each pair
//! writes only its own column block of the outputs.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, SharedMut, Threads, matmul};

/// The sizes attention works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    /// `B`.
    pub batch: usize,
    /// `T`.
    pub seq_len: usize,
    /// `NH`.
    pub n_head: usize,
    /// `hs = C / NH`.
    pub head_dim: usize,
}

impl AttentionDims {
    fn channels(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// `head_dim^-0.5` computed in f64 and rounded, as torch multiplies by a Python float.
    fn scale(&self) -> f32 {
        (self.head_dim as f64).powf(-0.5) as f32
    }
}

/// Attention forward.
///
/// * `out` `(B, T, C)`, written: heads side by side
/// * `att` `(B, NH, T, T)`, written: probabilities, zero above the diagonal
/// * `qkv` `(B, T, 3C)`
pub fn attention_forward(out: &mut [f32], att: &mut [f32], qkv: &[f32], dims: AttentionDims) {
    let AttentionDims {
        seq_len: t,
        n_head: nh,
        head_dim: hs,
        ..
    } = dims;
    let c = dims.channels();
    let scale = dims.scale();
    let out = SharedMut::new(out);
    att.par_chunks_mut(t * t)
        .enumerate()
        .for_each(|(bh, att_bh)| {
            let (b, h) = (bh / nh, bh % nh);
            let head = |part: usize| {
                MatRef::strided(&qkv[b * t * 3 * c + part * c + h * hs..], t, hs, 3 * c)
            };
            let (q, k, v) = (head(0), head(1), head(2));
            // scores (T, T) = q @ k^T
            matmul(
                MatMut::new(att_bh, t, t),
                q,
                k.t(),
                Accumulate::Overwrite,
                Threads::Single,
            );
            for (row_index, row) in att_bh.chunks_exact_mut(t).enumerate() {
                causal_softmax_row(row, row_index + 1, scale);
            }
            // SAFETY: (b, h) pairs write disjoint column blocks `h*hs..(h+1)*hs` of disjoint rows `b*T..(b+1)*T`.
            let y = unsafe { out.view(b * t * c + h * hs, t, hs, c) };
            matmul(
                y,
                MatRef::new(att_bh, t, t),
                v,
                Accumulate::Overwrite,
                Threads::Single,
            );
        });
}

/// Scales the first `visible` scores, turns them into probabilities, zeroes the rest.
fn causal_softmax_row(row: &mut [f32], visible: usize, scale: f32) {
    let (seen, masked) = row.split_at_mut(visible);
    let mut max = f32::NEG_INFINITY;
    for x in seen.iter_mut() {
        *x *= scale;
        max = max.max(*x);
    }
    let mut total = 0.0f32;
    for x in seen.iter_mut() {
        *x = (*x - max).exp();
        total += *x;
    }
    let inv = 1.0 / total;
    for x in seen.iter_mut() {
        *x *= inv;
    }
    masked.fill(0.0);
}

/// Attention backward.
///
/// * `dqkv` `(B, T, 3C)`, written
/// * `datt` `(B, NH, T, T)`: scratch
/// * `dout` `(B, T, C)`; `qkv` `(B, T, 3C)`; `att` `(B, NH, T, T)` from the forward pass
///
/// Per head: `dP = dy @ v^T`, `dv = P^T @ dy`, `dS = P * (dP - rowsum(P * dP)) * scale`,
/// `dq = dS @ k`, `dk = dS^T @ q`.
pub fn attention_backward(
    dqkv: &mut [f32],
    datt: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    dims: AttentionDims,
) {
    let AttentionDims {
        seq_len: t,
        n_head: nh,
        head_dim: hs,
        ..
    } = dims;
    let c = dims.channels();
    let scale = dims.scale();
    let dqkv = SharedMut::new(dqkv);
    datt.par_chunks_mut(t * t)
        .zip(att.par_chunks(t * t))
        .enumerate()
        .for_each(|(bh, (datt_bh, att_bh))| {
            let (b, h) = (bh / nh, bh % nh);
            let head_offset = |part: usize| b * t * 3 * c + part * c + h * hs;
            let head = |part: usize| MatRef::strided(&qkv[head_offset(part)..], t, hs, 3 * c);
            let (q, k, v) = (head(0), head(1), head(2));
            let dy = MatRef::strided(&dout[b * t * c + h * hs..], t, hs, c);
            let probs = MatRef::new(att_bh, t, t);

            matmul(
                MatMut::new(datt_bh, t, t),
                dy,
                v.t(),
                Accumulate::Overwrite,
                Threads::Single,
            );
            // SAFETY (all three views): (b, h) pairs write disjoint column blocks of disjoint
            // rows, and q, k, v parts of one pair are disjoint column ranges.
            let dv = unsafe { dqkv.view(head_offset(2), t, hs, 3 * c) };
            matmul(dv, probs.t(), dy, Accumulate::Overwrite, Threads::Single);

            for (row_index, (d_row, p_row)) in datt_bh
                .chunks_exact_mut(t)
                .zip(att_bh.chunks_exact(t))
                .enumerate()
            {
                causal_softmax_backward_row(d_row, p_row, row_index + 1, scale);
            }
            let scores_grad = MatRef::new(datt_bh, t, t);
            let dq = unsafe { dqkv.view(head_offset(0), t, hs, 3 * c) };
            matmul(dq, scores_grad, k, Accumulate::Overwrite, Threads::Single);
            let dk = unsafe { dqkv.view(head_offset(1), t, hs, 3 * c) };
            matmul(
                dk,
                scores_grad.t(),
                q,
                Accumulate::Overwrite,
                Threads::Single,
            );
        });
}

/// Turns `d` (gradient w.r.t. the probabilities `p`) into the gradient w.r.t. the unscaled scores.
fn causal_softmax_backward_row(d: &mut [f32], p: &[f32], visible: usize, scale: f32) {
    let (seen, masked) = d.split_at_mut(visible);
    let p = &p[..visible];
    let weighted: f32 = super::sum::dot(seen, p);
    for (g, &pj) in seen.iter_mut().zip(p) {
        *g = pj * (*g - weighted) * scale;
    }
    masked.fill(0.0);
}
