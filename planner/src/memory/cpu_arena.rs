//! The activation arena of dsplan's CPU executor: one `f32` buffer, sized once per model and
//! batch shape, that holds every activation of a forward/backward pass. This is the one place
//! its size is defined: the plan's `dsplan-cpu` backend lists it
//! ([`crate::plan::cpu_buffers`]) and the executor allocates its arena with exactly
//! [`arena_elements`] elements.
//!
//! Without recomputation ([`Recompute::Nothing`]) the CPU GPT-2 keeps what backward needs
//! (llm.c's list) for every block, and four backward scratch buffers shared by all layers.
//! With `B` sequences of `T` tokens, width `C`, `NH` heads, MLP width `I`, vocabulary `V` and
//! `L` blocks:
//!
//! | buffer | elements |
//! |---|---|
//! | embeddings output (block 0's input) | `BTC` |
//! | per block: its output, the residual stream after it (the next block's input) | `BTC` |
//! | per working set: `ln_1` out, attention out, its projection, residual, `ln_2` out, MLP projection | `6·BTC` |
//! | per working set: `c_attn` output (`q`, `k`, `v`) | `3·BTC` |
//! | per working set: MLP input and GELU output | `2·BTI` |
//! | per working set: attention probabilities | `B·NH·T²` |
//! | per working set: two norms' mean and reciprocal std | `4·BT` |
//! | final norm output, its mean and reciprocal std | `BTC + 2·BT` |
//! | logits (their gradient after the loss), per-position losses | `BTV + BT` |
//! | backward: residual-stream gradient, `(B,T,C)` scratch | `2·BTC` |
//! | backward: `(B,T,I)` scratch (also holds `dqkv`), attention-score scratch | `BTI + B·NH·T²` |
//!
//! Every block has its own working set without recomputation (`S = L` sets). With
//! activation checkpointing ([`Recompute::EachLayer`]: the config's `activation_checkpointing`
//! section, or the Trainer's `gradient_checkpointing`) forward keeps only each block's output
//! (the next block's input) and all blocks share one working set (`S = 1`): backward re-runs
//! each block's forward from its saved input into that set just before the block's backward.
//!
//! Total: `BTC·(L + 9S + 4) + BTI·(2S + 1) + BT·(4S + 3) + B·NH·T²·(S + 1) + BTV`.
//! The `(B,T,I)` scratch also holds `dqkv` `(B,T,3C)`, so the executor needs `I ≥ 3C`
//! (GPT-2: `I = 4C`).

/// What forward keeps of each block for its backward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Recompute {
    /// Every block keeps its whole working set (llm.c's list); nothing is recomputed.
    #[default]
    Nothing,
    /// Every block keeps only its input (activation checkpointing of each layer); backward
    /// recomputes the block's forward into one working set shared by all blocks.
    EachLayer,
}

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
    /// What forward keeps of each block.
    pub recompute: Recompute,
}

impl CpuArenaShape {
    /// Block working sets in the arena, `S`: one per block, or one shared by all.
    pub fn working_sets(&self) -> u64 {
        match self.recompute {
            Recompute::Nothing => self.layers,
            Recompute::EachLayer => self.layers.min(1),
        }
    }
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
    let sets = w(shape.working_sets());
    let total = bt * c * (l + 9 * sets + 4)
        + bt * i * (2 * sets + 1)
        + bt * (4 * sets + 3)
        + scores * (sets + 1)
        + bt * v;
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
            recompute: Recompute::Nothing,
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

    #[test]
    fn recomputing_keeps_one_working_set_and_every_blocks_input() {
        // B=2, T=3, C=4, NH=2, I=16, V=10, L=5.
        let kept = CpuArenaShape {
            layers: 5,
            hidden: 4,
            heads: 2,
            intermediate: 16,
            vocab: 10,
            batch: 2,
            seq_len: 3,
            recompute: Recompute::Nothing,
        };
        let recomputed = CpuArenaShape {
            recompute: Recompute::EachLayer,
            ..kept
        };
        let (bt, btc, bti, scores) = (6, 24, 96, 2 * 2 * 9);
        // One working set: 9 BTC, 2 BTI, 4 BT, scores (its output is counted per block).
        let working_set = 9 * btc + 2 * bti + 4 * bt + scores;
        assert_eq!(
            arena_elements(&kept) - arena_elements(&recomputed),
            4 * working_set
        );
        // encoded + 5 block outputs; one working set; lnf; logits, losses; backward scratch.
        let expected = btc
            + 5 * btc
            + working_set
            + (btc + 2 * bt)
            + (bt * 10 + bt)
            + (2 * btc + bti + scores);
        assert_eq!(arena_elements(&recomputed), expected);
        let one_layer = CpuArenaShape { layers: 1, ..kept };
        assert_eq!(
            arena_elements(&one_layer),
            arena_elements(&CpuArenaShape {
                recompute: Recompute::EachLayer,
                ..one_layer
            }),
            "one block: the shared working set is its own"
        );
    }
}
