//! [`Gpt2`]: the whole model, forward and backward, over the flat buffers.
//!
//! `forward` runs embeddings, `L` blocks (`h += attn(ln_1(h)); h += mlp(ln_2(h))`), `ln_f` and
//! the tied-embedding classifier; with targets it also computes the mean cross-entropy and,
//! fused, the gradient of the logits. `backward` walks the same layers in reverse and
//! accumulates every parameter gradient into the gradient buffer.

use super::activations::{ActivationLayout, BatchShape};
use super::attention::{AttentionDims, attention_backward, attention_forward};
use super::classifier::{crossentropy_forward_backward, logits_backward, logits_forward};
use super::encoder::{encoder_backward, encoder_forward};
use super::gelu::{gelu_backward_inplace, gelu_forward};
use super::layernorm::{layernorm_backward, layernorm_forward};
use super::matmul::{matmul_backward, matmul_forward};
use super::residual::residual_forward;
use super::{Gpt2Config, ModelError, ParamLayout};
use crate::tensor::{Span, split_spans_mut};

/// What the activation arena holds after the last call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArenaState {
    /// Nothing usable.
    Empty,
    /// An inference forward ran: the logits are valid.
    Logits,
    /// A training forward ran: the logits buffer holds their gradient; backward may run.
    LogitGradients,
}

/// A GPT-2 with its parameters, gradients and activation arena.
#[derive(Debug, Clone)]
pub struct Gpt2 {
    config: Gpt2Config,
    shape: BatchShape,
    param_layout: ParamLayout,
    act_layout: ActivationLayout,
    params: Vec<f32>,
    grads: Vec<f32>,
    acts: Vec<f32>,
    tokens: Vec<u32>,
    state: ArenaState,
}

