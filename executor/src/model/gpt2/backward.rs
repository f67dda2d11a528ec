//! The backward pass of [`Gpt2`]: the forward layers in reverse, each layer's `*_backward`
//! accumulating its parameter gradients, the residual stream's gradient carried in one buffer.

use super::{ArenaState, Gpt2, attention_dims};
use crate::model::ModelError;
use crate::model::attention::attention_backward;
use crate::model::classifier::logits_backward;
use crate::model::encoder::encoder_backward;
use crate::model::gelu::gelu_backward_inplace;
use crate::model::layernorm::layernorm_backward;
use crate::model::matmul::matmul_backward;
use crate::tensor::{Span, split_spans_mut};

impl Gpt2 {
    /// Backward through the whole model: adds the gradient of (`grad_scale` times) the last
    /// training forward's loss to the gradient buffer.
    pub fn backward(&mut self) -> Result<(), ModelError> {
        if self.state != ArenaState::LogitGradients {
            return Err(ModelError::BackwardWithoutForward);
        }
        // The logits buffer is used up by backward (it holds dlogits).
        self.state = ArenaState::Empty;
        let Self {
            config,
            shape,
            param_layout: pl,
            act_layout: al,
            params,
            grads,
            acts,
            tokens,
            ..
        } = self;
        let p: &[f32] = params;
        let dims = attention_dims(config, *shape);
        let n = shape.tokens();
        let c = config.n_embd;
        let dqkv = Span::new(al.dbt4c.offset, n * 3 * c);

        al.dresidual.of_mut(acts).fill(0.0);
        let last_residual = al.blocks.last().map_or(al.encoded, |a| a.residual3);

        // classifier: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf
        let [dlnf, dlogits, lnf] = split_spans_mut(acts, [al.dbtc, al.logits, al.lnf]);
        logits_backward(dlnf, pl.wte.of_mut(grads), dlogits, lnf, pl.wte.of(p), c);
        let [dres, dlnf, res, mean, rstd] = split_spans_mut(
            acts,
            [
                al.dresidual,
                al.dbtc,
                last_residual,
                al.lnf_mean,
                al.lnf_rstd,
            ],
        );
        let [dw, db] = split_spans_mut(grads, [pl.ln_f_weight, pl.ln_f_bias]);
        layernorm_backward(dres, dw, db, dlnf, res, pl.ln_f_weight.of(p), mean, rstd);

        for (l, (a, w)) in al.blocks.iter().zip(&pl.blocks).enumerate().rev() {
            let residual = if l == 0 {
                al.encoded
            } else {
                al.blocks[l - 1].residual3
            };

            // MLP: residual3 = residual2 + c_proj(gelu(c_fc(ln_2(residual2)))); dres carries
            // d residual3, which is also d fcproj and (so far) d residual2.
            let [dfch, dres, fch_gelu] =
                split_spans_mut(acts, [al.dbt4c, al.dresidual, a.fch_gelu]);
            let [dw, db] = split_spans_mut(grads, [w.mlp_proj_weight, w.mlp_proj_bias]);
            matmul_backward(dfch, dw, db, dres, fch_gelu, w.mlp_proj_weight.of(p));
            let [dfch, fch] = split_spans_mut(acts, [al.dbt4c, a.fch]);
            gelu_backward_inplace(dfch, fch);
            let [dln2, dfch, ln2] = split_spans_mut(acts, [al.dbtc, al.dbt4c, a.ln2]);
            let [dw, db] = split_spans_mut(grads, [w.fc_weight, w.fc_bias]);
            matmul_backward(dln2, dw, db, dfch, ln2, w.fc_weight.of(p));
            let [dres, dln2, res2, mean, rstd] = split_spans_mut(
                acts,
                [al.dresidual, al.dbtc, a.residual2, a.ln2_mean, a.ln2_rstd],
            );
            let [dw, db] = split_spans_mut(grads, [w.ln_2_weight, w.ln_2_bias]);
            layernorm_backward(dres, dw, db, dln2, res2, w.ln_2_weight.of(p), mean, rstd);

            // Attention: residual2 = residual + c_proj(attn(c_attn(ln_1(residual)))).
            let [datty, dres, atty] = split_spans_mut(acts, [al.dbtc, al.dresidual, a.atty]);
            let [dw, db] = split_spans_mut(grads, [w.attn_proj_weight, w.attn_proj_bias]);
            matmul_backward(datty, dw, db, dres, atty, w.attn_proj_weight.of(p));
            let [dqkv_buf, datt, datty, qkv, att] =
                split_spans_mut(acts, [dqkv, al.datt, al.dbtc, a.qkv, a.att]);
            attention_backward(dqkv_buf, datt, datty, qkv, att, dims);
            let [dln1, dqkv_buf, ln1] = split_spans_mut(acts, [al.dbtc, dqkv, a.ln1]);
            let [dw, db] = split_spans_mut(grads, [w.c_attn_weight, w.c_attn_bias]);
            matmul_backward(dln1, dw, db, dqkv_buf, ln1, w.c_attn_weight.of(p));
            let [dres, dln1, res, mean, rstd] = split_spans_mut(
                acts,
                [al.dresidual, al.dbtc, residual, a.ln1_mean, a.ln1_rstd],
            );
            let [dw, db] = split_spans_mut(grads, [w.ln_1_weight, w.ln_1_bias]);
            layernorm_backward(dres, dw, db, dln1, res, w.ln_1_weight.of(p), mean, rstd);
        }

        let [dwte, dwpe] = split_spans_mut(grads, [pl.wte, pl.wpe]);
        encoder_backward(dwte, dwpe, al.dresidual.of(acts), tokens, shape.seq_len);
        Ok(())
    }
}
