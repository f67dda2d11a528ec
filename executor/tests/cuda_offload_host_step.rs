//! The host optimizer of ZeRO-Offload on the CUDA backend (issue 30) computes the device
//! step's AdamW: `optim::offload`'s pool, stepping a partition bucket by bucket as the
//! gradients arrive, gives the bits of the fused AdamW the CUDA step runs (`adamw.cu`'s loop,
//! `adamw_element`, which the host interpreter runs), with the same gradient factor (unscale
//! times clip coefficient). This is the optimizer half of "fp32 with offload equals fp32
//! without"; the device program's offload ops are not built yet.

use dsplan_executor::cuda::adamw::{AdamScalars, Decay, adamw_element};
use dsplan_executor::optim::offload::{AdamSlices, GradsIn, OffloadPool, OffloadStep, ParamsOut};
use dsplan_executor::optim::{AdamConfig, BiasCorrection, WeightDecay};

/// Elements of the partition, and where its "buckets" end (uneven on purpose).
const N: usize = 1031;
const BUCKET_ENDS: [usize; 4] = [97, 500, 501, N];

fn grads(step: u64) -> Vec<f32> {
    (0..N)
        .map(|i| ((i as u64 * 7 + step * 3) % 23) as f32 * 0.013 - 0.14)
        .collect()
}

#[test]
fn the_host_step_by_buckets_equals_the_devices_fused_adamw_bit_for_bit() {
    let config = AdamConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        decay: WeightDecay::Decoupled,
        bias_correction: BiasCorrection::Enabled,
    };
    let pool = OffloadPool::new(2).expect("pool");
    let initial: Vec<f32> = (0..N)
        .map(|i| ((i * 13 % 17) as f32 - 8.0) * 0.05)
        .collect();
    let (mut host_p, mut host_m, mut host_v) = (initial.clone(), vec![0.0; N], vec![0.0; N]);
    let (mut dev_p, mut dev_m, mut dev_v) = (initial, vec![0.0f32; N], vec![0.0f32; N]);
    // Factor 1, then a clipped step, then a loss-scaled one.
    for (step, factor) in [(1u64, 1.0f32), (2, 0.37), (3, 1.0 / 1024.0), (4, 1.0)] {
        let g = grads(step);
        let lr = 1e-3 * step as f64;
        let mut start = 0;
        for end in BUCKET_ENDS {
            pool.adam_step_range(
                AdamSlices {
                    master: &mut host_p,
                    exp_avg: &mut host_m,
                    exp_avg_sq: &mut host_v,
                },
                start..end,
                GradsIn::F32(&g[start..end]),
                ParamsOut::None,
                &OffloadStep {
                    step,
                    lr,
                    grad_factor: factor,
                },
                &config,
            )
            .expect("step");
            start = end;
        }
        let scalars = AdamScalars::new(&config, step, lr, factor);
        for i in 0..N {
            adamw_element(
                &scalars,
                Decay::Apply,
                &mut dev_p[i],
                g[i],
                &mut dev_m[i],
                &mut dev_v[i],
            );
        }
        assert_eq!(host_p, dev_p, "master after step {step}");
        assert_eq!(host_m, dev_m, "exp_avg after step {step}");
        assert_eq!(host_v, dev_v, "exp_avg_sq after step {step}");
    }
}
