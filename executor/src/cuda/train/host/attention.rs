//! GPT-2's causal attention as `kernels/cu/attention.cu` computes it, on the host: the
//! forward's output is the CPU model's ([`grouped_attention_forward`], one key/value head per
//! query head) and, as the kernel keeps instead of the probabilities, each row's
//! log-sum-exp of its scaled scores `(B, NH, T)`; the backward is the kernel's: it reads that
//! log-sum-exp (`p = exp(q·k * scale - lse)`) and `delta = rowsum(dout * out)` from the
//! forward's stored output (written to the op's `delta` scratch as the kernel does), and
//! writes `dqkv` (not accumulated).

use super::HostError;
use crate::cuda::train::program::AttentionShape;
use crate::model::attention::{AttentionDims, grouped_attention_forward};

/// Where query `t`'s (or key/value `t`'s) head `h` part `part` (0 q, 1 k, 2 v) starts in a
/// `(B, T, 3C)` buffer.
fn at(shape: &AttentionShape, b: usize, t: usize, h: usize, part: usize) -> usize {
    let c = shape.n_head * shape.head_dim;
    (b * shape.seq_len + t) * 3 * c + part * c + h * shape.head_dim
}

fn check(shape: &AttentionShape, qkv: usize, out: usize, lse: usize) -> Result<(), HostError> {
    let rows = shape.batch * shape.seq_len;
    let c = shape.n_head * shape.head_dim;
    let stats = shape.batch * shape.n_head * shape.seq_len;
    if qkv != rows * 3 * c || out != rows * c || lse != stats {
        return Err(HostError(format!(
            "attention {shape:?}: qkv {qkv}, out {out}, lse {lse} elements"
        )));
    }
    Ok(())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `out` and `lse` of causal attention over `qkv`.
pub fn forward(
    out: &mut [f32],
    lse: &mut [f32],
    qkv: &[f32],
    shape: AttentionShape,
) -> Result<(), HostError> {
    check(&shape, qkv.len(), out.len(), lse.len())?;
    let (b_n, t_n, nh, hs) = (shape.batch, shape.seq_len, shape.n_head, shape.head_dim);
    let dims = AttentionDims {
        batch: b_n,
        seq_len: t_n,
        n_head: nh,
        head_dim: hs,
    };
    let mut att = vec![0.0; b_n * nh * t_n * t_n];
    grouped_attention_forward(out, &mut att, qkv, dims, nh);
    let scale = (hs as f64).powf(-0.5);
    for b in 0..b_n {
        for h in 0..nh {
            for t in 0..t_n {
                let q = &qkv[at(&shape, b, t, h, 0)..][..hs];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| f64::from(dot(q, &qkv[at(&shape, b, s, h, 1)..][..hs])) * scale)
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                lse[(b * nh + h) * t_n + t] = (m + l.ln()) as f32;
            }
        }
    }
    Ok(())
}

