//! The backward pass of [`LlamaCore`]: the forward layers in reverse, each accumulating its
//! parameter gradients into its unit's gradient buffer; the residual stream's gradient is
//! carried in one buffer. Under activation checkpointing each layer's forward is re-run from
//! its saved input just before its backward ([`crate::model::recompute`]).

use super::LlamaCore;
use crate::model::attention::grouped_attention_backward;
use crate::model::classifier::logits_backward;
use crate::model::embedding::embedding_backward;
use crate::model::gemm::Accumulate;
use crate::model::linear::linear_backward;
use crate::model::recompute::layers_backward;
use crate::model::rmsnorm::rmsnorm_backward;
use crate::model::rope::rope_backward_at;
use crate::model::swiglu::swiglu_backward;
use crate::model::units::{ParamSource, ParamUnit, UnitGrads, UnitParams};
use crate::tensor::{Span, split_spans_mut};

impl LlamaCore {
    /// Backward through the whole model with parameters and gradient buffers from `source`:
    /// adds the gradient of (`grad_scale` times) the last training forward's loss to them,
    /// telling `source` when each unit's gradients are complete.
    ///
    /// Order of calls: the head (`FinalNorm`, and `Embedding` when tied) first, the layers
    /// from the last, then the embedding lookup's gradient.
    pub fn backward_with<S: ParamSource>(&mut self, source: &mut S) -> Result<(), S::Error> {
        // The logits buffer is used up by backward (it holds dlogits).
        self.arena.start_backward()?;
        let al = &self.act_layout;
        al.dresidual.of_mut(&mut self.arena.acts).fill(0.0);
        let last_residual = al.blocks.last().map_or(al.encoded, |a| a.residual3);

        let (embedding, head) = (ParamUnit::Embedding, ParamUnit::FinalNorm);
        source.fetch(head)?;
        if self.param_layout.tied() {
            source.fetch(embedding)?;
            {
                let base = self.unit_spans.span(embedding).offset;
                let (p, g) = source.params_and_grads(embedding);
                self.classifier_backward(UnitParams::new(base, p), UnitGrads::new(base, g));
            }
            source.release(embedding)?;
            let base = self.unit_spans.span(head).offset;
            let (p, g) = source.params_and_grads(head);
            self.final_norm_backward(
                last_residual,
                UnitParams::new(base, p),
                UnitGrads::new(base, g),
            );
        } else {
            let base = self.unit_spans.span(head).offset;
            let (p, g) = source.params_and_grads(head);
            self.classifier_backward(UnitParams::new(base, p), UnitGrads::new(base, &mut *g));
            self.final_norm_backward(
                last_residual,
                UnitParams::new(base, p),
                UnitGrads::new(base, g),
            );
        }
        source.release(head)?;
        source.grads_ready(head)?;

        layers_backward(self, source)?;

        {
            let base = self.unit_spans.span(embedding).offset;
            let mut g = UnitGrads::new(base, source.grads(embedding));
            let [dembed] = g.split([self.param_layout.embed]);
            embedding_backward(
                dembed,
                self.act_layout.dresidual.of(&self.arena.acts),
                &self.tokens,
            );
        }
        source.grads_ready(embedding)?;
        Ok(())
    }

