//! `torch.nn.Linear`: `out = inp @ weight^T + bias`, weight `[out, in]` (the layout of every
//! Llama-family projection), with an optional bias.
//!
//! The output (and, in backward, its gradient) may be a column block of wider rows: the `q`,
//! `k` and `v` projections write side by side into one `[q | k | v]` row, the gate and up
//! projections into one `[gate | up]` row. `stride` is the distance between rows.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, Threads, matmul};

/// Rows per work item of the bias gradient; fixed, so the sum's order does not depend on the
/// number of threads.
const BIAS_ROWS_PER_CHUNK: usize = 64;

/// `out (+)= inp @ weight^T + bias`.
///
/// * `out` `(N, OC)` with rows `stride` apart: written, or added to with [`Accumulate::Add`]
/// * `inp` `(N, IC)`; `weight` `(OC, IC)`; `bias` `(OC)` if any
pub fn linear_forward(
    out: &mut [f32],
    stride: usize,
    mode: Accumulate,
    inp: &[f32],
    weight: &[f32],
    bias: Option<&[f32]>,
    ic: usize,
) {
    let oc = weight.len() / ic;
    let n = inp.len() / ic;
    matmul(
        MatMut::strided(out, n, oc, stride),
        MatRef::new(inp, n, ic),
        MatRef::new(weight, oc, ic).t(),
        mode,
        Threads::Pool,
    );
    if let Some(bias) = bias {
        out.par_chunks_mut(stride).for_each(|row| {
            for (o, &b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        });
    }
}

/// Gradients of [`linear_forward`].
///
/// * `dinp` `(N, IC)`: `dout @ weight`, written or added ([`Accumulate`])
/// * `dweight` `(OC, IC)`: accumulated (`+= dout^T @ inp`)
/// * `dbias` `(OC)` if any: accumulated (`+=` column sums of `dout`)
/// * `dout` `(N, OC)` with rows `stride` apart; `inp` `(N, IC)`; `weight` `(OC, IC)`
#[allow(
    clippy::too_many_arguments,
    reason = "the layer's buffers, as llm.c passes them"
)]
pub fn linear_backward(
    dinp: &mut [f32],
    dinp_mode: Accumulate,
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
    dout: &[f32],
    stride: usize,
    inp: &[f32],
    weight: &[f32],
    ic: usize,
) {
    let oc = weight.len() / ic;
    let n = inp.len() / ic;
    let dout_rows = MatRef::strided(dout, n, oc, stride);
    matmul(
        MatMut::new(dinp, n, ic),
        dout_rows,
        MatRef::new(weight, oc, ic),
        dinp_mode,
        Threads::Pool,
    );
    matmul(
        MatMut::new(dweight, oc, ic),
        dout_rows.t(),
        MatRef::new(inp, n, ic),
        Accumulate::Add,
        Threads::Pool,
    );
    if let Some(dbias) = dbias {
        add_strided_column_sums(dbias, dout, n, stride);
    }
}

/// `acc[j] += sum_i rows[i * stride + j]` over `n` rows, deterministically in parallel.
fn add_strided_column_sums(acc: &mut [f32], rows: &[f32], n: usize, stride: usize) {
    let width = acc.len();
    let partials: Vec<Vec<f32>> = (0..n.div_ceil(BIAS_ROWS_PER_CHUNK))
        .into_par_iter()
        .map(|chunk| {
            let mut partial = vec![0.0f32; width];
            let end = ((chunk + 1) * BIAS_ROWS_PER_CHUNK).min(n);
            for i in chunk * BIAS_ROWS_PER_CHUNK..end {
                for (p, &x) in partial.iter_mut().zip(&rows[i * stride..][..width]) {
                    *p += x;
                }
            }
            partial
        })
        .collect();
    for partial in &partials {
        for (a, &p) in acc.iter_mut().zip(partial) {
            *a += p;
        }
    }
}
