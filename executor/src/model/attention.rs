//! Causal multi-head self-attention (Hugging Face `eager`):
//! per head, `att = softmax(q @ k^T * head_dim^-0.5 + mask)`, `y = att @ v`.
//!
//! The mask is an [`AttentionMask`]: causal, or causal within documents (packed rows whose
//! `position_ids` restart: block-diagonal) and without padded keys (`attention_mask` 0). Masked
//! probabilities are exactly 0, as `softmax` of `finfo.min` gives in `transformers`, so the
//! backward needs no mask: `dS = P * (dP - rowsum(P * dP))` is 0 wherever `P` is.
//!
//! `qkv` rows are `[q | k | v]`, each `C` wide; head `h` is the column block
//! `h*hs .. (h+1)*hs` inside each. The probabilities are kept `(B, NH, T, T)` for backward
//! (zero above the diagonal). Work is split over the `B * NH` (batch, head) pairs; each pair
//! writes only its own column block of the outputs, on one thread, so results do not depend on
//! the number of threads.
//!
//! The causal mask is used to skip work, not only to zero it: rows are taken in blocks of
//! [`BLOCK`], and a block of query rows multiplies only the keys it can see (columns up to the
//! block's last row). The products that remain are the same dot products as the full square,
//! so only the masked half (less a sliver on the diagonal blocks) is saved.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, SharedMut, Threads, matmul};
use super::sum::{dot, exp_shifted_sum, max, scale as scale_slice, vectorised};

/// Query rows (and key columns) per block of the causal products.
const BLOCK: usize = 64;

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

/// Which keys a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionMask<'a> {
    /// Query `t` of a row sees keys `0 ..= t` of that row.
    Causal,
    /// Query `t` of a row sees keys `first_key[t] ..= t` of that row (the start of its document:
    /// a block-diagonal causal mask for packed rows), and of those only the ones whose `keys`
    /// entry is 1 (the padding mask; all of them when `None`). Both `(B*T)`, indexed by token;
    /// `first_key` values are row positions (`first_key[b*T + t] <= t`, checked by the caller).
    /// A query that sees no key gets zero probabilities and a zero output.
    Documents {
        /// Per token, the row position where its document starts.
        first_key: &'a [u32],
        /// Per token, 1 if it may be attended to as a key, 0 if it is padding.
        keys: Option<&'a [u8]>,
    },
}

/// The row blocks `(start, end)` of a sequence of `t` rows.
fn blocks(t: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..t)
        .step_by(BLOCK)
        .map(move |start| (start, (start + BLOCK).min(t)))
}

/// Where one (batch, head) pair's `q`, `k`, `v` live in `qkv`, and its output in `(B, T, C)`.
#[derive(Debug, Clone, Copy)]
struct HeadIndex {
    t: usize,
    /// Output channels `NH * hs`.
    c: usize,
    /// Elements of one `qkv` row, `(NH + 2 KV) * hs`.
    width: usize,
    hs: usize,
    b: usize,
    h: usize,
    /// Column of this head's `q`, `k` and `v` in a `qkv` row.
    cols: [usize; 3],
}

impl HeadIndex {
    /// Query head `h` of row `b`; it reads key/value head `h / (NH / KV)`.
    fn new(dims: AttentionDims, kv_heads: usize, b: usize, h: usize) -> Self {
        let (nh, hs) = (dims.n_head, dims.head_dim);
        let kv = h / (nh / kv_heads);
        Self {
            t: dims.seq_len,
            c: nh * hs,
            width: (nh + 2 * kv_heads) * hs,
            hs,
            b,
            h,
            cols: [h * hs, (nh + kv) * hs, (nh + kv_heads + kv) * hs],
        }
    }

    /// Offset of row `row` of part `part` (0 q, 1 k, 2 v) in `qkv` / `dqkv`.
    fn qkv_offset(&self, part: usize, row: usize) -> usize {
        (self.b * self.t + row) * self.width + self.cols[part]
    }

    /// Rows `start..end` of part `part`, a strided `(end - start, hs)` view.
    fn part<'a>(&self, qkv: &'a [f32], part: usize, start: usize, end: usize) -> MatRef<'a> {
        MatRef::strided(
            &qkv[self.qkv_offset(part, start)..],
            end - start,
            self.hs,
            self.width,
        )
    }

    /// Offset of row `row` of this head in a `(B, T, C)` buffer.
    fn btc_offset(&self, row: usize) -> usize {
        (self.b * self.t + row) * self.c + self.h * self.hs
    }
}

