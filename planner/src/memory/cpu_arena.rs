//! The activation arena of dsplan's CPU executor: one `f32` buffer, sized once per model and
//! batch shape, that holds every activation of a forward/backward pass. This is the one place
//! its size is defined: the plan's `dsplan-cpu` backend lists it
//! ([`crate::plan::cpu_buffers`]) and the executor allocates its arena with exactly
//! [`arena_elements`] elements.
//!
//! The CPU GPT-2 keeps what backward needs (llm.c's list, no recomputation) and four backward
//! scratch buffers shared by all layers. With `B` sequences of `T` tokens, width `C`, `NH`
//! heads, MLP width `I`, vocabulary `V` and `L` blocks:
//!
//! | buffer | elements |
//! |---|---|
//! | embeddings output | `BTC` |
//! | per block: `ln_1` out, attention out, its projection, residual, `ln_2` out, MLP projection, residual | `7·BTC` |
//! | per block: `c_attn` output (`q`, `k`, `v`) | `3·BTC` |
//! | per block: MLP input and GELU output | `2·BTI` |
//! | per block: attention probabilities | `B·NH·T²` |
//! | per block: two norms' mean and reciprocal std | `4·BT` |
//! | final norm output, its mean and reciprocal std | `BTC + 2·BT` |
//! | logits (their gradient after the loss), per-position losses | `BTV + BT` |
//! | backward: residual-stream gradient, `(B,T,C)` scratch | `2·BTC` |
//! | backward: `(B,T,I)` scratch (also holds `dqkv`), attention-score scratch | `BTI + B·NH·T²` |
//!
//! Total: `BTC·(10L + 4) + BTI·(2L + 1) + BT·(4L + 3) + B·NH·T²·(L + 1) + BTV`.
//! The `(B,T,I)` scratch also holds `dqkv` `(B,T,3C)`, so the executor needs `I ≥ 3C`
//! (GPT-2: `I = 4C`).

/// The dimensions the arena depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuArenaShape {
    /// Transformer blocks `L`.
    pub layers: u64,
    /// Model width `C`.
    pub hidden: u64,
    /// Attention heads `NH`.
    pub heads: u64,
    /// MLP inner width `I`.
    pub intermediate: u64,
    /// Vocabulary `V`.
    pub vocab: u64,
    /// Sequences per micro-batch `B`.
    pub batch: u64,
    /// Tokens per sequence `T`.
    pub seq_len: u64,
}

/// Elements of the arena (see the [module documentation](self)); saturates at `u64::MAX`.
pub fn arena_elements(shape: &CpuArenaShape) -> u64 {
    let w = |x: u64| u128::from(x);
    let (l, c, nh, i, v) = (
        w(shape.layers),
        w(shape.hidden),
        w(shape.heads),
        w(shape.intermediate),
        w(shape.vocab),
    );
    let bt = w(shape.batch) * w(shape.seq_len);
    let scores = w(shape.batch) * nh * w(shape.seq_len) * w(shape.seq_len);
    let total =
        bt * c * (10 * l + 4) + bt * i * (2 * l + 1) + bt * (4 * l + 3) + scores * (l + 1) + bt * v;
    u64::try_from(total).unwrap_or(u64::MAX)
}

/// Bytes of the arena (`f32` elements).
pub fn arena_bytes(shape: &CpuArenaShape) -> u64 {
    arena_elements(shape).saturating_mul(4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_block_counts_every_buffer_once() {
        // B=1, T=2, C=4, NH=2, I=16, V=10, L=1.
        let shape = CpuArenaShape {
            layers: 1,
            hidden: 4,
            heads: 2,
            intermediate: 16,
            vocab: 10,
            batch: 1,
            seq_len: 2,
        };
        let (bt, btc, bti, scores) = (2, 8, 32, 8);
        // encoded; block: 10 BTC, 2 BTI, 4 BT, scores; lnf, lnf stats; logits, losses;
        // dresidual, dbtc, dbt4c, datt.
        let expected = btc
            + (10 * btc + 2 * bti + 4 * bt + scores)
            + (btc + 2 * bt)
            + (bt * 10 + bt)
            + (2 * btc + bti + scores);
        assert_eq!(arena_elements(&shape), expected);
        assert_eq!(arena_bytes(&shape), 4 * expected);
    }
}
