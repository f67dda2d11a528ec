//! The output layer: logits through the tied embedding, then a fused softmax + cross-entropy
//! that turns each logits row into its loss and, in place, its gradient (llm.c's
//! `fused_classifier`). No probability tensor is ever stored.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, Threads, matmul};

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
    matmul(
        MatMut::new(dwte, v, c),
        MatRef::new(dlogits, n, v).t(),
        MatRef::new(lnf, n, c),
        Accumulate::Add,
        Threads::Pool,
    );
}

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
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            // One exp per element, kept in place; the row sum in f64 (V can be 50k terms).
            let mut total = 0.0f64;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                total += f64::from(*x);
            }
            *loss = (f64::from(max) + total.ln() - f64::from(target_logit)) as f32;
            let scale = (1.0 / total) as f32 * dloss;
            for x in row.iter_mut() {
                *x *= scale;
            }
            row[target] -= dloss;
        });
}
