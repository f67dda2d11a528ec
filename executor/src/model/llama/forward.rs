//! The forward pass of [`LlamaCore`]: embedding, `L` layers, final norm, logits, one parameter
//! unit at a time.

use super::LlamaCore;
use crate::model::attention::masked_attention_forward;
use crate::model::classifier::logits_forward;
use crate::model::embedding::embedding_forward;
use crate::model::gemm::Accumulate;
use crate::model::linear::linear_forward;
use crate::model::recompute::layers_forward;
use crate::model::rmsnorm::rmsnorm_forward;
use crate::model::rope::rope_forward_at;
use crate::model::swiglu::swiglu_forward;
use crate::model::units::{ParamSource, ParamUnit, UnitParams};
use crate::tensor::{Span, split_spans_mut};

impl LlamaCore {
    /// Forward up to and including the logits (tokens already checked).
    pub(super) fn run_forward<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
    ) -> Result<(), S::Error> {
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);

        let embedding = ParamUnit::Embedding;
        source.fetch(embedding)?;
        {
            let p = self.unit_spans.view(source, embedding);
            let [encoded] = split_spans_mut(&mut self.arena.acts, [self.act_layout.encoded]);
            embedding_forward(encoded, tokens, p.of(self.param_layout.embed));
        }
        source.release(embedding)?;

        let residual = layers_forward(self, source, self.act_layout.encoded)?;

        let head = ParamUnit::FinalNorm;
        source.fetch(head)?;
        let tied = self.param_layout.tied();
        if tied {
            source.fetch(embedding)?;
        }
        let lm_head_unit = if tied { embedding } else { head };
        self.head_forward(
            residual,
            self.unit_spans.view(source, head),
            self.unit_spans.view(source, lm_head_unit),
        );
        source.release(head)?;
        if tied {
            source.release(embedding)?;
        }
        Ok(())
    }

    /// Layer `l` on the residual stream at `residual` (its input); returns where its output
    /// lives. Backward calls it again to recompute the layer from its saved input
    /// ([`crate::model::recompute`]).
    pub(super) fn block_forward(&mut self, l: usize, residual: Span, p: UnitParams<'_>) -> Span {
        let cfg = &self.config;
        let (c, inner) = (cfg.hidden_size, cfg.intermediate_size);
        let (qw, kvw, width) = (cfg.q_width(), cfg.kv_width(), cfg.qkv_width());
        let eps = cfg.rms_norm_eps;
        let (kv_heads, heads) = (cfg.num_key_value_heads, cfg.num_attention_heads);
        let dims = self.attention_dims();
        let (a, w) = (&self.act_layout.blocks[l], &self.param_layout.blocks[l]);
        let acts = &mut self.arena.acts;
        let bias = |span: Option<Span>| span.map(|s| p.of(s));
        let layout = &self.layout;

        let [ln1, rstd, res] = split_spans_mut(acts, [a.ln1, a.ln1_rstd, residual]);
        rmsnorm_forward(ln1, rstd, res, p.of(w.input_norm), eps);
        let [qkv, ln1] = split_spans_mut(acts, [a.qkv, a.ln1]);
        for (column, weight, b) in [
            (0, w.q_weight, w.q_bias),
            (qw, w.k_weight, w.k_bias),
            (qw + kvw, w.v_weight, w.v_bias),
        ] {
            let out = &mut qkv[column..];
            linear_forward(
                out,
                width,
                Accumulate::Overwrite,
                ln1,
                p.of(weight),
                bias(b),
                c,
            );
        }
        rope_forward_at(qkv, width, heads + kv_heads, &self.rope, layout.positions());
        let [atty, att, qkv] = split_spans_mut(acts, [a.atty, a.att, a.qkv]);
        masked_attention_forward(atty, att, qkv, dims, kv_heads, layout.mask());
        let [res2, res, atty] = split_spans_mut(acts, [a.residual2, residual, a.atty]);
        res2.copy_from_slice(res);
        linear_forward(
            res2,
            c,
            Accumulate::Add,
            atty,
            p.of(w.o_weight),
            bias(w.o_bias),
            qw,
        );

        let [ln2, rstd, res2] = split_spans_mut(acts, [a.ln2, a.ln2_rstd, a.residual2]);
        rmsnorm_forward(ln2, rstd, res2, p.of(w.post_attention_norm), eps);
        let [gate_up, ln2] = split_spans_mut(acts, [a.gate_up, a.ln2]);
        for (column, weight) in [(0, w.gate_weight), (inner, w.up_weight)] {
            let out = &mut gate_up[column..];
            linear_forward(
                out,
                2 * inner,
                Accumulate::Overwrite,
                ln2,
                p.of(weight),
                None,
                c,
            );
        }
        let [swiglu, gate_up] = split_spans_mut(acts, [a.swiglu, a.gate_up]);
        swiglu_forward(swiglu, gate_up, inner);
        let [res3, res2, swiglu] = split_spans_mut(acts, [a.residual3, a.residual2, a.swiglu]);
        res3.copy_from_slice(res2);
        linear_forward(
            res3,
            c,
            Accumulate::Add,
            swiglu,
            p.of(w.down_weight),
            None,
            inner,
        );
        a.residual3
    }

    /// The final norm on the last residual stream, then the logits through `lm_head`.
    fn head_forward(&mut self, residual: Span, norm: UnitParams<'_>, head: UnitParams<'_>) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let acts = &mut self.arena.acts;
        let [lnf, rstd, res] = split_spans_mut(acts, [al.lnf, al.lnf_rstd, residual]);
        rmsnorm_forward(lnf, rstd, res, norm.of(pl.norm), self.config.rms_norm_eps);
        let [logits, lnf] = split_spans_mut(acts, [al.logits, al.lnf]);
        logits_forward(logits, lnf, head.of(pl.lm_head), self.config.hidden_size);
    }
}