/// `dqkv` (written) and `delta` of causal attention, from the forward's `out`, `qkv` and
/// `lse`.
pub fn backward(
    dqkv: &mut [f32],
    delta: &mut [f32],
    (dout, out, qkv, lse): (&[f32], &[f32], &[f32], &[f32]),
    shape: AttentionShape,
) -> Result<(), HostError> {
    check(&shape, qkv.len(), out.len(), lse.len())?;
    if dqkv.len() != qkv.len() || dout.len() != out.len() || delta.len() != lse.len() {
        return Err(HostError(format!(
            "attention backward {shape:?}: dqkv {}, dout {}, delta {} elements",
            dqkv.len(),
            dout.len(),
            delta.len()
        )));
    }
    let (b_n, t_n, nh, hs) = (shape.batch, shape.seq_len, shape.n_head, shape.head_dim);
    let c = nh * hs;
    let scale = (hs as f64).powf(-0.5) as f32;
    dqkv.fill(0.0);
    for b in 0..b_n {
        for h in 0..nh {
            for t in 0..t_n {
                let row = (b * t_n + t) * c + h * hs;
                delta[(b * nh + h) * t_n + t] = dot(&dout[row..][..hs], &out[row..][..hs]);
            }
            for t in 0..t_n {
                let stat = (b * nh + h) * t_n + t;
                let (row_lse, row_delta) = (lse[stat], delta[stat]);
                let row = (b * t_n + t) * c + h * hs;
                let dy = &dout[row..][..hs];
                let q_at = at(&shape, b, t, h, 0);
                let q: Vec<f32> = qkv[q_at..][..hs].to_vec();
                let mut dq = vec![0.0f32; hs];
                for s in 0..=t {
                    let (k_at, v_at) = (at(&shape, b, s, h, 1), at(&shape, b, s, h, 2));
                    let k = &qkv[k_at..][..hs];
                    let v = &qkv[v_at..][..hs];
                    let p = (dot(&q, k) * scale - row_lse).exp();
                    let dp = dot(dy, v);
                    let ds = p * (dp - row_delta);
                    for d in 0..hs {
                        dq[d] += ds * k[d] * scale;
                        dqkv[k_at + d] += ds * q[d] * scale;
                        dqkv[v_at + d] += p * dy[d];
                    }
                }
                for (slot, g) in dqkv[q_at..][..hs].iter_mut().zip(dq) {
                    *slot += g;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::attention::attention_backward;
    use crate::train::AttentionKernel;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The kernel's backward from the log-sum-exp and `delta` equals the CPU model's from the
    /// probabilities, and the log-sum-exp is each row's `log sum exp(q·k * scale)`.
    #[test]
    fn the_backward_from_the_log_sum_exp_is_the_cpu_models() {
        let shape = AttentionShape {
            batch: 2,
            seq_len: 19,
            n_head: 3,
            head_dim: 8,
            kernel: AttentionKernel::Scalar,
        };
        let (b, t, nh, hs) = (2, 19, 3, 8);
        let c = nh * hs;
        let qkv = values(b * t * 3 * c, 3);
        let dout = values(b * t * c, 5);
        let (mut out, mut lse) = (vec![0.0; b * t * c], vec![0.0; b * nh * t]);
        forward(&mut out, &mut lse, &qkv, shape).expect("forward");
        let (mut dqkv, mut delta) = (vec![1.0; qkv.len()], vec![0.0; lse.len()]);
        backward(&mut dqkv, &mut delta, (&dout, &out, &qkv, &lse), shape).expect("backward");

        let dims = AttentionDims {
            batch: b,
            seq_len: t,
            n_head: nh,
            head_dim: hs,
        };
        let mut att = vec![0.0; b * nh * t * t];
        let mut cpu_out = vec![0.0; out.len()];
        grouped_attention_forward(&mut cpu_out, &mut att, &qkv, dims, nh);
        let (mut cpu_dqkv, mut datt) = (vec![0.0; qkv.len()], vec![0.0; att.len()]);
        attention_backward(&mut cpu_dqkv, &mut datt, &dout, &qkv, &att, dims);
        let worst = dqkv
            .iter()
            .zip(&cpu_dqkv)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(worst < 1e-5, "dqkv differs by {worst}");
        // The last query row of head 0 of batch 1 sees every key: its probabilities from the
        // log-sum-exp are the CPU's and sum to one.
        let row = nh * t + (t - 1); // (b = 1, h = 0, the last query)
        let probs = &att[row * t..(row + 1) * t];
        let scale = (hs as f32).powf(-0.5);
        let q = &qkv[at(&shape, 1, t - 1, 0, 0)..][..hs];
        for (s, &p) in probs.iter().enumerate() {
            let k = &qkv[at(&shape, 1, s, 0, 1)..][..hs];
            let from_lse = (dot(q, k) * scale - lse[row]).exp();
            assert!((from_lse - p).abs() < 1e-6, "key {s}: {from_lse} vs {p}");
        }
    }
}