/// Attention forward.
///
/// * `out` `(B, T, C)`, written: heads side by side
/// * `att` `(B, NH, T, T)`, written: probabilities, zero above the diagonal
/// * `qkv` `(B, T, 3C)`
pub fn attention_forward(out: &mut [f32], att: &mut [f32], qkv: &[f32], dims: AttentionDims) {
    grouped_attention_forward(out, att, qkv, dims, dims.n_head);
}

/// Grouped-query attention forward: query head `h` attends with key/value head
/// `h / (NH / KV)` (`transformers`' `repeat_kv`); `KV = NH` is [`attention_forward`].
///
/// * `out` `(B, T, NH*hs)`, written: heads side by side
/// * `att` `(B, NH, T, T)`, written: probabilities, zero above the diagonal
/// * `qkv` `(B, T, (NH + 2 KV) * hs)`, rows `[q | k | v]`
///
/// `kv_heads` must divide `NH` (checked by the model's config).
pub fn grouped_attention_forward(
    out: &mut [f32],
    att: &mut [f32],
    qkv: &[f32],
    dims: AttentionDims,
    kv_heads: usize,
) {
    masked_attention_forward(out, att, qkv, dims, kv_heads, AttentionMask::Causal);
}

/// [`grouped_attention_forward`] under `mask` (see [`AttentionMask`]); the probabilities `att`
/// are zero wherever the mask hides a key, so [`grouped_attention_backward`] serves every mask.
pub fn masked_attention_forward(
    out: &mut [f32],
    att: &mut [f32],
    qkv: &[f32],
    dims: AttentionDims,
    kv_heads: usize,
    mask: AttentionMask<'_>,
) {
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
            let head = HeadIndex::new(dims, kv_heads, bh / nh, bh % nh);
            for (start, end) in blocks(t) {
                let rows = &mut att_bh[start * t..end * t];
                // scores[start..end, 0..end] = q[start..end] @ k[0..end]^T
                matmul(
                    MatMut::strided(rows, end - start, end, t),
                    head.part(qkv, 0, start, end),
                    head.part(qkv, 1, 0, end).t(),
                    Accumulate::Overwrite,
                    Threads::Single,
                );
                for (i, row) in rows.chunks_exact_mut(t).enumerate() {
                    let query = start + i;
                    match mask {
                        AttentionMask::Causal => causal_softmax_row(row, query + 1, scale),
                        AttentionMask::Documents { first_key, keys } => {
                            let token = head.b * t + query;
                            let first = first_key[token] as usize;
                            let keys = keys.map(|k| &k[head.b * t + first..=token]);
                            masked_softmax_row(row, first, query + 1, keys, scale);
                        }
                    }
                }
                // SAFETY: (b, h) pairs write disjoint column blocks `h*hs..(h+1)*hs` of
                // disjoint rows `b*T..(b+1)*T`; the row blocks of one pair are disjoint.
                let y = unsafe { out.view(head.btc_offset(start), end - start, hs, c) };
                // y[start..end] = att[start..end, 0..end] @ v[0..end]
                matmul(
                    y,
                    MatRef::strided(rows, end - start, end, t),
                    head.part(qkv, 2, 0, end),
                    Accumulate::Overwrite,
                    Threads::Single,
                );
            }
        });
}

/// Scales the first `visible` scores, turns them into probabilities, zeroes the rest.
fn causal_softmax_row(row: &mut [f32], visible: usize, scale: f32) {
    let (seen, masked) = row.split_at_mut(visible);
    scale_slice(seen, scale);
    let total = exp_shifted_sum(seen, max(seen));
    scale_slice(seen, 1.0 / total);
    masked.fill(0.0);
}

