//! The output layer: logits through the tied embedding, then a fused softmax + cross-entropy
//! that turns each logits row into its loss and, in place, its gradient (llm.c's
//! `fused_classifier`). No probability tensor is ever stored.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, Threads, matmul};
use super::sum::{exp, max, vectorised};

/// `logits = lnf @ wte^T` (the tied `lm_head`, no bias).
///
/// * `logits` `(N, V)`, written; `lnf` `(N, C)`; `wte` `(V, C)`
pub fn logits_forward(logits: &mut [f32], lnf: &[f32], wte: &[f32], channels: usize) {
    let v = wte.len() / channels;
    let n = lnf.len() / channels;
    matmul(
        MatMut::new(logits, n, v),
        MatRef::new(lnf, n, channels),
        MatRef::new(wte, v, channels).t(),
        Accumulate::Overwrite,
        Threads::Pool,
    );
}

/// Gradients of [`logits_forward`].
///
/// * `dlnf` `(N, C)`: written (`dlogits @ wte`)
/// * `dwte` `(V, C)`: accumulated (`+= dlogits^T @ lnf`)
/// * `dlogits` `(N, V)`; `lnf` `(N, C)`; `wte` `(V, C)`
pub fn logits_backward(
    dlnf: &mut [f32],
    dwte: &mut [f32],
    dlogits: &[f32],
    lnf: &[f32],
    wte: &[f32],
    channels: usize,
) {
    let c = channels;
    let v = wte.len() / c;
    let n = lnf.len() / c;
    matmul(
        MatMut::new(dlnf, n, c),
        MatRef::new(dlogits, n, v),
        MatRef::new(wte, v, c),
        Accumulate::Overwrite,
        Threads::Pool,
    );
    // In blocks of vocabulary rows: each block's `dwte` rows (3 MiB for GPT-2) stay in cache
    // while the whole depth `N` accumulates into them; one product over all `V` rows streams
    // the 150 MiB `dwte` through memory once per depth block instead (about 10 % slower).
    for (block, dwte_rows) in dwte.chunks_mut(VOCAB_BLOCK * c).enumerate() {
        let rows = dwte_rows.len() / c;
        matmul(
            MatMut::new(dwte_rows, rows, c),
            MatRef::strided(&dlogits[block * VOCAB_BLOCK..], n, rows, v).t(),
            MatRef::new(lnf, n, c),
            Accumulate::Add,
            Threads::Pool,
        );
    }
}

/// Vocabulary rows of `dwte` per product in [`logits_backward`].
const VOCAB_BLOCK: usize = 1024;

/// Fused softmax + cross-entropy + gradient, one row at a time.
///
/// * `logits` `(N, V)`: logits on entry; on return `dloss * (softmax - onehot(target))` per row,
///   and zero for rows without a target
/// * `losses` `(N)`, written: `logsumexp(row) - row[target]`, or 0 without a target
/// * `targets` `(N)`: the class each row should predict (checked `< V` by the caller)
/// * `dloss`: the gradient of the final loss w.r.t. each row's loss (`1 / count` for a mean)
pub fn crossentropy_forward_backward(
    logits: &mut [f32],
    losses: &mut [f32],
    targets: &[Option<u32>],
    dloss: f32,
) {
    let v = logits.len() / targets.len().max(1);
    logits
        .par_chunks_mut(v)
        .zip(losses.par_iter_mut())
        .zip(targets.par_iter())
        .for_each(|((row, loss), target)| {
            let Some(target) = target.map(|t| t as usize) else {
                row.fill(0.0);
                *loss = 0.0;
                return;
            };
            let target_logit = row[target];
            let max = max(row);
            // One exp per element, kept in place; the row sum in f64 (V can be 50k terms).
            let total = exp_shifted_sum_f64(row, max);
            *loss = (f64::from(max) + total.ln() - f64::from(target_logit)) as f32;
            scale(row, (1.0 / total) as f32 * dloss);
            row[target] -= dloss;
        });
}

/// f64 lanes of [`exp_shifted_sum_f64`].
const F64_LANES: usize = 8;

vectorised! {
    /// `a[i] = exp(a[i] - shift)`; returns the sum of the new values, accumulated in f64.
    fn exp_shifted_sum_f64(a: &mut [f32], shift: f32) -> f64 {
        let mut acc = [0.0f64; F64_LANES];
        let mut chunks = a.chunks_exact_mut(F64_LANES);
        for x in &mut chunks {
            for lane in 0..F64_LANES {
                x[lane] = exp(x[lane] - shift);
                acc[lane] += f64::from(x[lane]);
            }
        }
        let mut total = 0.0f64;
        for x in chunks.into_remainder() {
            *x = exp(*x - shift);
            total += f64::from(*x);
        }
        acc.iter().sum::<f64>() + total
    }
}

vectorised! {
    /// `a[i] *= factor`.
    fn scale(a: &mut [f32], factor: f32) {
        for x in a {
            *x *= factor;
        }
    }
}