impl Gpt2 {
    /// A model for `config` with the given parameters (laid out as [`ParamLayout::new`] says),
    /// sized for batches of `shape`. Gradients start at zero.
    pub fn new(
        config: Gpt2Config,
        params: Vec<f32>,
        shape: BatchShape,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        if shape.batch == 0 || shape.seq_len == 0 {
            return Err(ModelError::EmptyBatch);
        }
        if shape.seq_len > config.n_positions {
            return Err(ModelError::SequenceTooLong {
                seq_len: shape.seq_len,
                n_positions: config.n_positions,
            });
        }
        let param_layout = ParamLayout::new(&config);
        if params.len() != param_layout.num_params() {
            return Err(ModelError::ParamCount {
                expected: param_layout.num_params(),
                found: params.len(),
            });
        }
        let act_layout = ActivationLayout::new(&config, shape);
        Ok(Self {
            config,
            shape,
            grads: vec![0.0; params.len()],
            acts: vec![0.0; act_layout.total_len()],
            params,
            param_layout,
            act_layout,
            tokens: Vec::with_capacity(shape.tokens()),
            state: ArenaState::Empty,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The batch shape the arena is sized for.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The parameter (and gradient) layout.
    pub fn param_layout(&self) -> &ParamLayout {
        &self.param_layout
    }

    /// The activation arena layout.
    pub fn activation_layout(&self) -> &ActivationLayout {
        &self.act_layout
    }

    /// The flat parameter buffer.
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// The flat parameter buffer, for the optimizer (invalidates the activations).
    pub fn params_mut(&mut self) -> &mut [f32] {
        self.state = ArenaState::Empty;
        &mut self.params
    }

    /// The flat gradient buffer (same layout as the parameters).
    pub fn grads(&self) -> &[f32] {
        &self.grads
    }

    /// The flat gradient buffer, for clipping or reduction.
    pub fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }

    /// Parameters and gradients at once, for an optimizer step (invalidates the activations).
    pub fn params_and_grads_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        self.state = ArenaState::Empty;
        (&mut self.params, &mut self.grads)
    }

    /// Sets every gradient to zero (backward accumulates).
    pub fn zero_grad(&mut self) {
        self.grads.fill(0.0);
    }

    /// The logits `(B, T, V)` of the last [`Gpt2::forward_logits`], if the arena still holds them.
    pub fn logits(&self) -> Option<&[f32]> {
        (self.state == ArenaState::Logits).then(|| self.act_layout.logits.of(&self.acts))
    }

    /// Inference forward: returns the logits `(B, T, V)` of `tokens` `(B, T)`.
    pub fn forward_logits(&mut self, tokens: &[u32]) -> Result<&[f32], ModelError> {
        self.check_ids(
            "token",
            "tokens",
            tokens.iter().map(|&t| Some(t)),
            tokens.len(),
        )?;
        self.run_forward(tokens);
        self.state = ArenaState::Logits;
        Ok(self.act_layout.logits.of(&self.acts))
    }

    /// Training forward: the mean cross-entropy over positions that have a target, with the
    /// gradient of the logits prepared for [`Gpt2::backward`].
    ///
    /// `tokens` and `targets` are `(B, T)`; `targets[i]` is the id position `i` should predict,
    /// or `None` to ignore it (Hugging Face's `-100`). See [`next_token_targets`].
    pub fn forward(&mut self, tokens: &[u32], targets: &[Option<u32>]) -> Result<f32, ModelError> {
        self.forward_scaled(tokens, targets, 1.0)
    }

    /// As [`Gpt2::forward`], but backward will compute the gradient of `grad_scale * loss`
    /// (gradient accumulation divides by the number of micro-batches; fp16 multiplies by the
    /// loss scale).
    pub fn forward_scaled(
        &mut self,
        tokens: &[u32],
        targets: &[Option<u32>],
        grad_scale: f32,
    ) -> Result<f32, ModelError> {
        self.check_ids(
            "token",
            "tokens",
            tokens.iter().map(|&t| Some(t)),
            tokens.len(),
        )?;
        self.check_ids("target", "targets", targets.iter().copied(), targets.len())?;
        let count = targets.iter().filter(|t| t.is_some()).count();
        if count == 0 {
            return Err(ModelError::NoTargets);
        }
        self.run_forward(tokens);
        let layout = &self.act_layout;
        let [logits, losses] = split_spans_mut(&mut self.acts, [layout.logits, layout.losses]);
        let dloss = grad_scale / count as f32;
        crossentropy_forward_backward(logits, losses, targets, dloss);
        let total: f64 = losses.iter().map(|&l| f64::from(l)).sum();
        self.state = ArenaState::LogitGradients;
        Ok((total / count as f64) as f32)
    }

    /// Checks the length of `ids` and that each is in the vocabulary.
    fn check_ids(
        &self,
        what: &'static str,
        plural: &'static str,
        ids: impl Iterator<Item = Option<u32>>,
        len: usize,
    ) -> Result<(), ModelError> {
        let expected = self.shape.tokens();
        if len != expected {
            return Err(ModelError::BatchLength {
                what: plural,
                expected,
                found: len,
            });
        }
        let vocab_size = self.config.vocab_size;
        for (position, id) in ids.enumerate() {
            if let Some(id) = id
                && id as usize >= vocab_size
            {
                return Err(ModelError::OutOfVocabulary {
                    what,
                    position,
                    id,
                    vocab_size,
                });
            }
        }
        Ok(())
    }

    /// Forward up to and including the logits (tokens already checked).
    fn run_forward(&mut self, tokens: &[u32]) {
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

fn attention_dims(config: &Gpt2Config, shape: BatchShape) -> AttentionDims {
    AttentionDims {
        batch: shape.batch,
        seq_len: shape.seq_len,
        n_head: config.n_head,
        head_dim: config.head_dim(),
    }
}

/// The targets of causal language modelling as Hugging Face computes them from
/// `labels = input_ids`: position `t` predicts token `t + 1` of the same row; the last position
/// of each row has no target.
///
/// `tokens` is `(B, T)` flattened, with rows of `seq_len`.
pub fn next_token_targets(tokens: &[u32], seq_len: usize) -> Vec<Option<u32>> {
    tokens
        .chunks(seq_len.max(1))
        .flat_map(|row| {
            row.iter()
                .skip(1)
                .map(|&t| Some(t))
                .chain(std::iter::once(None))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_shift_left_within_rows() {
        assert_eq!(
            next_token_targets(&[1, 2, 3, 4, 5, 6], 3),
            vec![Some(2), Some(3), None, Some(5), Some(6), None]
        );
    }
}
