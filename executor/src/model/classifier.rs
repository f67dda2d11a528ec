//! The output layer: logits through the tied embedding, then a fused softmax + cross-entropy
//! that turns each logits row into its loss and, in place, its gradient (llm.c's
//! `fused_classifier`). No probability tensor is ever stored.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, Threads, matmul};
use super::sum::{exp, max, scale, vectorised};

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
    // Both products are split into independent single-threaded products that rayon hands out
    // to its threads: no barrier per depth block (the depth of `dlnf` is V = 50k), and an idle
    // thread steals the next piece, which also keeps both threads busy when the machine is
    // shared. Each piece is fixed by the shapes, not by the thread count, so the result is too.
    //
    // dlnf, by row blocks: rows[i] = dlogits[i] @ wte.
    dlnf.par_chunks_mut(DLNF_ROWS * c)
        .enumerate()
        .for_each(|(block, dlnf_rows)| {
            let rows = dlnf_rows.len() / c;
            matmul(
                MatMut::new(dlnf_rows, rows, c),
                MatRef::new(&dlogits[block * DLNF_ROWS * v..], rows, v),
                MatRef::new(wte, v, c),
                Accumulate::Overwrite,
                Threads::Single,
            );
        });
    // dwte, by vocabulary blocks: each block's rows (3 MiB for GPT-2) stay in cache while the
    // whole depth `N` accumulates into them (one product over all `V` rows streams the 150 MiB
    // `dwte` through memory once per depth block instead, about 10 % slower).
    dwte.par_chunks_mut(VOCAB_BLOCK * c)
        .enumerate()
        .for_each(|(block, dwte_rows)| {
            let rows = dwte_rows.len() / c;
            matmul(
                MatMut::new(dwte_rows, rows, c),
                MatRef::strided(&dlogits[block * VOCAB_BLOCK..], n, rows, v).t(),
                MatRef::new(lnf, n, c),
                Accumulate::Add,
                Threads::Single,
            );
        });
}

/// Rows of `dlnf` per product in [`logits_backward`].
const DLNF_ROWS: usize = 256;
/// Vocabulary rows of `dwte` per product in [`logits_backward`].
const VOCAB_BLOCK: usize = 1024;

/// The rows that have a target, or [`super::ModelError::NoTargets`]: a mean over none is
/// undefined (checked before the forward runs).
pub fn target_count(targets: &[Option<u32>]) -> Result<usize, super::ModelError> {
    match targets.iter().filter(|t| t.is_some()).count() {
        0 => Err(super::ModelError::NoTargets),
        count => Ok(count),
    }
}

/// What a micro-batch's summed token loss is divided by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossDivisor {
    /// Its own number of targets ([`target_count`]): the micro-batch's token mean (refused
    /// when it has none).
    TargetsInBatch,
    /// A count from outside: the Trainer's `num_items_in_batch` (the label tokens of the whole
    /// optimizer step, every rank's), divided by the ranks that average the gradients. A
    /// micro-batch without targets then has loss 0.
    Given(f64),
}

impl LossDivisor {
    /// The divisor for `targets`, or why there is none.
    pub fn resolve(self, targets: &[Option<u32>]) -> Result<f64, super::ModelError> {
        match self {
            LossDivisor::TargetsInBatch => target_count(targets).map(|count| count as f64),
            LossDivisor::Given(divisor) if divisor.is_finite() && divisor > 0.0 => Ok(divisor),
            LossDivisor::Given(divisor) => Err(super::ModelError::LossDivisor {
                divisor: divisor.to_string(),
            }),
        }
    }
}

/// The training loss of a causal LM: the summed cross-entropy of the rows with a target divided
/// by `divisor` ([`LossDivisor::resolve`]), leaving in `logits` the gradient of
/// `grad_scale * loss` ([`crossentropy_forward_backward`]).
pub fn divided_crossentropy(
    logits: &mut [f32],
    losses: &mut [f32],
    targets: &[Option<u32>],
    divisor: f64,
    grad_scale: f32,
) -> f32 {
    crossentropy_forward_backward(logits, losses, targets, grad_scale / divisor as f32);
    let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
    (total / divisor) as f32
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_logits_backward_matches_the_naive_products() {
        // More rows than one `dlnf` block and more vocabulary than one `dwte` block, neither a
        // multiple of its block, so every split has a short last piece.
        let (n, v, c) = (DLNF_ROWS + 44, VOCAB_BLOCK + 77, 8);
        let dlogits: Vec<f32> = (0..n * v).map(|i| (i as f32 * 0.013).sin()).collect();
        let lnf: Vec<f32> = (0..n * c).map(|i| (i as f32 * 0.37).cos()).collect();
        let wte: Vec<f32> = (0..v * c).map(|i| (i as f32 * 0.071).sin()).collect();
        let mut dlnf = vec![f32::NAN; n * c];
        let mut dwte = vec![1.0f32; v * c];
        logits_backward(&mut dlnf, &mut dwte, &dlogits, &lnf, &wte, c);
        for i in 0..n {
            for j in 0..c {
                let expected: f64 = (0..v)
                    .map(|k| f64::from(dlogits[i * v + k]) * f64::from(wte[k * c + j]))
                    .sum();
                let got = f64::from(dlnf[i * c + j]);
                assert!(
                    (got - expected).abs() < 1e-3,
                    "dlnf[{i},{j}] {got} vs {expected}"
                );
            }
        }
        for k in 0..v {
            for j in 0..c {
                let expected: f64 = 1.0
                    + (0..n)
                        .map(|i| f64::from(dlogits[i * v + k]) * f64::from(lnf[i * c + j]))
                        .sum::<f64>();
                let got = f64::from(dwte[k * c + j]);
                assert!(
                    (got - expected).abs() < 1e-3,
                    "dwte[{k},{j}] {got} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn crossentropy_matches_f64_softmax() {
        // V not a multiple of the vector lanes; one row without a target.
        let (n, v) = (3, 13);
        let logits: Vec<f32> = (0..n * v).map(|i| (i as f32 * 0.7).sin() * 30.0).collect();
        let targets = [Some(4u32), None, Some(12)];
        let mut grad = logits.clone();
        let mut losses = vec![f32::NAN; n];
        crossentropy_forward_backward(&mut grad, &mut losses, &targets, 0.5);
        for (i, target) in targets.iter().enumerate() {
            let row = &logits[i * v..(i + 1) * v];
            let Some(target) = target.map(|t| t as usize) else {
                assert_eq!(losses[i], 0.0);
                assert!(grad[i * v..(i + 1) * v].iter().all(|&g| g == 0.0));
                continue;
            };
            let max = row
                .iter()
                .map(|&x| f64::from(x))
                .fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = row.iter().map(|&x| (f64::from(x) - max).exp()).sum();
            let loss = max + total.ln() - f64::from(row[target]);
            assert!((f64::from(losses[i]) - loss).abs() < 1e-5 * loss.abs().max(1.0));
            for (j, &x) in row.iter().enumerate() {
                let p = (f64::from(x) - max).exp() / total;
                let expected = 0.5 * (p - if j == target { 1.0 } else { 0.0 });
                assert!((f64::from(grad[i * v + j]) - expected).abs() < 1e-6);
            }
        }
    }
}
