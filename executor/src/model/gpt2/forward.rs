//! The forward pass of [`Gpt2`]: embeddings, `L` blocks, `ln_f`, logits.

use super::{Gpt2, attention_dims};
use crate::model::attention::attention_forward;
use crate::model::classifier::logits_forward;
use crate::model::encoder::encoder_forward;
use crate::model::gelu::gelu_forward;
use crate::model::layernorm::layernorm_forward;
use crate::model::matmul::matmul_forward;
use crate::model::residual::residual_forward;
use crate::tensor::split_spans_mut;

impl Gpt2 {
    /// Forward up to and including the logits (tokens already checked).
    pub(super) fn run_forward(&mut self, tokens: &[u32]) {
        let Self {
            config,
            shape,
            param_layout: pl,
            act_layout: al,
            params,
            acts,
            tokens: kept_tokens,
            ..
        } = self;
        let p: &[f32] = params;
        let eps = config.layer_norm_epsilon;
        let dims = attention_dims(config, *shape);
        kept_tokens.clear();
        kept_tokens.extend_from_slice(tokens);

        let [encoded] = split_spans_mut(acts, [al.encoded]);
        encoder_forward(encoded, tokens, pl.wte.of(p), pl.wpe.of(p), shape.seq_len);

        let mut residual = al.encoded;
        for (a, w) in al.blocks.iter().zip(&pl.blocks) {
            let [ln1, mean, rstd, res] =
                split_spans_mut(acts, [a.ln1, a.ln1_mean, a.ln1_rstd, residual]);
            layernorm_forward(
                ln1,
                mean,
                rstd,
                res,
                w.ln_1_weight.of(p),
                w.ln_1_bias.of(p),
                eps,
            );
            let [qkv, ln1] = split_spans_mut(acts, [a.qkv, a.ln1]);
            matmul_forward(qkv, ln1, w.c_attn_weight.of(p), w.c_attn_bias.of(p));
            let [atty, att, qkv] = split_spans_mut(acts, [a.atty, a.att, a.qkv]);
            attention_forward(atty, att, qkv, dims);
            let [attproj, atty] = split_spans_mut(acts, [a.attproj, a.atty]);
            matmul_forward(
                attproj,
                atty,
                w.attn_proj_weight.of(p),
                w.attn_proj_bias.of(p),
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
                w.ln_2_weight.of(p),
                w.ln_2_bias.of(p),
                eps,
            );
            let [fch, ln2] = split_spans_mut(acts, [a.fch, a.ln2]);
            matmul_forward(fch, ln2, w.fc_weight.of(p), w.fc_bias.of(p));
            let [fch_gelu, fch] = split_spans_mut(acts, [a.fch_gelu, a.fch]);
            gelu_forward(fch_gelu, fch);
            let [fcproj, fch_gelu] = split_spans_mut(acts, [a.fcproj, a.fch_gelu]);
            matmul_forward(
                fcproj,
                fch_gelu,
                w.mlp_proj_weight.of(p),
                w.mlp_proj_bias.of(p),
            );
            let [res3, res2, fcproj] = split_spans_mut(acts, [a.residual3, a.residual2, a.fcproj]);
            residual_forward(res3, res2, fcproj);
            residual = a.residual3;
        }

        let [lnf, mean, rstd, res] =
            split_spans_mut(acts, [al.lnf, al.lnf_mean, al.lnf_rstd, residual]);
        layernorm_forward(
            lnf,
            mean,
            rstd,
            res,
            pl.ln_f_weight.of(p),
            pl.ln_f_bias.of(p),
            eps,
        );
        let [logits, lnf] = split_spans_mut(acts, [al.logits, al.lnf]);
        logits_forward(logits, lnf, pl.wte.of(p), config.n_embd);
    }
}
