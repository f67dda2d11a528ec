//! The embedding layer: `out[b, t] = wte[tokens[b, t]] + wpe[t]`.

use rayon::prelude::*;

/// Token plus position embeddings.
///
/// * `out` `(B, T, C)`, written
/// * `tokens` `(B, T)`, each `< V` (checked by the caller)
/// * `wte` `(V, C)`, `wpe` `(maxT, C)` with `maxT >= T`
pub fn encoder_forward(out: &mut [f32], tokens: &[u32], wte: &[f32], wpe: &[f32], seq_len: usize) {
    let c = out.len() / tokens.len().max(1);
    out.par_chunks_mut(c)
        .zip(tokens.par_iter())
        .enumerate()
        .for_each(|(row, (out_row, &token))| {
            let t = row % seq_len;
            let token_row = &wte[token as usize * c..][..c];
            let position_row = &wpe[t * c..][..c];
            for ((o, &x), &p) in out_row.iter_mut().zip(token_row).zip(position_row) {
                *o = x + p;
            }
        });
}

/// Accumulates the embedding gradients: `dwte[tokens[b, t]] += dout[b, t]`, `dwpe[t] += dout[b, t]`.
///
/// * `dwte` `(V, C)`, `dwpe` `(maxT, C)`: accumulated
/// * `dout` `(B, T, C)`, `tokens` `(B, T)`
///
/// Serial over positions, in order, so repeated tokens sum deterministically.
pub fn encoder_backward(
    dwte: &mut [f32],
    dwpe: &mut [f32],
    dout: &[f32],
    tokens: &[u32],
    seq_len: usize,
) {
    let c = dout.len() / tokens.len().max(1);
    for (row, (dout_row, &token)) in dout.chunks_exact(c).zip(tokens).enumerate() {
        let t = row % seq_len;
        for (g, &d) in dwte[token as usize * c..][..c].iter_mut().zip(dout_row) {
            *g += d;
        }
        for (g, &d) in dwpe[t * c..][..c].iter_mut().zip(dout_row) {
            *g += d;
        }
    }
}
