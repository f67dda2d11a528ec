//! Causal attention as `kernels/cu/attention.cu` computes it, on the host, for GPT-2 (one
//! key/value head per query head) and the Llama family's grouped-query attention (query head
//! `h` attends with key/value head `h / (NH / KV)`, rows `[q | k | v]`): the forward's output
//! is the CPU model's ([`grouped_attention_forward`]) and, as the kernel keeps instead of the
//! probabilities, each row's log-sum-exp of its scaled scores `(B, NH, T)`; the backward is
//! the kernel's: it reads that log-sum-exp (`p = exp(q·k * scale - lse)`) and
//! `delta = rowsum(dout * out)` from the forward's stored output (written to the op's `delta`
//! scratch as the kernel does), and writes `dqkv` (not accumulated: a key/value head's
//! gradient is the sum over the query heads that share it).

use super::HostError;
use crate::cuda::launch::GroupedAttention;
use crate::model::attention::{AttentionDims, grouped_attention_forward};

/// Where query head `h`'s part of row `(b, t)` starts in a `(B, T, (NH + 2 KV) hs)` buffer.
fn query_at(dims: &GroupedAttention, b: usize, t: usize, h: usize) -> usize {
    (b * dims.seq_len + t) * width(dims) + h * dims.head_dim
}

/// Where the key (`part` 1) or value (`part` 2) of the key/value head query head `h` reads
/// starts in row `(b, t)` (query head `h` attends with key/value head `h / (NH / KV)`).
fn key_value_at(dims: &GroupedAttention, b: usize, t: usize, h: usize, part: usize) -> usize {
    let group = dims.n_head / dims.kv_heads;
    let kv = h / group;
    (b * dims.seq_len + t) * width(dims)
        + (dims.n_head + (part - 1) * dims.kv_heads + kv) * dims.head_dim
}

/// Elements of a `[q | k | v]` row: `(NH + 2 KV) hs`.
fn width(dims: &GroupedAttention) -> usize {
    (dims.n_head + 2 * dims.kv_heads) * dims.head_dim
}

