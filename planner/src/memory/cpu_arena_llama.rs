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
    let total = bt * c * (4 * l + 4)
        + bt * (2 * l + 2)
        + l * bt * (qkv + a + 3 * i)
        + bt * qkv.max(2 * i)
        + bt * a.max(i)
        + scores * (l + 1)
        + bt * v;
    u64::try_from(total).unwrap_or(u64::MAX)
}
