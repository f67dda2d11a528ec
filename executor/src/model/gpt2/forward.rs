//! The forward pass of [`Gpt2Core`]: embeddings, `L` blocks, `ln_f`, logits, one parameter unit
//! at a time.

use super::{Gpt2Core, attention_dims};
use crate::model::attention::attention_forward;
use crate::model::classifier::logits_forward;
use crate::model::encoder::encoder_forward;
use crate::model::gelu::gelu_forward;
use crate::model::layernorm::layernorm_forward;
use crate::model::matmul::matmul_forward;
use crate::model::recompute::layers_forward;
use crate::model::residual::residual_forward;
use crate::model::units::{ParamSource, ParamUnit, UnitParams};
use crate::tensor::{Span, split_spans_mut};

impl Gpt2Core {
    /// Forward up to and including the logits (tokens already checked), fetching each unit
    /// from `source` before its layers run and releasing it after.
    pub(super) fn run_forward<S: ParamSource>(
        &mut self,
        source: &mut S,
        tokens: &[u32],
    ) -> Result<(), S::Error> {
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);

        let embedding = ParamUnit::Embedding;
        source.fetch(embedding)?;
        self.encode(self.unit_spans.view(source, embedding), tokens);
        source.release(embedding)?;

        let residual = layers_forward(self, source, self.act_layout.encoded)?;

        source.fetch(ParamUnit::FinalNorm)?;
        source.fetch(embedding)?;
        self.head_forward(
            residual,
            self.unit_spans.view(source, ParamUnit::FinalNorm),
            self.unit_spans.view(source, embedding),
        );
        source.release(ParamUnit::FinalNorm)?;
        source.release(embedding)?;
        Ok(())
    }

    /// `encoded = wte[tokens] + wpe[positions]`.
    fn encode(&mut self, p: UnitParams<'_>, tokens: &[u32]) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let [encoded] = split_spans_mut(&mut self.arena.acts, [al.encoded]);
        encoder_forward(
            encoded,
            tokens,
            p.of(pl.wte),
            p.of(pl.wpe),
            self.shape.seq_len,
        );
    }

    /// Block `l` on the residual stream at `residual` (its input); returns where the block's
    /// output lives. Backward calls it again to recompute the block from its saved input
    /// ([`crate::model::recompute`]).
    pub(super) fn block_forward(&mut self, l: usize, residual: Span, p: UnitParams<'_>) -> Span {
        let eps = self.config.layer_norm_epsilon;
        let dims = attention_dims(&self.config, self.shape);
        let (a, w) = (&self.act_layout.blocks[l], &self.param_layout.blocks[l]);
        let acts = &mut self.arena.acts;
        let [ln1, mean, rstd, res] =
            split_spans_mut(acts, [a.ln1, a.ln1_mean, a.ln1_rstd, residual]);
        layernorm_forward(
            ln1,
            mean,
            rstd,
            res,
            p.of(w.ln_1_weight),
            p.of(w.ln_1_bias),
            eps,
        );
        let [qkv, ln1] = split_spans_mut(acts, [a.qkv, a.ln1]);
        matmul_forward(qkv, ln1, p.of(w.c_attn_weight), p.of(w.c_attn_bias));
        let [atty, att, qkv] = split_spans_mut(acts, [a.atty, a.att, a.qkv]);
        attention_forward(atty, att, qkv, dims);
        let [attproj, atty] = split_spans_mut(acts, [a.attproj, a.atty]);
        matmul_forward(
            attproj,
            atty,
            p.of(w.attn_proj_weight),
            p.of(w.attn_proj_bias),
        );
        let [res2, res, attproj] = split_spans_mut(acts, [a.residual2, residual, a.attproj]);
        residual_forward(res2, res, attproj);

        let [ln2, mean, rstd, res2] =
            split_spans_mut(acts, [a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2]);
        layernorm_forward(
            ln2,
            mean,
            rstd,
            res2,
            p.of(w.ln_2_weight),
            p.of(w.ln_2_bias),
            eps,
        );
        let [fch, ln2] = split_spans_mut(acts, [a.fch, a.ln2]);
        matmul_forward(fch, ln2, p.of(w.fc_weight), p.of(w.fc_bias));
        let [fch_gelu, fch] = split_spans_mut(acts, [a.fch_gelu, a.fch]);
        gelu_forward(fch_gelu, fch);
        let [fcproj, fch_gelu] = split_spans_mut(acts, [a.fcproj, a.fch_gelu]);
        matmul_forward(
            fcproj,
            fch_gelu,
            p.of(w.mlp_proj_weight),
            p.of(w.mlp_proj_bias),
        );
        let [res3, res2, fcproj] = split_spans_mut(acts, [a.residual3, a.residual2, a.fcproj]);
        residual_forward(res3, res2, fcproj);
        a.residual3
    }

    /// `ln_f` on the last residual stream, then the logits through the tied `wte`.
    fn head_forward(&mut self, residual: Span, norm: UnitParams<'_>, emb: UnitParams<'_>) {
        let (pl, al) = (&self.param_layout, &self.act_layout);
        let acts = &mut self.arena.acts;
        let [lnf, mean, rstd, res] =
            split_spans_mut(acts, [al.lnf, al.lnf_mean, al.lnf_rstd, residual]);
        layernorm_forward(
            lnf,
            mean,
            rstd,
            res,
            norm.of(pl.ln_f_weight),
            norm.of(pl.ln_f_bias),
            self.config.layer_norm_epsilon,
        );
        let [logits, lnf] = split_spans_mut(acts, [al.logits, al.lnf]);
        logits_forward(logits, lnf, emb.of(pl.wte), self.config.n_embd);
    }
}
