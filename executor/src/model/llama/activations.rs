//! [`LlamaActivations`]: every activation of one Llama forward/backward pass, in one arena.
//!
//! Forward keeps what backward needs; the rotation is applied in place (`qkv` holds the rotated
//! `q` and `k`: backward needs only the table), and the attention output projection and the
//! down projection add straight into the residual stream. Backward uses five scratch buffers
//! shared by all layers. With activation checkpointing ([`Recompute::EachLayer`],
//! [`crate::model::recompute`]) forward keeps only each layer's output and all layers share
//! one working set, which backward refills by re-running the layer's forward. `B` batch, `T` sequence, `C` hidden, `NH` heads, `QKV = (NH + 2 KV) *
//! hs`, `A = NH * hs`, `I` intermediate, `V` vocab.

use dsplan_planner::memory::{LlamaArenaShape, llama_arena_elements};

use super::config::LlamaConfig;
use crate::model::BatchShape;
use crate::model::recompute::{Recompute, layer_sets};
use crate::tensor::{Span, TensorTable};

/// Elements of the activation arena for `config`, `shape` and `recompute`, as the planner sizes
/// it (`planner::memory::cpu_arena_llama`), so the `dsplan-cpu` plan lists what the model
/// allocates.
pub fn planned_llama_arena_len(
    config: &LlamaConfig,
    shape: BatchShape,
    recompute: Recompute,
) -> usize {
    let n = |x: usize| x as u64;
    let elements = llama_arena_elements(&LlamaArenaShape {
        layers: n(config.num_hidden_layers),
        hidden: n(config.hidden_size),
        heads: n(config.num_attention_heads),
        kv_heads: n(config.num_key_value_heads),
        head_dim: n(config.head_dim),
        intermediate: n(config.intermediate_size),
        vocab: n(config.vocab_size),
        batch: n(shape.batch),
        seq_len: n(shape.seq_len),
        recompute,
    });
    usize::try_from(elements).unwrap_or(usize::MAX)
}

/// What one decoder layer's backward reads: its working set (its own, or the one all layers
/// share under [`Recompute::EachLayer`]) and its output, which is its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LlamaBlockActivations {
    /// `input_layernorm` output `(B, T, C)`.
    pub ln1: Span,
    /// Its reciprocal RMS per row `(B, T)`.
    pub ln1_rstd: Span,
    /// `[q | k | v]` projections, `q` and `k` rotated `(B, T, QKV)`.
    pub qkv: Span,
    /// Attention probabilities `(B, NH, T, T)`.
    pub att: Span,
    /// Attention output, heads side by side `(B, T, A)`.
    pub atty: Span,
    /// Residual stream after attention `(B, T, C)`.
    pub residual2: Span,
    /// `post_attention_layernorm` output `(B, T, C)`.
    pub ln2: Span,
    /// Its reciprocal RMS `(B, T)`.
    pub ln2_rstd: Span,
    /// `[gate | up]` projections `(B, T, 2I)`.
    pub gate_up: Span,
    /// `silu(gate) * up` `(B, T, I)`.
    pub swiglu: Span,
    /// Residual stream after the layer `(B, T, C)`: the next layer's input, kept under
    /// either mode.
    pub residual3: Span,
}

impl LlamaBlockActivations {
    /// Pushes one working set (every span but `residual3`, which the caller pushes) under
    /// `prefix`.
    fn working_set(
        table: &mut TensorTable,
        prefix: &str,
        config: &LlamaConfig,
        shape: BatchShape,
    ) -> Self {
        let (b, t, c) = (shape.batch, shape.seq_len, config.hidden_size);
        let (nh, i) = (config.num_attention_heads, config.intermediate_size);
        let (a, qkv) = (config.q_width(), config.qkv_width());
        let mut push = |name: &str, dims: &[usize]| table.push(format!("{prefix}.{name}"), dims);
        Self {
            ln1: push("ln1", &[b, t, c]),
            ln1_rstd: push("ln1_rstd", &[b, t]),
            qkv: push("qkv", &[b, t, qkv]),
            att: push("att", &[b, nh, t, t]),
            atty: push("atty", &[b, t, a]),
            residual2: push("residual2", &[b, t, c]),
            ln2: push("ln2", &[b, t, c]),
            ln2_rstd: push("ln2_rstd", &[b, t]),
            gate_up: push("gate_up", &[b, t, 2 * i]),
            swiglu: push("swiglu", &[b, t, i]),
            residual3: Span::new(0, 0),
        }
    }
}

