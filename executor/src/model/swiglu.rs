//! The SwiGLU activation of the Llama MLP: `h = silu(gate) * up`, `silu(x) = x * sigmoid(x)`.
//!
//! `gate_up` rows are `[gate | up]`, each `I` wide (the two projections write side by side).

use rayon::prelude::*;

/// `sigmoid(x) = 1 / (1 + exp(-x))`.
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// SwiGLU forward.
///
/// * `out` `(N, I)`, written
/// * `gate_up` `(N, 2I)`
pub fn swiglu_forward(out: &mut [f32], gate_up: &[f32], inner: usize) {
    out.par_chunks_mut(inner)
        .zip(gate_up.par_chunks(2 * inner))
        .for_each(|(h, row)| {
            let (gate, up) = row.split_at(inner);
            for ((h, &g), &u) in h.iter_mut().zip(gate).zip(up) {
                *h = g / (1.0 + (-g).exp()) * u;
            }
        });
}

/// SwiGLU backward.
///
/// * `dgate_up` `(N, 2I)`, written: `[dh * up * silu'(gate) | dh * silu(gate)]`
/// * `dout` `(N, I)`; `gate_up` `(N, 2I)` from the forward pass
///
/// `silu'(x) = s (1 + x (1 - s))` with `s = sigmoid(x)`.
pub fn swiglu_backward(dgate_up: &mut [f32], dout: &[f32], gate_up: &[f32], inner: usize) {
    dgate_up
        .par_chunks_mut(2 * inner)
        .zip(dout.par_chunks(inner))
        .zip(gate_up.par_chunks(2 * inner))
        .for_each(|((drow, dh), row)| {
            let (gate, up) = row.split_at(inner);
            let (dgate, dup) = drow.split_at_mut(inner);
            for i in 0..inner {
                let (g, u, d) = (gate[i], up[i], dh[i]);
                let s = sigmoid(g);
                dup[i] = d * g * s;
                dgate[i] = d * u * s * (1.0 + g * (1.0 - s));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_matches_finite_differences() {
        let inner = 3;
        let gate_up: Vec<f32> = (0..2 * 2 * inner)
            .map(|i| (i as f32 * 0.9).sin() * 2.0)
            .collect();
        let dy: Vec<f32> = (0..2 * inner).map(|i| (i as f32 * 0.4).cos()).collect();
        let loss = |gu: &[f32]| -> f64 {
            let mut out = vec![0.0; 2 * inner];
            swiglu_forward(&mut out, gu, inner);
            out.iter().zip(&dy).map(|(&o, &d)| f64::from(o * d)).sum()
        };
        let mut grad = vec![0.0; gate_up.len()];
        swiglu_backward(&mut grad, &dy, &gate_up, inner);
        for i in 0..gate_up.len() {
            let (mut plus, mut minus) = (gate_up.clone(), gate_up.clone());
            plus[i] += 1e-3;
            minus[i] -= 1e-3;
            let numeric = (loss(&plus) - loss(&minus)) / 2e-3;
            assert!((numeric - f64::from(grad[i])).abs() < 1e-3, "[{i}]");
        }
    }
}
