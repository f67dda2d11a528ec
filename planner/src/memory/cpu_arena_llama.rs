//! The activation arena of dsplan's CPU Llama-family decoder (Llama, Qwen2, Mistral): one `f32`
//! buffer per rank, the executor's `LlamaActivations` exactly. The rotation is applied in
//! place, and the attention output and down projections add straight into the residual
//! stream, so there is no projection output buffer. With `B` sequences of `T` tokens, width
//! `C`, `NH` query heads of `hs`, `A = NH·hs`, `QKV = (NH + 2·KV)·hs`, MLP width `I`,
//! vocabulary `V`, `L` layers:
//!
//! | buffer | elements |
//! |---|---|
//! | embeddings output | `BTC` |
//! | per layer: two norm outputs, two residuals | `4·BTC` |
//! | per layer: two norms' reciprocal RMS | `2·BT` |
//! | per layer: `[q | k | v]` (rotated), attention output | `BT·QKV + BT·A` |
//! | per layer: `[gate | up]`, SwiGLU output | `3·BTI` |
//! | per layer: attention probabilities | `B·NH·T²` |
//! | final norm output and reciprocal RMS | `BTC + BT` |
//! | logits (their gradient after the loss), per-position losses | `BTV + BT` |
//! | backward: residual-stream gradient, `(B,T,C)` scratch | `2·BTC` |
//! | backward: `(B,T,max(QKV, 2I))` and `(B,T,max(A, I))` scratch, attention-score scratch | `BT·max(QKV,2I) + BT·max(A,I) + B·NH·T²` |
//!
//! A layer's output (the residual stream after it, the next layer's input, `BTC`) is its own
//! under either mode; the rest of a layer's rows above is its *working set*
//! (`3·BTC + 2·BT + BT·(QKV + A + 3I) + B·NH·T²`). Without recomputation every layer has its
//! own (`S = L` sets); with activation checkpointing ([`Recompute::EachLayer`]) all layers
//! share one (`S = 1`) and backward re-runs each layer's forward into it, as for GPT-2
//! ([`super::cpu_arena`]).
//!
//! Total: `BTC·(L + 3S + 4) + BT·(2S + 2) + S·BT·(QKV + A + 3I) + BT·max(QKV,2I) + BT·max(A,I)
//! + B·NH·T²·(S + 1) + BTV`.

use super::cpu_arena::Recompute;

/// The dimensions the Llama arena depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaArenaShape {
    /// Layers `L`.
    pub layers: u64,
    /// Model width `C`.
    pub hidden: u64,
    /// Query heads `NH`.
    pub heads: u64,
    /// Key/value heads `KV`.
    pub kv_heads: u64,
    /// Head width `hs`.
    pub head_dim: u64,
    /// MLP width `I`.
    pub intermediate: u64,
    /// Vocabulary `V`.
    pub vocab: u64,
    /// Sequences per micro-batch `B`.
    pub batch: u64,
    /// Tokens per sequence `T`.
    pub seq_len: u64,
    /// What forward keeps of each layer.
    pub recompute: Recompute,
}

impl LlamaArenaShape {
    /// Layer working sets in the arena, `S`: one per layer, or one shared by all.
    pub fn working_sets(&self) -> u64 {
        match self.recompute {
            Recompute::Nothing => self.layers,
            Recompute::EachLayer => self.layers.min(1),
        }
    }
}

/// Elements of the arena (see the [module documentation](self)); saturates at `u64::MAX`.
pub fn llama_arena_elements(shape: &LlamaArenaShape) -> u64 {
    let w = |x: u64| u128::from(x);
    let (l, c, nh, i, v) = (
        w(shape.layers),
        w(shape.hidden),
        w(shape.heads),
        w(shape.intermediate),
        w(shape.vocab),
    );
    let a = nh * w(shape.head_dim);
    let qkv = (nh + 2 * w(shape.kv_heads)) * w(shape.head_dim);
    let bt = w(shape.batch) * w(shape.seq_len);
    let scores = w(shape.batch) * nh * w(shape.seq_len) * w(shape.seq_len);
    let sets = w(shape.working_sets());
    let total = bt * c * (l + 3 * sets + 4)
        + bt * (2 * sets + 2)
        + sets * bt * (qkv + a + 3 * i)
        + bt * qkv.max(2 * i)
        + bt * a.max(i)
        + scores * (sets + 1)
        + bt * v;
    u64::try_from(total).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recomputing_keeps_one_working_set_and_every_layers_output() {
        // B=2, T=3, C=4, NH=2, KV=1, hs=2 (A=4, QKV=8), I=6, V=10, L=5.
        let kept = LlamaArenaShape {
            layers: 5,
            hidden: 4,
            heads: 2,
            kv_heads: 1,
            head_dim: 2,
            intermediate: 6,
            vocab: 10,
            batch: 2,
            seq_len: 3,
            recompute: Recompute::Nothing,
        };
        let recomputed = LlamaArenaShape {
            recompute: Recompute::EachLayer,
            ..kept
        };
        let (bt, btc, scores) = (6, 24, 2 * 2 * 9);
        // ln1, residual2, ln2; two rstd; qkv, atty, gate_up, swiglu; probabilities.
        let working_set = 3 * btc + 2 * bt + bt * (8 + 4 + 3 * 6) + scores;
        assert_eq!(
            llama_arena_elements(&kept) - llama_arena_elements(&recomputed),
            4 * working_set
        );
        // encoded + 5 layer outputs; one working set; norm and rstd; logits, losses;
        // dresidual, dbtc, dwide (max(8, 12)), dmid (max(4, 6)), datt.
        let expected = btc
            + 5 * btc
            + working_set
            + (btc + bt)
            + (bt * 10 + bt)
            + (2 * btc + bt * 12 + bt * 6 + scores);
        assert_eq!(llama_arena_elements(&recomputed), expected);
        let one_layer = LlamaArenaShape { layers: 1, ..kept };
        assert_eq!(
            llama_arena_elements(&one_layer),
            llama_arena_elements(&LlamaArenaShape {
                recompute: Recompute::EachLayer,
                ..one_layer
            }),
            "one layer: the shared working set is its own"
        );
    }
}
