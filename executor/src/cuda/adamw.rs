//! The host side of the fused AdamW kernel (`kernels/cu/adamw.cu`): its per-step scalars and
//! its segment table, laid out exactly as the kernel's C structs.
//!
//! The scalars are computed as `executor::optim::adam` computes them (in f64, rounded once to
//! f32), so the kernel's arithmetic is the CPU's; a test replays the kernel's loop on the CPU
//! and compares with `adam_step` bit for bit.

use cudarc::driver::DeviceRepr;

use crate::optim::{AdamConfig, BiasCorrection, WeightDecay};

/// `struct AdamScalars` of `adamw.cu` (40 bytes, C layout).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamScalars {
    /// `1 - lr * wd` in decoupled mode, else 1 (applied only to decaying segments).
    pub decay_factor: f32,
    /// `wd` in L2 mode, else 0 (applied only to decaying segments).
    pub l2: f32,
    /// `1 - beta1`.
    pub m_weight: f32,
    /// `beta2`.
    pub beta2: f32,
    /// `1 - beta2`.
    pub one_minus_beta2: f32,
    /// `-lr / (1 - beta1^k)` (or `-lr` without bias correction).
    pub neg_step_size: f32,
    /// `sqrt(1 - beta2^k)` (or 1).
    pub bias_correction2_sqrt: f32,
    /// `eps`.
    pub eps: f32,
    /// Multiplies every gradient first: `clip_coefficient / loss_scale`.
    pub grad_scale: f32,
    /// 1 when `|1 - beta1| < 0.5` (torch's lerp uses `m + w (g - m)`), else 0.
    pub small_weight: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's `AdamScalars` (checked by a test).
unsafe impl DeviceRepr for AdamScalars {}

impl AdamScalars {
    /// The scalars of step `step` (from 1) at learning rate `lr`.
    pub fn new(config: &AdamConfig, step: u64, lr: f64, grad_scale: f32) -> Self {
        let k = step as f64;
        let (bc1, bc2) = match config.bias_correction {
            BiasCorrection::Enabled => (1.0 - config.beta1.powf(k), 1.0 - config.beta2.powf(k)),
            BiasCorrection::Disabled => (1.0, 1.0),
        };
        let (decay_factor, l2) = match config.decay {
            WeightDecay::Decoupled => ((1.0 - lr * config.weight_decay) as f32, 0.0),
            WeightDecay::L2 => (1.0, config.weight_decay as f32),
        };
        let m_weight = (1.0 - config.beta1) as f32;
        Self {
            decay_factor,
            l2,
            m_weight,
            beta2: config.beta2 as f32,
            one_minus_beta2: (1.0 - config.beta2) as f32,
            neg_step_size: (-(lr / bc1)) as f32,
            bias_correction2_sqrt: bc2.sqrt() as f32,
            eps: config.eps as f32,
            grad_scale,
            small_weight: i32::from(m_weight.abs() < 0.5),
        }
    }
}

/// `struct AdamSegment` of `adamw.cu` (24 bytes): a range of the flat buffers.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdamSegment {
    /// First element.
    pub offset: i64,
    /// Elements.
    pub len: i64,
    /// 1: weight decay applies; 0: exempt (biases, LayerNorm parameters).
    pub decay: i32,
    /// Padding; 0.
    pub reserved: i32,
}

// SAFETY: plain-old-data with the C layout of the kernel's `AdamSegment` (checked by a test).
unsafe impl DeviceRepr for AdamSegment {}

/// Whether weight decay applies to a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decay {
    /// Decayed.
    Apply,
    /// Exempt.
    Exempt,
}

impl AdamSegment {
    /// The segment `offset..offset + len`.
    pub fn new(offset: usize, len: usize, decay: Decay) -> Self {
        Self {
            offset: offset as i64,
            len: len as i64,
            decay: i32::from(decay == Decay::Apply),
            reserved: 0,
        }
    }
}

