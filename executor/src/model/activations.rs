//! [`ActivationLayout`]: every activation of one forward/backward pass, in one arena.
//!
//! Sized from the config and the batch shape `(B, T)`; nothing is allocated during a pass. The
//! arena's size is the planner's ([`planned_arena_len`], `planner::memory::cpu_arena`), so the
//! `dsplan-cpu` plan lists exactly what the model allocates; the layout must fill it.
//! Forward keeps what backward needs (llm.c's list) for every block, or, with activation
//! checkpointing ([`Recompute::EachLayer`], [`super::recompute`]), only each block's output
//! and one working set that every block shares and backward refills by recomputation;
//! backward needs only four scratch buffers, shared by all layers, because the gradient of
//! the residual stream is carried in one `(B, T, C)` buffer from the top of the model to the
//! bottom.
//!
//! Vocabulary: `B` batch, `T` sequence, `C` channels, `NH` heads, `V` vocab, `L` layers.

use dsplan_planner::memory::{CpuArenaShape, arena_elements};

use super::Gpt2Config;
use super::recompute::{Recompute, layer_sets};
use crate::tensor::{Span, TensorTable};

/// Elements of the activation arena for `config`, `shape` and `recompute`, as the planner
/// sizes it (`planner::memory::cpu_arena`; GPT-2's MLP is `4C` wide).
pub fn planned_arena_len(config: &Gpt2Config, shape: BatchShape, recompute: Recompute) -> usize {
    let n = |x: usize| x as u64;
    let elements = arena_elements(&CpuArenaShape {
        layers: n(config.n_layer),
        hidden: n(config.n_embd),
        heads: n(config.n_head),
        intermediate: 4 * n(config.n_embd),
        vocab: n(config.vocab_size),
        batch: n(shape.batch),
        seq_len: n(shape.seq_len),
        recompute,
    });
    usize::try_from(elements).unwrap_or(usize::MAX)
}

/// The batch a model instance is sized for: `batch` rows of `seq_len` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchShape {
    /// `B`, sequences per micro-batch.
    pub batch: usize,
    /// `T`, tokens per sequence (at most `n_positions`).
    pub seq_len: usize,
}

impl BatchShape {
    /// Tokens in the batch, `B * T`.
    pub const fn tokens(&self) -> usize {
        self.batch * self.seq_len
    }
}

/// The activations one transformer block's backward reads: its working set (its own, or the
/// one all blocks share under [`Recompute::EachLayer`]) and its output, which is its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockActivations {
    /// `ln_1` output `(B, T, C)`.
    pub ln1: Span,
    /// `ln_1` mean per row `(B, T)`.
    pub ln1_mean: Span,
    /// `ln_1` reciprocal standard deviation per row `(B, T)`.
    pub ln1_rstd: Span,
    /// `c_attn` output `(B, T, 3C)`, columns `[q | k | v]`.
    pub qkv: Span,
    /// Attention probabilities `(B, NH, T, T)`, zero above the diagonal.
    pub att: Span,
    /// Attention output, heads side by side `(B, T, C)`.
    pub atty: Span,
    /// Attention `c_proj` output `(B, T, C)`.
    pub attproj: Span,
    /// Residual stream after attention `(B, T, C)`.
    pub residual2: Span,
    /// `ln_2` output `(B, T, C)`.
    pub ln2: Span,
    /// `ln_2` mean `(B, T)`.
    pub ln2_mean: Span,
    /// `ln_2` reciprocal standard deviation `(B, T)`.
    pub ln2_rstd: Span,
    /// `c_fc` output, GELU input `(B, T, 4C)`.
    pub fch: Span,
    /// GELU output `(B, T, 4C)`.
    pub fch_gelu: Span,
    /// MLP `c_proj` output `(B, T, C)`.
    pub fcproj: Span,
    /// Residual stream after the block `(B, T, C)`: the next block's input, kept under
    /// either mode.
    pub residual3: Span,
}

impl BlockActivations {
    /// Pushes one working set (every span but `residual3`, which `output` gives) under
    /// `prefix`.
    fn working_set(table: &mut TensorTable, prefix: &str, dims: [usize; 4]) -> Self {
        let [b, t, c, nh] = dims;
        let mut push = |name: &str, dims: &[usize]| table.push(format!("{prefix}.{name}"), dims);
        Self {
            ln1: push("ln1", &[b, t, c]),
            ln1_mean: push("ln1_mean", &[b, t]),
            ln1_rstd: push("ln1_rstd", &[b, t]),
            qkv: push("qkv", &[b, t, 3 * c]),
            att: push("att", &[b, nh, t, t]),
            atty: push("atty", &[b, t, c]),
            attproj: push("attproj", &[b, t, c]),
            residual2: push("residual2", &[b, t, c]),
            ln2: push("ln2", &[b, t, c]),
            ln2_mean: push("ln2_mean", &[b, t]),
            ln2_rstd: push("ln2_rstd", &[b, t]),
            fch: push("fch", &[b, t, 4 * c]),
            fch_gelu: push("fch_gelu", &[b, t, 4 * c]),
            fcproj: push("fcproj", &[b, t, c]),
            residual3: Span::new(0, 0),
        }
    }
}