/// As [`causal_softmax_row`] over the window `first..visible` only, leaving out the keys whose
/// `keys` entry (one per window position) is 0; a window with no key left is all zeros.
fn masked_softmax_row(
    row: &mut [f32],
    first: usize,
    visible: usize,
    keys: Option<&[u8]>,
    scale: f32,
) {
    let (seen, masked) = row.split_at_mut(visible);
    masked.fill(0.0);
    let (hidden, window) = seen.split_at_mut(first.min(visible));
    hidden.fill(0.0);
    scale_slice(window, scale);
    if let Some(keys) = keys {
        for (score, &key) in window.iter_mut().zip(keys) {
            if key == 0 {
                *score = f32::NEG_INFINITY;
            }
        }
    }
    let top = max(window);
    if top == f32::NEG_INFINITY {
        window.fill(0.0);
        return;
    }
    let total = exp_shifted_sum(window, top);
    scale_slice(window, 1.0 / total);
    if let Some(keys) = keys {
        for (p, &key) in window.iter_mut().zip(keys) {
            if key == 0 {
                *p = 0.0;
            }
        }
    }
}

/// Attention backward.
///
/// * `dqkv` `(B, T, 3C)`, written
/// * `datt` `(B, NH, T, T)`: scratch (only its lower triangle is used)
/// * `dout` `(B, T, C)`; `qkv` `(B, T, 3C)`; `att` `(B, NH, T, T)` from the forward pass
///
/// Per head: `dP = dy @ v^T`, `dv = P^T @ dy`, `dS = P * (dP - rowsum(P * dP)) * scale`,
/// `dq = dS @ k`, `dk = dS^T @ q`; each over the causal blocks only.
pub fn attention_backward(
    dqkv: &mut [f32],
    datt: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    dims: AttentionDims,
) {
    grouped_attention_backward(dqkv, datt, dout, qkv, att, dims, dims.n_head);
}

/// Grouped-query attention backward (see [`grouped_attention_forward`]): as
/// [`attention_backward`], the `k` and `v` gradients of a key/value head summed over the query
/// heads that share it, in head order.
///
/// * `dqkv` `(B, T, (NH + 2 KV) * hs)`, written
/// * `datt` `(B, NH, T, T)`: scratch
/// * `dout` `(B, T, NH*hs)`; `qkv`; `att` `(B, NH, T, T)` from the forward pass
pub fn grouped_attention_backward(
    dqkv: &mut [f32],
    datt: &mut [f32],
    dout: &[f32],
    qkv: &[f32],
    att: &[f32],
    dims: AttentionDims,
    kv_heads: usize,
) {
    let AttentionDims {
        seq_len: t,
        n_head: nh,
        head_dim: hs,
        ..
    } = dims;
    let c = dims.channels();
    let scale = dims.scale();
    let group = nh / kv_heads;
    let dqkv = SharedMut::new(dqkv);
    // One work item per (batch, key/value head): the query heads of a group are consecutive,
    // so their probabilities are one contiguous chunk, and only this item writes the group's
    // `dk` and `dv`.
    datt.par_chunks_mut(group * t * t)
        .zip(att.par_chunks(group * t * t))
        .enumerate()
        .for_each(|(bkv, (datt_group, att_group))| {
            let (b, kv) = (bkv / kv_heads, bkv % kv_heads);
            for (j, (datt_bh, att_bh)) in datt_group
                .chunks_exact_mut(t * t)
                .zip(att_group.chunks_exact(t * t))
                .enumerate()
            {
                let head = HeadIndex::new(dims, kv_heads, b, kv * group + j);
                let kv_mode = if j == 0 {
                    Accumulate::Overwrite
                } else {
                    Accumulate::Add
                };
                let dy = |start: usize, end: usize| {
                    MatRef::strided(&dout[head.btc_offset(start)..], end - start, hs, c)
                };
                // SAFETY (every view below): work items write disjoint row ranges (batches) or
                // disjoint column blocks (query heads, key/value heads); the q, k, v parts are
                // disjoint column ranges, the row blocks of one part are disjoint, and views are
                // dropped before the next is made.
                let grad = |part: usize, start: usize, end: usize| unsafe {
                    dqkv.view(head.qkv_offset(part, start), end - start, hs, head.width)
                };

                for (start, end) in blocks(t) {
                    let rows = &mut datt_bh[start * t..end * t];
                    // dP[start..end, 0..end] = dy[start..end] @ v[0..end]^T
                    matmul(
                        MatMut::strided(rows, end - start, end, t),
                        dy(start, end),
                        head.part(qkv, 2, 0, end).t(),
                        Accumulate::Overwrite,
                        Threads::Single,
                    );
                    // dv[start..end] (+)= P[start..T, start..end]^T @ dy[start..T] (rows above
                    // `start` cannot see these keys).
                    matmul(
                        grad(2, start, end),
                        MatRef::strided(&att_bh[start * t + start..], t - start, end - start, t)
                            .t(),
                        dy(start, t),
                        kv_mode,
                        Threads::Single,
                    );
                    let p_rows = &att_bh[start * t..end * t];
                    for (i, (d_row, p_row)) in rows
                        .chunks_exact_mut(t)
                        .zip(p_rows.chunks_exact(t))
                        .enumerate()
                    {
                        causal_softmax_backward_row(&mut d_row[..end], p_row, start + i + 1, scale);
                    }
                }
                let scores_grad: &[f32] = datt_bh;
                for (start, end) in blocks(t) {
                    // dq[start..end] = dS[start..end, 0..end] @ k[0..end]
                    matmul(
                        grad(0, start, end),
                        MatRef::strided(&scores_grad[start * t..], end - start, end, t),
                        head.part(qkv, 1, 0, end),
                        Accumulate::Overwrite,
                        Threads::Single,
                    );
                    // dk[start..end] (+)= dS[start..T, start..end]^T @ q[start..T]
                    matmul(
                        grad(1, start, end),
                        MatRef::strided(
                            &scores_grad[start * t + start..],
                            t - start,
                            end - start,
                            t,
                        )
                        .t(),
                        head.part(qkv, 0, start, t),
                        kv_mode,
                        Threads::Single,
                    );
                }
            }
        });
}

