//! RMSNorm (Llama, Qwen2, Mistral): `out = w * (x * rsqrt(mean(x^2) + eps))` per row, in f32,
//! no mean subtraction and no bias. The weight multiplies after the normalisation, as
//! `transformers` applies it.

use rayon::prelude::*;

use super::sum::dot;

/// Rows per work item of the backward pass; fixed, so the weight gradient's summation order
/// does not depend on the number of threads.
const BACKWARD_ROWS_PER_CHUNK: usize = 32;

/// RMSNorm forward.
///
/// * `out` `(N, C)`, written
/// * `rstd` `(N)`, written: `1 / sqrt(mean(x^2) + eps)` per row, kept for backward
/// * `inp` `(N, C)`; `weight` `(C)`
pub fn rmsnorm_forward(out: &mut [f32], rstd: &mut [f32], inp: &[f32], weight: &[f32], eps: f32) {
    let c = weight.len();
    out.par_chunks_mut(c)
        .zip(inp.par_chunks(c))
        .zip(rstd.par_iter_mut())
        .for_each(|((out_row, x), row_rstd)| {
            let mean_square = dot(x, x) / c as f32;
            let s = 1.0 / (mean_square + eps).sqrt();
            for ((o, &xi), &w) in out_row.iter_mut().zip(x).zip(weight) {
                *o = w * (xi * s);
            }
            *row_rstd = s;
        });
}

/// RMSNorm backward.
///
/// * `dinp` `(N, C)`: accumulated (`+=`; the residual stream's gradient)
/// * `dweight` `(C)`: accumulated
/// * `dout` `(N, C)`; `inp` `(N, C)`; `weight` `(C)`; `rstd` `(N)` from the forward pass
///
/// With `n = x * s`: `dw += sum_rows dy * n`, `dx = s * (g - n * mean(g * n))` where
/// `g = dy * w`.
pub fn rmsnorm_backward(
    dinp: &mut [f32],
    dweight: &mut [f32],
    dout: &[f32],
    inp: &[f32],
    weight: &[f32],
    rstd: &[f32],
) {
    let c = weight.len();
    let chunk = BACKWARD_ROWS_PER_CHUNK * c;
    let partials: Vec<Vec<f32>> = dinp
        .par_chunks_mut(chunk)
        .zip(dout.par_chunks(chunk))
        .zip(inp.par_chunks(chunk))
        .zip(rstd.par_chunks(BACKWARD_ROWS_PER_CHUNK))
        .map(|(((dinp_rows, dout_rows), inp_rows), rstds)| {
            let mut partial = vec![0.0f32; c];
            let mut g = vec![0.0f32; c];
            let mut norm = vec![0.0f32; c];
            for (((dinp_row, dy), x), &s) in dinp_rows
                .chunks_exact_mut(c)
                .zip(dout_rows.chunks_exact(c))
                .zip(inp_rows.chunks_exact(c))
                .zip(rstds)
            {
                for i in 0..c {
                    norm[i] = x[i] * s;
                    g[i] = dy[i] * weight[i];
                    partial[i] += dy[i] * norm[i];
                }
                let g_norm_mean = dot(&g, &norm) / c as f32;
                for i in 0..c {
                    dinp_row[i] += s * (g[i] - norm[i] * g_norm_mean);
                }
            }
            partial
        })
        .collect();
    for partial in &partials {
        for (d, &p) in dweight.iter_mut().zip(partial) {
            *d += p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_matches_finite_differences() {
        let (n, c) = (3, 5);
        let x: Vec<f32> = (0..n * c).map(|i| (i as f32 * 0.7).sin()).collect();
        let w: Vec<f32> = (0..c).map(|i| 1.0 + 0.1 * i as f32).collect();
        let dy: Vec<f32> = (0..n * c).map(|i| (i as f32 * 0.3).cos()).collect();
        let loss = |x: &[f32], w: &[f32]| -> f64 {
            let mut out = vec![0.0; n * c];
            let mut rstd = vec![0.0; n];
            rmsnorm_forward(&mut out, &mut rstd, x, w, 1e-5);
            out.iter().zip(&dy).map(|(&o, &d)| f64::from(o * d)).sum()
        };
        let mut out = vec![0.0; n * c];
        let mut rstd = vec![0.0; n];
        rmsnorm_forward(&mut out, &mut rstd, &x, &w, 1e-5);
        let mut dx = vec![0.0; n * c];
        let mut dw = vec![0.0; c];
        rmsnorm_backward(&mut dx, &mut dw, &dy, &x, &w, &rstd);
        let h = 1e-3;
        for i in 0..n * c {
            let (mut plus, mut minus) = (x.clone(), x.clone());
            plus[i] += h;
            minus[i] -= h;
            let numeric = (loss(&plus, &w) - loss(&minus, &w)) / (2.0 * f64::from(h));
            assert!((numeric - f64::from(dx[i])).abs() < 2e-3, "dx[{i}]");
        }
        for i in 0..c {
            let (mut plus, mut minus) = (w.clone(), w.clone());
            plus[i] += h;
            minus[i] -= h;
            let numeric = (loss(&x, &plus) - loss(&x, &minus)) / (2.0 * f64::from(h));
            assert!((numeric - f64::from(dw[i])).abs() < 2e-3, "dw[{i}]");
        }
    }
}
