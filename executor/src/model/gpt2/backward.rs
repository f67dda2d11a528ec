//! The backward pass of [`Gpt2Core`]: the forward layers in reverse, each layer's `*_backward`
//! accumulating its parameter gradients into its unit's gradient buffer, the residual stream's
//! gradient carried in one buffer. Under activation checkpointing each block's forward is
//! re-run from its saved input just before its backward ([`crate::model::recompute`]).

use super::{Gpt2Core, attention_dims};
use crate::model::attention::attention_backward;
use crate::model::classifier::logits_backward;
use crate::model::encoder::encoder_backward;
use crate::model::gelu::gelu_backward_inplace;
use crate::model::layernorm::layernorm_backward;
use crate::model::matmul::matmul_backward;
use crate::model::recompute::layers_backward;
use crate::model::units::{ParamSource, ParamUnit, UnitGrads, UnitParams};
use crate::tensor::{Span, split_spans_mut};

impl Gpt2Core {
    /// Backward through the whole model with parameters and gradient buffers from `source`:
    /// adds the gradient of (`grad_scale` times) the last training forward's loss to them,
    /// telling `source` when each unit's gradients are complete.
    pub fn backward_with<S: ParamSource>(&mut self, source: &mut S) -> Result<(), S::Error> {
        // The logits buffer is used up by backward (it holds dlogits).
        self.arena.start_backward()?;
        let al = &self.act_layout;
        al.dresidual.of_mut(&mut self.arena.acts).fill(0.0);
        let last_residual = al.blocks.last().map_or(al.encoded, |a| a.residual3);

        let embedding = ParamUnit::Embedding;
        source.fetch(embedding)?;
        {
            let base = self.unit_spans.span(embedding).offset;
            let (p, g) = source.params_and_grads(embedding);
            self.classifier_backward(UnitParams::new(base, p), UnitGrads::new(base, g));
        }
        source.release(embedding)?;

        let norm = ParamUnit::FinalNorm;
        source.fetch(norm)?;
        {
            let base = self.unit_spans.span(norm).offset;
            let (p, g) = source.params_and_grads(norm);
            self.final_norm_backward(
                last_residual,
                UnitParams::new(base, p),
                UnitGrads::new(base, g),
            );
        }
        source.release(norm)?;
        source.grads_ready(norm)?;

        layers_backward(self, source)?;

        {
            let base = self.unit_spans.span(embedding).offset;
            let mut g = UnitGrads::new(base, source.grads(embedding));
            let pl = &self.param_layout;
            let [dwte, dwpe] = g.split([pl.wte, pl.wpe]);
            encoder_backward(
                dwte,
                dwpe,
                self.act_layout.dresidual.of(&self.arena.acts),
                &self.tokens,
                self.shape.seq_len,
            );
        }
        source.grads_ready(embedding)?;
        Ok(())
    }

    /// The classifier: `dlnf = dlogits @ wte`, `dwte += dlogits^T @ lnf`.
    fn classifier_backward(&mut self, p: UnitParams<'_>, mut g: UnitGrads<'_>) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let [dwte] = g.split([pl.wte]);
        let [dlnf, dlogits, lnf] =
            split_spans_mut(&mut self.arena.acts, [al.dbtc, al.logits, al.lnf]);
        logits_backward(dlnf, dwte, dlogits, lnf, p.of(pl.wte), self.config.n_embd);
    }

    /// `ln_f`: from `dlnf` (in `dbtc`) into the residual stream's gradient.
    fn final_norm_backward(
        &mut self,
        last_residual: Span,
        p: UnitParams<'_>,
        mut g: UnitGrads<'_>,
    ) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let [dres, dlnf, res, mean, rstd] = split_spans_mut(
            &mut self.arena.acts,
            [
                al.dresidual,
                al.dbtc,
                last_residual,
                al.lnf_mean,
                al.lnf_rstd,
            ],
        );
        let [dw, db] = g.split([pl.ln_f_weight, pl.ln_f_bias]);
        layernorm_backward(dres, dw, db, dlnf, res, p.of(pl.ln_f_weight), mean, rstd);
    }

    /// Where block `l`'s input lives: the embeddings, or the previous block's output.
    pub(super) fn block_input(&self, l: usize) -> Span {
        let al = &self.act_layout;
        match l.checked_sub(1) {
            Some(previous) => al.blocks[previous].residual3,
            None => al.encoded,
        }
    }

    /// Block `l` in reverse; `dresidual` holds the gradient of its output on entry and of its
    /// input on exit.
    pub(super) fn block_backward(&mut self, l: usize, p: UnitParams<'_>, mut g: UnitGrads<'_>) {
        let dims = attention_dims(&self.config, self.shape);
        let n = self.shape.tokens();
        let c = self.config.n_embd;
        let al = &self.act_layout;
        let dqkv = Span::new(al.dbt4c.offset, n * 3 * c);
        let (a, w) = (&al.blocks[l], &self.param_layout.blocks[l]);
        let residual = self.block_input(l);
        let acts = &mut self.arena.acts;

        // MLP: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2)))); dres carries
        // d residual3, which is also d fcproj and (so far) d residual2.
        let [dfch, dres, fch_gelu] = split_spans_mut(acts, [al.dbt4c, al.dresidual, a.fch_gelu]);
        let [dw, db] = g.split([w.mlp_proj_weight, w.mlp_proj_bias]);
        matmul_backward(dfch, dw, db, dres, fch_gelu, p.of(w.mlp_proj_weight));
        let [dfch, fch] = split_spans_mut(acts, [al.dbt4c, a.fch]);
        gelu_backward_inplace(dfch, fch);
        let [dln2, dfch, ln2] = split_spans_mut(acts, [al.dbtc, al.dbt4c, a.ln2]);
        let [dw, db] = g.split([w.fc_weight, w.fc_bias]);
        matmul_backward(dln2, dw, db, dfch, ln2, p.of(w.fc_weight));
        let [dres, dln2, res2, mean, rstd] = split_spans_mut(
            acts,
            [al.dresidual, al.dbtc, a.residual2, a.ln2_mean, a.ln2_rstd],
        );
        let [dw, db] = g.split([w.ln_2_weight, w.ln_2_bias]);
        layernorm_backward(dres, dw, db, dln2, res2, p.of(w.ln_2_weight), mean, rstd);

        // Attention: residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))).
        let [datty, dres, atty] = split_spans_mut(acts, [al.dbtc, al.dresidual, a.atty]);
        let [dw, db] = g.split([w.attn_proj_weight, w.attn_proj_bias]);
        matmul_backward(datty, dw, db, dres, atty, p.of(w.attn_proj_weight));
        let [dqkv_buf, datt, datty, qkv, att] =
            split_spans_mut(acts, [dqkv, al.datt, al.dbtc, a.qkv, a.att]);
        attention_backward(dqkv_buf, datt, datty, qkv, att, dims);
        let [dln1, dqkv_buf, ln1] = split_spans_mut(acts, [al.dbtc, dqkv, a.ln1]);
        let [dw, db] = g.split([w.c_attn_weight, w.c_attn_bias]);
        matmul_backward(dln1, dw, db, dqkv_buf, ln1, p.of(w.c_attn_weight));
        let [dres, dln1, res, mean, rstd] = split_spans_mut(
            acts,
            [al.dresidual, al.dbtc, residual, a.ln1_mean, a.ln1_rstd],
        );
        let [dw, db] = g.split([w.ln_1_weight, w.ln_1_bias]);
        layernorm_backward(dres, dw, db, dln1, res, p.of(w.ln_1_weight), mean, rstd);
    }
}