/// Turns `d` (gradient w.r.t. the probabilities `p`) into the gradient w.r.t. the unscaled
/// scores over the first `visible` entries, and zeroes the rest of `d`.
fn causal_softmax_backward_row(d: &mut [f32], p: &[f32], visible: usize, scale: f32) {
    let (seen, masked) = d.split_at_mut(visible);
    let p = &p[..visible];
    let weighted: f32 = dot(seen, p);
    softmax_backward_in_place(seen, p, weighted, scale);
    masked.fill(0.0);
}

vectorised! {
    /// `g = p * (g - weighted) * scale`, element-wise.
    fn softmax_backward_in_place(g: &mut [f32], p: &[f32], weighted: f32, scale: f32) {
        for (g, &pj) in g.iter_mut().zip(p) {
            *g = pj * (*g - weighted) * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full-square computation, written naively, in f64.
    fn reference(qkv: &[f32], dout: &[f32], dims: AttentionDims) -> (Vec<f64>, Vec<f64>) {
        let AttentionDims {
            batch,
            seq_len: t,
            n_head: nh,
            head_dim: hs,
        } = dims;
        let c = nh * hs;
        let scale = f64::from(dims.scale());
        let at = |b: usize, i: usize, part: usize, h: usize, d: usize| {
            f64::from(qkv[(b * t + i) * 3 * c + part * c + h * hs + d])
        };
        let mut out = vec![0.0f64; batch * t * c];
        let mut dqkv = vec![0.0f64; batch * t * 3 * c];
        for b in 0..batch {
            for h in 0..nh {
                for i in 0..t {
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            (0..hs)
                                .map(|d| at(b, i, 0, h, d) * at(b, j, 1, h, d))
                                .sum::<f64>()
                        })
                        .map(|s| s * scale)
                        .collect();
                    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    let p: Vec<f64> = e.iter().map(|x| x / z).collect();
                    let dy = |d: usize| f64::from(dout[(b * t + i) * c + h * hs + d]);
                    for d in 0..hs {
                        out[(b * t + i) * c + h * hs + d] =
                            (0..=i).map(|j| p[j] * at(b, j, 2, h, d)).sum();
                    }
                    let dp: Vec<f64> = (0..=i)
                        .map(|j| (0..hs).map(|d| dy(d) * at(b, j, 2, h, d)).sum())
                        .collect();
                    let weighted: f64 = (0..=i).map(|j| p[j] * dp[j]).sum();
                    for j in 0..=i {
                        let ds = p[j] * (dp[j] - weighted) * scale;
                        for d in 0..hs {
                            dqkv[(b * t + i) * 3 * c + h * hs + d] += ds * at(b, j, 1, h, d);
                            dqkv[(b * t + j) * 3 * c + c + h * hs + d] += ds * at(b, i, 0, h, d);
                            dqkv[(b * t + j) * 3 * c + 2 * c + h * hs + d] += p[j] * dy(d);
                        }
                    }
                }
            }
        }
        (out, dqkv)
    }

    #[test]
    fn blocked_causal_attention_matches_the_naive_square() {
        // T not a multiple of the block, so the last block is short.
        let dims = AttentionDims {
            batch: 2,
            seq_len: BLOCK + 37,
            n_head: 3,
            head_dim: 8,
        };
        let (b, t, c) = (dims.batch, dims.seq_len, dims.channels());
        let qkv: Vec<f32> = (0..b * t * 3 * c)
            .map(|i| (i as f32 * 0.731).sin())
            .collect();
        let dout: Vec<f32> = (0..b * t * c).map(|i| (i as f32 * 0.377).cos()).collect();
        let (out_ref, dqkv_ref) = reference(&qkv, &dout, dims);

        let mut out = vec![f32::NAN; b * t * c];
        let mut att = vec![f32::NAN; b * dims.n_head * t * t];
        attention_forward(&mut out, &mut att, &qkv, dims);
        let mut dqkv = vec![f32::NAN; qkv.len()];
        let mut datt = vec![f32::NAN; att.len()];
        attention_backward(&mut dqkv, &mut datt, &dout, &qkv, &att, dims);

        for (name, ours, reference) in [("out", &out, &out_ref), ("dqkv", &dqkv, &dqkv_ref)] {
            for (i, (&x, &y)) in ours.iter().zip(reference.iter()).enumerate() {
                assert!(
                    (f64::from(x) - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{name}[{i}]: {x} vs {y}"
                );
            }
        }
        for (row_index, row) in att.chunks_exact(t).enumerate() {
            let i = row_index % t;
            assert!(row[i + 1..].iter().all(|&p| p == 0.0), "row {i} not masked");
            let total: f32 = row[..=i].iter().sum();
            assert!((total - 1.0).abs() < 1e-5);
        }
    }

    #[test]
    fn documents_and_padded_keys_attend_as_separate_sequences() {
        // One row of T = 9: a document of 4 tokens, one of 3, then 2 padding tokens. Each
        // document must see exactly what it sees alone; padding is hidden as keys.
        let (nh, hs) = (2, 4);
        let c = nh * hs;
        let t = 9;
        let dims = |seq_len| AttentionDims {
            batch: 1,
            seq_len,
            n_head: nh,
            head_dim: hs,
        };
        let qkv: Vec<f32> = (0..t * 3 * c).map(|i| (i as f32 * 0.53).sin()).collect();
        let first_key = [0u32, 0, 0, 0, 4, 4, 4, 7, 7];
        let keys = [1u8, 1, 1, 1, 1, 1, 1, 0, 0];
        let mut out = vec![f32::NAN; t * c];
        let mut att = vec![f32::NAN; nh * t * t];
        let mask = AttentionMask::Documents {
            first_key: &first_key,
            keys: Some(&keys),
        };
        masked_attention_forward(&mut out, &mut att, &qkv, dims(t), nh, mask);
        for (start, len) in [(0usize, 4usize), (4, 3)] {
            let alone = &qkv[start * 3 * c..(start + len) * 3 * c];
            let mut out_alone = vec![f32::NAN; len * c];
            let mut att_alone = vec![f32::NAN; nh * len * len];
            attention_forward(&mut out_alone, &mut att_alone, alone, dims(len));
            for (x, y) in out[start * c..(start + len) * c].iter().zip(&out_alone) {
                assert!((x - y).abs() < 1e-6, "document at {start}: {x} vs {y}");
            }
        }
        assert!(
            out[7 * c..].iter().all(|&y| y == 0.0),
            "padding sees no key"
        );
        for (row_index, row) in att.chunks_exact(t).enumerate() {
            let query = row_index % t;
            for (key, &p) in row.iter().enumerate() {
                let visible = key <= query && key >= first_key[query] as usize && keys[key] == 1;
                assert!(visible || p == 0.0, "query {query} sees key {key}");
            }
        }
    }
}