/// The kernel's element loop, on the CPU: what `adamw.cu` computes for one element. Used by
/// tests (here and on a GPU) as the statement of the kernel's arithmetic.
pub fn adamw_element(
    s: &AdamScalars,
    decay: Decay,
    master: &mut f32,
    grad: f32,
    exp_avg: &mut f32,
    exp_avg_sq: &mut f32,
) {
    let (decay_factor, l2) = match decay {
        Decay::Apply => (s.decay_factor, s.l2),
        Decay::Exempt => (1.0, 0.0),
    };
    let mut p = *master;
    let g = grad * s.grad_scale + l2 * p;
    p *= decay_factor;
    let m = *exp_avg;
    let m = if s.small_weight != 0 {
        m + s.m_weight * (g - m)
    } else {
        g - (g - m) * (1.0 - s.m_weight)
    };
    let v = *exp_avg_sq * s.beta2 + s.one_minus_beta2 * g * g;
    let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
    p += s.neg_step_size * m / denom;
    *master = p;
    *exp_avg = m;
    *exp_avg_sq = v;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::optim::adam_step;

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(std::mem::size_of::<AdamScalars>(), 40);
        assert_eq!(std::mem::size_of::<AdamSegment>(), 24);
        assert_eq!(std::mem::align_of::<AdamSegment>(), 8);
        let source = dsplan_kernels::source::ADAMW.text;
        for field in [
            "decay_factor",
            "l2",
            "m_weight",
            "beta2",
            "one_minus_beta2",
            "neg_step_size",
            "bias_correction2_sqrt",
            "eps",
            "grad_scale",
            "small_weight",
            "offset",
            "len",
            "decay",
            "reserved",
        ] {
            assert!(
                source.contains(&format!(" {field};")),
                "adamw.cu lacks field {field}"
            );
        }
    }

    /// The kernel's loop, replayed on the CPU with these scalars, equals `adam_step` exactly.
    #[test]
    fn kernel_arithmetic_equals_the_cpu_adam_step() {
        for decay in [WeightDecay::Decoupled, WeightDecay::L2] {
            for beta1 in [0.9, 0.2] {
                let config = AdamConfig {
                    beta1,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.1,
                    decay,
                    bias_correction: BiasCorrection::Enabled,
                };
                let n = 257;
                let mut cpu_p: Vec<f32> = (0..n)
                    .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.05)
                    .collect();
                let mut cpu_m = vec![0.0f32; n];
                let mut cpu_v = vec![0.0f32; n];
                let mut gpu_p = cpu_p.clone();
                let mut gpu_m = cpu_m.clone();
                let mut gpu_v = cpu_v.clone();
                for step in 1..=4u64 {
                    let grads: Vec<f32> = (0..n)
                        .map(|i| ((i as u64 * 7 + step * 3) % 23) as f32 * 0.01 - 0.1)
                        .collect();
                    let lr = 1e-3 * step as f64;
                    adam_step(
                        &mut cpu_p, &grads, &mut cpu_m, &mut cpu_v, step, lr, &config,
                    )
                    .expect("same lengths");
                    let scalars = AdamScalars::new(&config, step, lr, 1.0);
                    for i in 0..n {
                        adamw_element(
                            &scalars,
                            Decay::Apply,
                            &mut gpu_p[i],
                            grads[i],
                            &mut gpu_m[i],
                            &mut gpu_v[i],
                        );
                    }
                }
                assert_eq!(gpu_p, cpu_p, "{decay:?} beta1={beta1}");
                assert_eq!(gpu_m, cpu_m);
                assert_eq!(gpu_v, cpu_v);
            }
        }
    }

    #[test]
    fn exempt_segments_skip_decay() {
        let config = AdamConfig {
            weight_decay: 0.5,
            ..AdamConfig::default()
        };
        let s = AdamScalars::new(&config, 1, 0.1, 1.0);
        let (mut decayed, mut exempt) = (1.0f32, 1.0f32);
        let (mut m1, mut v1, mut m2, mut v2) = (0.0, 0.0, 0.0, 0.0);
        adamw_element(&s, Decay::Apply, &mut decayed, 0.0, &mut m1, &mut v1);
        adamw_element(&s, Decay::Exempt, &mut exempt, 0.0, &mut m2, &mut v2);
        assert_eq!(exempt, 1.0);
        assert!((decayed - 0.95).abs() < 1e-6);
        assert_eq!(AdamSegment::new(8, 4, Decay::Exempt).decay, 0);
    }
}
