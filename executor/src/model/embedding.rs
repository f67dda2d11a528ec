//! A token embedding without positions (Llama family): `out[row] = weight[token[row]]`.

use rayon::prelude::*;

/// Embedding lookup.
///
/// * `out` `(N, C)`, written; `tokens` `(N)`; `weight` `(V, C)`
pub fn embedding_forward(out: &mut [f32], tokens: &[u32], weight: &[f32]) {
    let c = out.len() / tokens.len().max(1);
    out.par_chunks_mut(c)
        .zip(tokens.par_iter())
        .for_each(|(row, &token)| row.copy_from_slice(&weight[token as usize * c..][..c]));
}

/// Embedding gradient, row by row in order (deterministic).
///
/// * `dweight` `(V, C)`: accumulated; `dout` `(N, C)`; `tokens` `(N)`
pub fn embedding_backward(dweight: &mut [f32], dout: &[f32], tokens: &[u32]) {
    let c = dout.len() / tokens.len().max(1);
    for (row, &token) in dout.chunks_exact(c).zip(tokens) {
        for (g, &d) in dweight[token as usize * c..][..c].iter_mut().zip(row) {
            *g += d;
        }
    }
}