/// The arena layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaActivations {
    table: TensorTable,
    /// What forward keeps of each layer.
    pub recompute: Recompute,
    /// Token embeddings `(B, T, C)`.
    pub encoded: Span,
    /// One entry per layer (under [`Recompute::EachLayer`] all share one working set).
    pub blocks: Vec<LlamaBlockActivations>,
    /// `model.norm` output `(B, T, C)`.
    pub lnf: Span,
    /// Its reciprocal RMS `(B, T)`.
    pub lnf_rstd: Span,
    /// Logits `(B, T, V)`; after a training forward, their gradient.
    pub logits: Span,
    /// Per-position cross-entropy `(B, T)`.
    pub losses: Span,
    /// Backward: gradient of the residual stream `(B, T, C)`.
    pub dresidual: Span,
    /// Backward scratch `(B, T, C)`.
    pub dbtc: Span,
    /// Backward scratch `(B, T, max(QKV, 2I))`: `dqkv` or `dgate_up`.
    pub dwide: Span,
    /// Backward scratch `(B, T, max(A, I))`: `datty` or `dswiglu`.
    pub dmid: Span,
    /// Backward scratch for attention scores `(B, NH, T, T)`.
    pub datt: Span,
}

impl LlamaActivations {
    /// The arena layout for `config` and `shape`, keeping each layer's working set or
    /// recomputing it as `recompute` says.
    pub fn new(config: &LlamaConfig, shape: BatchShape, recompute: Recompute) -> Self {
        let (b, t, c) = (shape.batch, shape.seq_len, config.hidden_size);
        let (nh, v, i) = (
            config.num_attention_heads,
            config.vocab_size,
            config.intermediate_size,
        );
        let (a, qkv) = (config.q_width(), config.qkv_width());
        let mut table = TensorTable::new();
        let encoded = table.push("encoded", &[b, t, c]);
        let blocks = layer_sets(
            &mut table,
            config.num_hidden_layers,
            recompute,
            |table, prefix| LlamaBlockActivations::working_set(table, prefix, config, shape),
            |table, l| table.push(format!("h.{l}.residual3"), &[b, t, c]),
            |set, residual3| LlamaBlockActivations { residual3, ..set },
        );
        let lnf = table.push("lnf", &[b, t, c]);
        let lnf_rstd = table.push("lnf_rstd", &[b, t]);
        let logits = table.push("logits", &[b, t, v]);
        let losses = table.push("losses", &[b, t]);
        let dresidual = table.push("dresidual", &[b, t, c]);
        let dbtc = table.push("dbtc", &[b, t, c]);
        let dwide = table.push("dwide", &[b, t, qkv.max(2 * i)]);
        let dmid = table.push("dmid", &[b, t, a.max(i)]);
        let datt = table.push("datt", &[b, nh, t, t]);
        Self {
            table,
            recompute,
            encoded,
            blocks,
            lnf,
            lnf_rstd,
            logits,
            losses,
            dresidual,
            dbtc,
            dwide,
            dmid,
            datt,
        }
    }

    /// Every buffer with its name and shape, in arena order.
    pub fn table(&self) -> &TensorTable {
        &self.table
    }

    /// Elements of the arena.
    pub fn total_len(&self) -> usize {
        self.table.total_len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::llama::{AttentionBias, LlamaFamily};
    use crate::model::rope::{Rope, RopeScaling};
    use dsplan_planner::model::Embeddings;

    #[test]
    fn the_layout_fills_the_planned_arena_exactly() {
        // (layers, hidden, heads, kv heads, head dim, intermediate, vocab): GQA with a narrow
        // MLP (dwide holds dqkv), MHA with a wide one, one layer.
        for (layers, hidden, heads, kv_heads, head_dim, intermediate, vocab) in [
            (2, 16, 4, 2, 4, 40, 50),
            (3, 24, 3, 3, 8, 20, 97),
            (1, 8, 2, 1, 4, 16, 11),
        ] {
            let config = LlamaConfig {
                family: LlamaFamily::Llama,
                vocab_size: vocab,
                max_position_embeddings: 64,
                hidden_size: hidden,
                num_hidden_layers: layers,
                num_attention_heads: heads,
                num_key_value_heads: kv_heads,
                head_dim,
                intermediate_size: intermediate,
                rms_norm_eps: 1e-6,
                rope: Rope {
                    theta: 10_000.0,
                    scaling: RopeScaling::Default,
                },
                attention_bias: AttentionBias::Absent,
                embeddings: Embeddings::Untied,
                sliding_window: None,
            };
            for (batch, seq_len) in [(1, 1), (2, 16)] {
                let shape = BatchShape { batch, seq_len };
                let kept = LlamaActivations::new(&config, shape, Recompute::Nothing);
                let shared = LlamaActivations::new(&config, shape, Recompute::EachLayer);
                for (layout, recompute) in
                    [(&kept, Recompute::Nothing), (&shared, Recompute::EachLayer)]
                {
                    assert_eq!(
                        layout.total_len(),
                        planned_llama_arena_len(&config, shape, recompute),
                        "L={layers} C={hidden} KV={kv_heads} B={batch} T={seq_len} {recompute:?}"
                    );
                }
                assert!(shared.blocks.windows(2).all(|w| w[0].ln1 == w[1].ln1));
                assert!(
                    shared
                        .blocks
                        .windows(2)
                        .all(|w| w[0].residual3 != w[1].residual3)
                );
                if layers > 1 {
                    assert!(shared.total_len() < kept.total_len());
                }
            }
        }
    }
}
