//! Adam and AdamW on a flat f32 slice, in `torch.optim.AdamW`'s arithmetic order.
//!
//! For step `k` (1-based) with learning rate `lr`, per element, all in f32 with the scalars
//! computed in f64 first and rounded once (as torch does with Python-float hyperparameters):
//!
//! ```text
//! L2 mode only:         g  = g + wd * p
//! decoupled mode only:  p  = p * (1 - lr * wd)
//!                       m  = lerp(m, g, 1 - beta1)           (m + (1-beta1) * (g - m))
//!                       v  = v * beta2 + (1 - beta2) * g * g
//!                       bc1 = 1 - beta1^k,  bc2 = 1 - beta2^k (1 and 1 without bias correction)
//!                       p  = p + (-lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
//! ```
//!
//! DeepSpeed's `FusedAdam` and `DeepSpeedCPUAdam` compute the same quantities in a slightly
//! different order (decay folded into the update); the results agree to rounding.

use std::fmt;

use rayon::prelude::*;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 14;

/// How weight decay enters the update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightDecay {
    /// AdamW: `p *= 1 - lr * wd` before the Adam update (DeepSpeed `adam_w_mode: true`, its default).
    Decoupled,
    /// Classic Adam: `g += wd * p` before the moments (DeepSpeed `adam_w_mode: false`).
    L2,
}

/// Whether the moments are bias-corrected (DeepSpeed `bias_correction`, default on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BiasCorrection {
    /// Divide by `1 - beta^k`.
    Enabled,
    /// Use the raw moments.
    Disabled,
}

/// Hyperparameters of Adam other than the (scheduled) learning rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamConfig {
    /// `beta1`, the first-moment decay.
    pub beta1: f64,
    /// `beta2`, the second-moment decay.
    pub beta2: f64,
    /// `eps`, added to the bias-corrected `sqrt(v)`.
    pub eps: f64,
    /// Weight decay coefficient.
    pub weight_decay: f64,
    /// Decoupled (AdamW) or L2.
    pub decay: WeightDecay,
    /// Bias correction on or off.
    pub bias_correction: BiasCorrection,
}

impl Default for AdamConfig {
    /// DeepSpeed's defaults for `"type": "Adam"`: betas (0.9, 0.999), eps 1e-8, no weight
    /// decay, `adam_w_mode` true, bias correction on.
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            decay: WeightDecay::Decoupled,
            bias_correction: BiasCorrection::Enabled,
        }
    }
}

/// Why an Adam step could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdamError {
    /// Parameters, gradients and moments do not have the same length.
    LengthMismatch {
        /// Parameters.
        params: usize,
        /// Gradients.
        grads: usize,
        /// First moments.
        exp_avg: usize,
        /// Second moments.
        exp_avg_sq: usize,
    },
    /// Steps count from 1.
    StepZero,
}

impl fmt::Display for AdamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdamError::LengthMismatch {
                params,
                grads,
                exp_avg,
                exp_avg_sq,
            } => write!(
                f,
                "Adam buffers differ in length: params {params}, grads {grads}, exp_avg {exp_avg}, exp_avg_sq {exp_avg_sq}"
            ),
            AdamError::StepZero => write!(f, "Adam steps count from 1"),
        }
    }
}

impl std::error::Error for AdamError {}

/// The optimizer state of one slice: both moments and the step counter.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    /// First moment `m` (torch `exp_avg`).
    pub exp_avg: Vec<f32>,
    /// Second moment `v` (torch `exp_avg_sq`).
    pub exp_avg_sq: Vec<f32>,
    /// Steps taken so far.
    pub step: u64,
}

impl AdamState {
    /// Zero moments for `len` parameters, no steps taken.
    pub fn new(len: usize) -> Self {
        Self {
            exp_avg: vec![0.0; len],
            exp_avg_sq: vec![0.0; len],
            step: 0,
        }
    }

    /// Takes one step: increments the counter and updates `params` from `grads` with `lr`.
    pub fn step(
        &mut self,
        params: &mut [f32],
        grads: &[f32],
        config: &AdamConfig,
        lr: f64,
    ) -> Result<(), AdamError> {
        adam_step(
            params,
            grads,
            &mut self.exp_avg,
            &mut self.exp_avg_sq,
            self.step + 1,
            lr,
            config,
        )?;
        self.step += 1;
        Ok(())
    }
}

/// The per-step scalars, computed once in f64 and rounded to f32 (shared with the offload step,
/// `optim::offload`, whose kernels must do this file's arithmetic).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepScalars {
    pub(crate) decay_factor: f32,
    pub(crate) l2: f32,
    pub(crate) m_weight: f32,
    pub(crate) beta2: f32,
    pub(crate) one_minus_beta2: f32,
    pub(crate) neg_step_size: f32,
    pub(crate) bias_correction2_sqrt: f32,
    pub(crate) eps: f32,
}

impl StepScalars {
    pub(crate) fn new(config: &AdamConfig, step: u64, lr: f64) -> Self {
        let k = step as f64;
        let (bc1, bc2) = match config.bias_correction {
            BiasCorrection::Enabled => (1.0 - config.beta1.powf(k), 1.0 - config.beta2.powf(k)),
            BiasCorrection::Disabled => (1.0, 1.0),
        };
        let (decay_factor, l2) = match config.decay {
            WeightDecay::Decoupled => ((1.0 - lr * config.weight_decay) as f32, 0.0),
            WeightDecay::L2 => (1.0, config.weight_decay as f32),
        };
        Self {
            decay_factor,
            l2,
            m_weight: (1.0 - config.beta1) as f32,
            beta2: config.beta2 as f32,
            one_minus_beta2: (1.0 - config.beta2) as f32,
            neg_step_size: (-(lr / bc1)) as f32,
            bias_correction2_sqrt: bc2.sqrt() as f32,
            eps: config.eps as f32,
        }
    }
}

