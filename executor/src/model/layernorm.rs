//! LayerNorm over the channel dimension: `out = (x - mean) * rstd * weight + bias`,
//! `rstd = 1 / sqrt(var + eps)` with the biased variance (as `torch.nn.LayerNorm`).

use rayon::prelude::*;

use super::sum::{dot, sum};

/// Rows per work item of the backward pass. Fixed (not derived from the thread count) so the
/// order in which weight/bias gradients are summed, and so the result, is the same on any machine.
const BACKWARD_ROWS_PER_CHUNK: usize = 32;

/// Normalises every row of `inp`.
///
/// * `out` `(N, C)`, written; `mean`, `rstd` `(N)`, written (kept for backward)
/// * `inp` `(N, C)`; `weight`, `bias` `(C)`
pub fn layernorm_forward(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    inp: &[f32],
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    let c = weight.len();
    out.par_chunks_mut(c)
        .zip(inp.par_chunks(c))
        .zip(mean.par_iter_mut().zip(rstd.par_iter_mut()))
        .for_each(|((out_row, x), (row_mean, row_rstd))| {
            let m = sum(x) / c as f32;
            // Centre into `out` first, so the variance is a vectorised dot product.
            for (o, &xi) in out_row.iter_mut().zip(x) {
                *o = xi - m;
            }
            let var = dot(out_row, out_row) / c as f32;
            let s = 1.0 / (var + eps).sqrt();
            for ((o, &w), &b) in out_row.iter_mut().zip(weight).zip(bias) {
                *o = *o * s * w + b;
            }
            *row_mean = m;
            *row_rstd = s;
        });
}

/// Accumulates the LayerNorm gradients.
///
/// * `dinp` `(N, C)`: accumulated (`+=`, it is the residual stream's gradient)
/// * `dweight`, `dbias` `(C)`: accumulated
/// * `dout`, `inp` `(N, C)`; `weight` `(C)`; `mean`, `rstd` `(N)` from the forward pass
///
/// With `norm = (x - mean) * rstd` and `dnorm = dout * weight`:
/// `dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm))`.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dbias: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    mean: &[f32],
    rstd: &[f32],
) {
    let c = weight.len();
    let chunk = BACKWARD_ROWS_PER_CHUNK * c;
    // Each chunk of rows writes its `dinp` rows and returns its partial (dweight, dbias).
    let partials: Vec<Vec<f32>> = dinp
        .par_chunks_mut(chunk)
        .zip(dout.par_chunks(chunk))
        .zip(inp.par_chunks(chunk))
        .zip(
            mean.par_chunks(BACKWARD_ROWS_PER_CHUNK)
                .zip(rstd.par_chunks(BACKWARD_ROWS_PER_CHUNK)),
        )
        .map(|(((dinp_rows, dout_rows), inp_rows), (means, rstds))| {
            let mut partial = vec![0.0f32; 2 * c];
            let (pw, pb) = partial.split_at_mut(c);
            let mut dnorm = vec![0.0f32; c];
            let mut norm = vec![0.0f32; c];
            for ((((dinp_row, dy), x), &m), &s) in dinp_rows
                .chunks_exact_mut(c)
                .zip(dout_rows.chunks_exact(c))
                .zip(inp_rows.chunks_exact(c))
                .zip(means)
                .zip(rstds)
            {
                for i in 0..c {
                    norm[i] = (x[i] - m) * s;
                    dnorm[i] = dy[i] * weight[i];
                    pw[i] += norm[i] * dy[i];
                    pb[i] += dy[i];
                }
                let dnorm_mean = sum(&dnorm) / c as f32;
                let dnorm_norm_mean = dot(&dnorm, &norm) / c as f32;
                for i in 0..c {
                    // term 1: dnorm; term 2: its mean (through `mean`); term 3: through `rstd`.
                    dinp_row[i] += (dnorm[i] - dnorm_mean - norm[i] * dnorm_norm_mean) * s;
                }
            }
            partial
        })
        .collect();
    for partial in &partials {
        let (pw, pb) = partial.split_at(c);
        for (g, &p) in dweight.iter_mut().zip(pw) {
            *g += p;
        }
        for (g, &p) in dbias.iter_mut().zip(pb) {
            *g += p;
        }
    }
}
