//! The Conv1D layer of Hugging Face GPT-2: `out = inp @ weight + bias`, weight `[in, out]`.

use rayon::prelude::*;

use super::gemm::{Accumulate, MatMut, MatRef, Threads, matmul};

/// Rows per work item when summing the bias gradient; fixed so results do not depend on the
/// number of threads.
const BIAS_ROWS_PER_CHUNK: usize = 64;

/// `out = inp @ weight + bias`.
///
/// * `out` `(N, OC)`, written
/// * `inp` `(N, IC)`; `weight` `(IC, OC)`; `bias` `(OC)`
pub fn matmul_forward(out: &mut [f32], inp: &[f32], weight: &[f32], bias: &[f32]) {
    let oc = bias.len();
    let ic = weight.len() / oc;
    let n = inp.len() / ic;
    out.par_chunks_mut(oc)
        .for_each(|row| row.copy_from_slice(bias));
    matmul(
        MatMut::new(out, n, oc),
        MatRef::new(inp, n, ic),
        MatRef::new(weight, ic, oc),
        Accumulate::Add,
        Threads::Pool,
    );
}

/// The Conv1D gradients.
///
/// * `dinp` `(N, IC)`: written (`dout @ weight^T`)
/// * `dweight` `(IC, OC)`: accumulated (`+= inp^T @ dout`)
/// * `dbias` `(OC)`: accumulated (`+=` column sums of `dout`)
/// * `dout` `(N, OC)`; `inp` `(N, IC)`; `weight` `(IC, OC)`
pub fn matmul_backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
) {
    let oc = dbias.len();
    let ic = weight.len() / oc;
    let n = inp.len() / ic;
    matmul(
        MatMut::new(dinp, n, ic),
        MatRef::new(dout, n, oc),
        MatRef::new(weight, ic, oc).t(),
        Accumulate::Overwrite,
        Threads::Pool,
    );
    matmul(
        MatMut::new(dweight, ic, oc),
        MatRef::new(inp, n, ic).t(),
        MatRef::new(dout, n, oc),
        Accumulate::Add,
        Threads::Pool,
    );
    add_column_sums(dbias, dout);
}

/// `acc[j] += sum_i rows[i, j]`, for `rows` `(N, acc.len())`, deterministically in parallel.
pub fn add_column_sums(acc: &mut [f32], rows: &[f32]) {
    let width = acc.len();
    let partials: Vec<Vec<f32>> = rows
        .par_chunks(BIAS_ROWS_PER_CHUNK * width)
        .map(|chunk| {
            let mut partial = vec![0.0f32; width];
            for row in chunk.chunks_exact(width) {
                for (p, &x) in partial.iter_mut().zip(row) {
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