/// One Adam step (the `step`-th, counting from 1) on a slice and its moments.
pub fn adam_step(
    params: &mut [f32],
    grads: &[f32],
    exp_avg: &mut [f32],
    exp_avg_sq: &mut [f32],
    step: u64,
    lr: f64,
    config: &AdamConfig,
) -> Result<(), AdamError> {
    let n = params.len();
    if grads.len() != n || exp_avg.len() != n || exp_avg_sq.len() != n {
        return Err(AdamError::LengthMismatch {
            params: n,
            grads: grads.len(),
            exp_avg: exp_avg.len(),
            exp_avg_sq: exp_avg_sq.len(),
        });
    }
    if step == 0 {
        return Err(AdamError::StepZero);
    }
    let s = StepScalars::new(config, step, lr);
    let small_weight = s.m_weight.abs() < 0.5;
    params
        .par_chunks_mut(CHUNK)
        .zip(grads.par_chunks(CHUNK))
        .zip(
            exp_avg
                .par_chunks_mut(CHUNK)
                .zip(exp_avg_sq.par_chunks_mut(CHUNK)),
        )
        .for_each(|((p, g), (m, v))| update_chunk_dispatch(p, g, m, v, &s, small_weight));
    Ok(())
}

/// Runs [`update_chunk`] compiled for AVX2 where the CPU has it (checked at run time), else
/// for the baseline target. Both are the same IEEE operations in the same order (no FMA
/// contraction), so the result does not depend on which one runs.
fn update_chunk_dispatch(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    s: &StepScalars,
    small_weight: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above).
        unsafe { update_chunk_avx2(p, g, m, v, s, small_weight) };
        return;
    }
    if small_weight {
        update_chunk::<true>(p, g, m, v, s);
    } else {
        update_chunk::<false>(p, g, m, v, s);
    }
}

/// [`update_chunk`] with 256-bit vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn update_chunk_avx2(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    s: &StepScalars,
    small_weight: bool,
) {
    if small_weight {
        update_chunk::<true>(p, g, m, v, s);
    } else {
        update_chunk::<false>(p, g, m, v, s);
    }
}

/// The element loop; `SMALL_WEIGHT` picks torch's `lerp` formula (branch hoisted out).
#[inline(always)]
fn update_chunk<const SMALL_WEIGHT: bool>(
    p: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    s: &StepScalars,
) {
    for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let g = g + s.l2 * *p;
        *p *= s.decay_factor;
        *m = if SMALL_WEIGHT {
            *m + s.m_weight * (g - *m)
        } else {
            g - (g - *m) * (1.0 - s.m_weight)
        };
        *v = *v * s.beta2 + s.one_minus_beta2 * g * g;
        let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
        *p += s.neg_step_size * *m / denom;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One element, by hand, in f64.
    fn reference(p: f64, g: f64, config: &AdamConfig, lr: f64, steps: u32) -> f64 {
        let (mut p, mut m, mut v) = (p, 0.0, 0.0);
        for k in 1..=steps {
            let g = match config.decay {
                WeightDecay::L2 => g + config.weight_decay * p,
                WeightDecay::Decoupled => {
                    p *= 1.0 - lr * config.weight_decay;
                    g
                }
            };
            m = config.beta1 * m + (1.0 - config.beta1) * g;
            v = config.beta2 * v + (1.0 - config.beta2) * g * g;
            let (bc1, bc2) = match config.bias_correction {
                BiasCorrection::Enabled => (
                    1.0 - config.beta1.powi(k as i32),
                    1.0 - config.beta2.powi(k as i32),
                ),
                BiasCorrection::Disabled => (1.0, 1.0),
            };
            p -= lr * (m / bc1) / ((v / bc2).sqrt() + config.eps);
        }
        p
    }

    #[test]
    fn every_mode_matches_the_formula() {
        for decay in [WeightDecay::Decoupled, WeightDecay::L2] {
            for bias_correction in [BiasCorrection::Enabled, BiasCorrection::Disabled] {
                let config = AdamConfig {
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.1,
                    decay,
                    bias_correction,
                };
                let mut params = vec![0.5f32, -1.25, 2.0];
                let grads = [0.1f32, -0.02, 0.3];
                let mut state = AdamState::new(3);
                for _ in 0..5 {
                    state
                        .step(&mut params, &grads, &config, 1e-2)
                        .expect("same lengths");
                }
                for ((&p, &p0), &g) in params.iter().zip(&[0.5, -1.25, 2.0]).zip(&grads) {
                    let expected = reference(p0, f64::from(g), &config, 1e-2, 5);
                    assert!(
                        (f64::from(p) - expected).abs() < 1e-6,
                        "{decay:?} {bias_correction:?}: {p} vs {expected}"
                    );
                }
                assert_eq!(state.step, 5);
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error() {
        let mut state = AdamState::new(2);
        let result = state.step(&mut [0.0; 3], &[0.0; 3], &AdamConfig::default(), 1e-3);
        assert!(matches!(
            result,
            Err(AdamError::LengthMismatch {
                params: 3,
                exp_avg: 2,
                ..
            })
        ));
    }
}
