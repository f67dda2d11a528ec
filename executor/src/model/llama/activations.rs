//! [`LlamaActivations`]: every activation of one Llama forward/backward pass, in one arena.
//!
//! Forward keeps what backward needs; the rotation is applied in place (`qkv` holds the rotated
//! `q` and `k`: backward needs only the table), and the attention output projection and the
//! down projection add straight into the residual stream. Backward uses five scratch buffers
//! shared by all layers. `B` batch, `T` sequence, `C` hidden, `NH` heads, `QKV = (NH + 2 KV) *
//! hs`, `A = NH * hs`, `I` intermediate, `V` vocab.

use dsplan_planner::memory::{LlamaArenaShape, llama_arena_elements};

use super::config::LlamaConfig;
use crate::model::BatchShape;
use crate::tensor::{Span, TensorTable};

/// Elements of the activation arena for `config` and `shape`, as the planner sizes it
/// (`planner::memory::cpu_arena_llama`), so the `dsplan-cpu` plan lists what the model allocates.
pub fn planned_llama_arena_len(config: &LlamaConfig, shape: BatchShape) -> usize {
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
    });
    usize::try_from(elements).unwrap_or(usize::MAX)
}

/// What one decoder layer keeps for backward.
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
    /// Residual stream after the layer `(B, T, C)`.
    pub residual3: Span,
}

/// The arena layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaActivations {
    table: TensorTable,
    /// Token embeddings `(B, T, C)`.
    pub encoded: Span,
    /// One entry per layer.
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
    /// The arena layout for `config` and `shape`.
    pub fn new(config: &LlamaConfig, shape: BatchShape) -> Self {
        let (b, t, c) = (shape.batch, shape.seq_len, config.hidden_size);
        let (nh, v, i) = (
            config.num_attention_heads,
            config.vocab_size,
            config.intermediate_size,
        );
        let (a, qkv) = (config.q_width(), config.qkv_width());
        let mut table = TensorTable::new();
        let encoded = table.push("encoded", &[b, t, c]);
        let blocks = (0..config.num_hidden_layers)
            .map(|l| {
                let mut push =
                    |name: &str, dims: &[usize]| table.push(format!("layers.{l}.{name}"), dims);
                LlamaBlockActivations {
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
                    residual3: push("residual3", &[b, t, c]),
                }
            })
            .collect();
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