fn check(dims: &GroupedAttention, qkv: usize, out: usize, lse: usize) -> Result<(), HostError> {
    let rows = dims.batch * dims.seq_len;
    let c = dims.n_head * dims.head_dim;
    let stats = dims.batch * dims.n_head * dims.seq_len;
    if dims.kv_heads == 0
        || !dims.n_head.is_multiple_of(dims.kv_heads)
        || qkv != rows * width(dims)
        || out != rows * c
        || lse != stats
    {
        return Err(HostError(format!(
            "attention {dims:?}: qkv {qkv}, out {out}, lse {lse} elements"
        )));
    }
    Ok(())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The CPU model's dimensions of `dims` (its key/value heads go apart, as a group count).
fn cpu_dims(dims: &GroupedAttention) -> AttentionDims {
    AttentionDims {
        batch: dims.batch,
        seq_len: dims.seq_len,
        n_head: dims.n_head,
        head_dim: dims.head_dim,
    }
}

/// `out` and `lse` of causal (grouped-query) attention over `qkv`.
pub fn forward(
    out: &mut [f32],
    lse: &mut [f32],
    qkv: &[f32],
    dims: GroupedAttention,
) -> Result<(), HostError> {
    check(&dims, qkv.len(), out.len(), lse.len())?;
    let (b_n, t_n, nh, hs) = (dims.batch, dims.seq_len, dims.n_head, dims.head_dim);
    let cpu_dims = cpu_dims(&dims);
    let mut att = vec![0.0; b_n * nh * t_n * t_n];
    grouped_attention_forward(out, &mut att, qkv, cpu_dims, dims.kv_heads);
    let scale = (hs as f64).powf(-0.5);
    for b in 0..b_n {
        for h in 0..nh {
            for t in 0..t_n {
                let q = &qkv[query_at(&dims, b, t, h)..][..hs];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        f64::from(dot(q, &qkv[key_value_at(&dims, b, s, h, 1)..][..hs])) * scale
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                lse[(b * nh + h) * t_n + t] = (m + l.ln()) as f32;
            }
        }
    }
    Ok(())
}

/// `dqkv` (written; a key/value head's gradient summed over the query heads that share it)
/// and `delta` of causal attention, from the forward's `out`, `qkv` and `lse`.
pub fn backward(
    dqkv: &mut [f32],
    delta: &mut [f32],
    (dout, out, qkv, lse): (&[f32], &[f32], &[f32], &[f32]),
    dims: GroupedAttention,
) -> Result<(), HostError> {
    check(&dims, qkv.len(), out.len(), lse.len())?;
    if dqkv.len() != qkv.len() || dout.len() != out.len() || delta.len() != lse.len() {
        return Err(HostError(format!(
            "attention backward {dims:?}: dqkv {}, dout {}, delta {} elements",
            dqkv.len(),
            dout.len(),
            delta.len()
        )));
    }
    let (b_n, t_n, nh, hs) = (dims.batch, dims.seq_len, dims.n_head, dims.head_dim);
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
                let q_at = query_at(&dims, b, t, h);
                let q: Vec<f32> = qkv[q_at..][..hs].to_vec();
                let mut dq = vec![0.0f32; hs];
                for s in 0..=t {
                    let (k_at, v_at) = (
                        key_value_at(&dims, b, s, h, 1),
                        key_value_at(&dims, b, s, h, 2),
                    );
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
    use crate::model::attention::grouped_attention_backward;

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

    /// Attention of `dims` over inputs seeded `seed`, both ways.
    struct BothWays {
        qkv: Vec<f32>,
        lse: Vec<f32>,
        /// The host's output and `dqkv`.
        host: (Vec<f32>, Vec<f32>),
        /// The CPU model's output and `dqkv`.
        cpu: (Vec<f32>, Vec<f32>),
        /// The CPU model's probabilities.
        att: Vec<f32>,
    }

    fn both_ways(dims: GroupedAttention, seed: u64) -> BothWays {
        let (b, t, nh, hs) = (dims.batch, dims.seq_len, dims.n_head, dims.head_dim);
        let qkv = values(b * t * width(&dims), seed);
        let dout = values(b * t * nh * hs, seed + 4);
        let (mut out, mut lse) = (vec![0.0; dout.len()], vec![0.0; b * nh * t]);
        forward(&mut out, &mut lse, &qkv, dims).expect("forward");
        // The backward overwrites `dqkv`: it starts at ones.
        let (mut dqkv, mut delta) = (vec![1.0; qkv.len()], vec![0.0; lse.len()]);
        backward(&mut dqkv, &mut delta, (&dout, &out, &qkv, &lse), dims).expect("backward");
        let cpu_dims = cpu_dims(&dims);
        let mut att = vec![0.0; b * nh * t * t];
        let mut cpu_out = vec![0.0; out.len()];
        let kv = dims.kv_heads;
        grouped_attention_forward(&mut cpu_out, &mut att, &qkv, cpu_dims, kv);
        let (mut cpu_dqkv, mut datt) = (vec![0.0; qkv.len()], vec![0.0; att.len()]);
        grouped_attention_backward(&mut cpu_dqkv, &mut datt, &dout, &qkv, &att, cpu_dims, kv);
        BothWays {
            qkv,
            lse,
            host: (out, dqkv),
            cpu: (cpu_out, cpu_dqkv),
            att,
        }
    }

    fn differs(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    }

    /// The kernel's backward from the log-sum-exp and `delta` equals the CPU model's from the
    /// probabilities, and the log-sum-exp is each row's `log sum exp(q·k * scale)`.
    #[test]
    fn the_backward_from_the_log_sum_exp_is_the_cpu_models() {
        let heads = GroupedAttention {
            batch: 2,
            seq_len: 19,
            n_head: 3,
            kv_heads: 3,
            head_dim: 8,
        };
        let (t, nh, hs) = (19, 3, 8);
        let BothWays {
            qkv,
            lse,
            host,
            cpu,
            att,
        } = both_ways(heads, 3);
        let worst = differs(&host.1, &cpu.1);
        assert!(worst < 1e-5, "dqkv differs by {worst}");
        // The last query row of head 0 of batch 1 sees every key: its probabilities from the
        // log-sum-exp are the CPU's and sum to one.
        let row = nh * t + (t - 1); // (b = 1, h = 0, the last query)
        let probs = &att[row * t..(row + 1) * t];
        let scale = (hs as f32).powf(-0.5);
        let q = &qkv[query_at(&heads, 1, t - 1, 0)..][..hs];
        for (s, &p) in probs.iter().enumerate() {
            let k = &qkv[key_value_at(&heads, 1, s, 0, 1)..][..hs];
            let from_lse = (dot(q, k) * scale - lse[row]).exp();
            assert!((from_lse - p).abs() < 1e-6, "key {s}: {from_lse} vs {p}");
        }
    }

    /// Grouped-query attention (4 query heads over 2 key/value heads): the output is the CPU
    /// model's and the backward from the log-sum-exp is the CPU's from the probabilities, the
    /// shared key/value heads' gradients summed over their query heads.
    #[test]
    fn grouped_query_attention_is_the_cpu_models() {
        let dims = GroupedAttention {
            batch: 2,
            seq_len: 11,
            n_head: 4,
            kv_heads: 2,
            head_dim: 8,
        };
        let BothWays { host, cpu, .. } = both_ways(dims, 13);
        assert!(differs(&host.0, &cpu.0) < 1e-6);
        let worst = differs(&host.1, &cpu.1);
        assert!(worst < 1e-5, "dqkv differs by {worst}");
        assert!(
            cpu.1.iter().any(|g| g.abs() > 1e-3),
            "a gradient to compare"
        );
    }
}