    /// `lm_head`: `dlnf = dlogits @ W`, `dW += dlogits^T @ lnf` (`dlnf` into `dbtc`).
    fn classifier_backward(&mut self, p: UnitParams<'_>, mut g: UnitGrads<'_>) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let [dw] = g.split([pl.lm_head]);
        let [dlnf, dlogits, lnf] =
            split_spans_mut(&mut self.arena.acts, [al.dbtc, al.logits, al.lnf]);
        logits_backward(
            dlnf,
            dw,
            dlogits,
            lnf,
            p.of(pl.lm_head),
            self.config.hidden_size,
        );
    }

    /// The final norm: from `dlnf` (in `dbtc`) into the residual stream's gradient.
    fn final_norm_backward(
        &mut self,
        last_residual: Span,
        p: UnitParams<'_>,
        mut g: UnitGrads<'_>,
    ) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let [dres, dlnf, res, rstd] = split_spans_mut(
            &mut self.arena.acts,
            [al.dresidual, al.dbtc, last_residual, al.lnf_rstd],
        );
        let [dw] = g.split([pl.norm]);
        rmsnorm_backward(dres, dw, dlnf, res, p.of(pl.norm), rstd);
    }

    /// Where layer `l`'s input lives: the embeddings, or the previous layer's output.
    pub(super) fn block_input(&self, l: usize) -> Span {
        let al = &self.act_layout;
        match l.checked_sub(1) {
            Some(previous) => al.blocks[previous].residual3,
            None => al.encoded,
        }
    }

    /// Layer `l` in reverse; `dresidual` holds the gradient of its output on entry and of its
    /// input on exit.
    pub(super) fn block_backward(&mut self, l: usize, p: UnitParams<'_>, mut g: UnitGrads<'_>) {
        let cfg = &self.config;
        let (c, inner) = (cfg.hidden_size, cfg.intermediate_size);
        let (qw, kvw, width) = (cfg.q_width(), cfg.kv_width(), cfg.qkv_width());
        let (kv_heads, heads) = (cfg.num_key_value_heads, cfg.num_attention_heads);
        let dims = self.attention_dims();
        let n = self.shape.tokens();
        let al = &self.act_layout;
        let dgate_up = Span::new(al.dwide.offset, n * 2 * inner);
        let dqkv = Span::new(al.dwide.offset, n * width);
        let dswiglu = Span::new(al.dmid.offset, n * inner);
        let datty = Span::new(al.dmid.offset, n * qw);
        let (a, w) = (&al.blocks[l], &self.param_layout.blocks[l]);
        let residual = self.block_input(l);
        let acts = &mut self.arena.acts;

        // MLP: residual3 = residual2 + down(swiglu(gate_up(ln2(residual2)))).
        let [dsw, dres, sw] = split_spans_mut(acts, [dswiglu, al.dresidual, a.swiglu]);
        let [dw] = g.split([w.down_weight]);
        let mode = Accumulate::Overwrite;
        linear_backward(dsw, mode, dw, None, dres, c, sw, p.of(w.down_weight), inner);
        let [dgu, dsw, gu] = split_spans_mut(acts, [dgate_up, dswiglu, a.gate_up]);
        swiglu_backward(dgu, dsw, gu, inner);
        let [dln2, dgu, ln2] = split_spans_mut(acts, [al.dbtc, dgate_up, a.ln2]);
        for (column, weight, mode) in [
            (0, w.gate_weight, Accumulate::Overwrite),
            (inner, w.up_weight, Accumulate::Add),
        ] {
            let [dw] = g.split([weight]);
            let dout = &dgu[column..];
            linear_backward(dln2, mode, dw, None, dout, 2 * inner, ln2, p.of(weight), c);
        }
        let [dres, dln2, res2, rstd] =
            split_spans_mut(acts, [al.dresidual, al.dbtc, a.residual2, a.ln2_rstd]);
        let [dw] = g.split([w.post_attention_norm]);
        rmsnorm_backward(dres, dw, dln2, res2, p.of(w.post_attention_norm), rstd);

        // Attention: residual2 = residual + o_proj(attn(rope(qkv(ln1(residual))))).
        let [datty_buf, dres, atty] = split_spans_mut(acts, [datty, al.dresidual, a.atty]);
        match w.o_bias {
            Some(bias) => {
                let [dw, db] = g.split([w.o_weight, bias]);
                linear_backward(
                    datty_buf,
                    mode,
                    dw,
                    Some(db),
                    dres,
                    c,
                    atty,
                    p.of(w.o_weight),
                    qw,
                );
            }
            None => {
                let [dw] = g.split([w.o_weight]);
                linear_backward(
                    datty_buf,
                    mode,
                    dw,
                    None,
                    dres,
                    c,
                    atty,
                    p.of(w.o_weight),
                    qw,
                );
            }
        }
        let [dqkv_buf, datt, datty_buf, qkv, att] =
            split_spans_mut(acts, [dqkv, al.datt, datty, a.qkv, a.att]);
        grouped_attention_backward(dqkv_buf, datt, datty_buf, qkv, att, dims, kv_heads);
        let positions = self.layout.positions();
        rope_backward_at(dqkv_buf, width, heads + kv_heads, &self.rope, positions);
        let [dln1, dqkv_buf, ln1] = split_spans_mut(acts, [al.dbtc, dqkv, a.ln1]);
        for (column, weight, bias, mode) in [
            (0, w.q_weight, w.q_bias, Accumulate::Overwrite),
            (qw, w.k_weight, w.k_bias, Accumulate::Add),
            (qw + kvw, w.v_weight, w.v_bias, Accumulate::Add),
        ] {
            let dout = &dqkv_buf[column..];
            match bias {
                Some(bias) => {
                    let [dw, db] = g.split([weight, bias]);
                    linear_backward(dln1, mode, dw, Some(db), dout, width, ln1, p.of(weight), c);
                }
                None => {
                    let [dw] = g.split([weight]);
                    linear_backward(dln1, mode, dw, None, dout, width, ln1, p.of(weight), c);
                }
            }
        }
        let [dres, dln1, res, rstd] =
            split_spans_mut(acts, [al.dresidual, al.dbtc, residual, a.ln1_rstd]);
        let [dw] = g.split([w.input_norm]);
        rmsnorm_backward(dres, dw, dln1, res, p.of(w.input_norm), rstd);
    }
}