/// The layout of the activation arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivationLayout {
    table: TensorTable,
    /// What forward keeps of each block.
    pub recompute: Recompute,
    /// Embeddings `wte[tokens] + wpe[positions]` `(B, T, C)`.
    pub encoded: Span,
    /// One entry per block (under [`Recompute::EachLayer`] all share one working set).
    pub blocks: Vec<BlockActivations>,
    /// `ln_f` output `(B, T, C)`.
    pub lnf: Span,
    /// `ln_f` mean `(B, T)`.
    pub lnf_mean: Span,
    /// `ln_f` reciprocal standard deviation `(B, T)`.
    pub lnf_rstd: Span,
    /// Logits `(B, T, V)`; after a training forward, the gradient of the loss w.r.t. them.
    pub logits: Span,
    /// Per-position cross-entropy `(B, T)` (0 where there is no target).
    pub losses: Span,
    /// Backward: gradient of the residual stream `(B, T, C)`.
    pub dresidual: Span,
    /// Backward scratch `(B, T, C)`.
    pub dbtc: Span,
    /// Backward scratch `(B, T, 4C)`; also holds `dqkv` `(B, T, 3C)`.
    pub dbt4c: Span,
    /// Backward scratch for attention scores `(B, NH, T, T)`.
    pub datt: Span,
}

impl ActivationLayout {
    /// The arena layout for `config` and `shape` (both validated by the caller), keeping
    /// each block's working set or recomputing it as `recompute` says.
    pub fn new(config: &Gpt2Config, shape: BatchShape, recompute: Recompute) -> Self {
        let (b, t, c) = (shape.batch, shape.seq_len, config.n_embd);
        let (nh, v) = (config.n_head, config.vocab_size);
        let mut table = TensorTable::new();
        let encoded = table.push("encoded", &[b, t, c]);
        let blocks = layer_sets(
            &mut table,
            config.n_layer,
            recompute,
            |table, prefix| BlockActivations::working_set(table, prefix, [b, t, c, nh]),
            |table, l| table.push(format!("h.{l}.residual3"), &[b, t, c]),
            |set, residual3| BlockActivations { residual3, ..set },
        );
        let lnf = table.push("lnf", &[b, t, c]);
        let lnf_mean = table.push("lnf_mean", &[b, t]);
        let lnf_rstd = table.push("lnf_rstd", &[b, t]);
        let logits = table.push("logits", &[b, t, v]);
        let losses = table.push("losses", &[b, t]);
        let dresidual = table.push("dresidual", &[b, t, c]);
        let dbtc = table.push("dbtc", &[b, t, c]);
        let dbt4c = table.push("dbt4c", &[b, t, 4 * c]);
        let datt = table.push("datt", &[b, nh, t, t]);
        Self {
            table,
            recompute,
            encoded,
            blocks,
            lnf,
            lnf_mean,
            lnf_rstd,
            logits,
            losses,
            dresidual,
            dbtc,
            dbt4c,
            datt,
        }
    }

    /// Every activation buffer with its name and shape, in arena order.
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

    #[test]
    fn the_layout_fills_the_planned_arena_exactly() {
        for (n_layer, n_embd, n_head, vocab_size) in [
            (1, 8, 2, 11),
            (2, 16, 4, 50),
            (3, 24, 3, 97),
            (12, 768, 12, 50257),
        ] {
            let config = Gpt2Config {
                vocab_size,
                n_positions: 64,
                n_embd,
                n_layer,
                n_head,
                layer_norm_epsilon: 1e-5,
            };
            for (batch, seq_len) in [(1, 1), (2, 16), (3, 64)] {
                let shape = BatchShape { batch, seq_len };
                for recompute in [Recompute::Nothing, Recompute::EachLayer] {
                    assert_eq!(
                        ActivationLayout::new(&config, shape, recompute).total_len(),
                        planned_arena_len(&config, shape, recompute),
                        "L={n_layer} C={n_embd} NH={n_head} V={vocab_size} B={batch} T={seq_len} {recompute:?}"
                    );
                }
            }
        }
    }
}
