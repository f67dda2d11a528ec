//! The offload step against `adam_step` (bit for bit), across every kernel variant, whole and
//! by ranges, and the speculative state's commit and rollback.

use half::{bf16, f16};

use super::*;
use crate::optim::adam::{AdamConfig, BiasCorrection, WeightDecay, adam_step};
use crate::optim::clip::scale_grads;

/// Deterministic values of mixed sign and magnitude, with zeros, a signed zero and tiny
/// values whose squares and 16-bit roundings are denormal.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match i % 97 {
                0 => 0.0,
                1 => -0.0,
                2 => unit * 1e-39,
                3 => unit * 1e-30,
                _ => unit * scale * (1.0 + (i % 7) as f32),
            }
        })
        .collect()
}

fn configs() -> Vec<AdamConfig> {
    let mut out = Vec::new();
    for decay in [WeightDecay::Decoupled, WeightDecay::L2] {
        for (beta1, bias_correction) in [
            (0.9, BiasCorrection::Enabled),
            (0.3, BiasCorrection::Disabled),
        ] {
            out.push(AdamConfig {
                beta1,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                decay,
                bias_correction,
            });
        }
    }
    out
}

fn pool_with(isa: Isa) -> OffloadPool {
    let mut pool = OffloadPool::new(2).expect("2 threads");
    pool.set_isa(isa).expect("available");
    pool
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Sizes with vector tails and more than one thread's share.
const SIZES: [usize; 3] = [1, 37, 70_003];

#[test]
fn the_run_time_choice_takes_avx512_where_the_cpu_has_it() {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") {
        assert!(matches!(Isa::best(), Isa::Avx512 | Isa::Avx512Bf16));
        if std::is_x86_feature_detected!("avx512bf16") {
            assert_eq!(Isa::best(), Isa::Avx512Bf16);
        }
    }
    assert!(Isa::all_available().contains(&Isa::Scalar));
}

#[test]
fn f32_in_factor_one_no_out_is_adam_step_bit_for_bit() {
    for isa in Isa::all_available() {
        let pool = pool_with(isa);
        for config in configs() {
            for n in SIZES {
                let grads = values(n, 1, 1e-2);
                let init = values(n, 2, 1.0);
                let (mut p, mut m, mut v) = (init.clone(), vec![0.0; n], vec![0.0; n]);
                let (mut q, mut qm, mut qv) = (init, vec![0.0; n], vec![0.0; n]);
                for step in 1..=3 {
                    adam_step(&mut p, &grads, &mut m, &mut v, step, 1e-3, &config).expect("ok");
                    let state = AdamSlices {
                        master: &mut q,
                        exp_avg: &mut qm,
                        exp_avg_sq: &mut qv,
                    };
                    let s = OffloadStep {
                        step,
                        lr: 1e-3,
                        grad_factor: 1.0,
                    };
                    pool.adam_step(state, GradsIn::F32(&grads), ParamsOut::None, &s, &config)
                        .expect("ok");
                }
                assert_eq!(bits(&q), bits(&p), "{isa} {config:?} n={n}: params");
                assert_eq!(bits(&qm), bits(&m), "{isa} {config:?} n={n}: exp_avg");
                assert_eq!(bits(&qv), bits(&v), "{isa} {config:?} n={n}: exp_avg_sq");
            }
        }
    }
}

/// The reference: widen the gradients, scale them, `adam_step`, round the parameters.
struct Reference {
    p: Vec<f32>,
    m: Vec<f32>,
    v: Vec<f32>,
}

impl Reference {
    fn step(&mut self, wide_grads: &[f32], factor: f32, step: u64, config: &AdamConfig) {
        let mut g = wide_grads.to_vec();
        scale_grads(&mut g, factor);
        adam_step(
            &mut self.p,
            &g,
            &mut self.m,
            &mut self.v,
            step,
            1e-3,
            config,
        )
        .expect("ok");
    }
}

#[test]
fn sixteen_bit_variants_are_widen_step_round_bit_for_bit() {
    let factor = 0.37f32 / 1024.0;
    for isa in Isa::all_available() {
        let pool = pool_with(isa);
        for config in configs() {
            for n in SIZES {
                let wide = values(n, 3, 50.0);
                let g_bf16: Vec<bf16> = wide.iter().map(|&x| bf16::from_f32(x)).collect();
                let g_f16: Vec<f16> = wide.iter().map(|&x| f16::from_f32(x)).collect();
                let init = values(n, 4, 1.0);
                for dtype in [GradDtype::Bf16, GradDtype::F16] {
                    let widened: Vec<f32> = match dtype {
                        GradDtype::Bf16 => g_bf16.iter().map(|x| x.to_f32()).collect(),
                        _ => g_f16.iter().map(|x| x.to_f32()).collect(),
                    };
                    let mut reference = Reference {
                        p: init.clone(),
                        m: vec![0.0; n],
                        v: vec![0.0; n],
                    };
                    let mut state = HostAdamState::new(&pool, &init);
                    let mut out_bf16 = vec![bf16::ZERO; n];
                    let mut out_f16 = vec![f16::ZERO; n];
                    for step in 1..=2 {
                        reference.step(&widened, factor, step, &config);
                        let s = OffloadStep {
                            step,
                            lr: 1e-3,
                            grad_factor: factor,
                        };
                        let grads = match dtype {
                            GradDtype::Bf16 => GradsIn::Bf16(&g_bf16),
                            _ => GradsIn::F16(&g_f16),
                        };
                        let out = match dtype {
                            GradDtype::Bf16 => ParamsOut::Bf16(&mut out_bf16),
                            _ => ParamsOut::F16(&mut out_f16),
                        };
                        pool.adam_step(state.slices(), grads, out, &s, &config)
                            .expect("ok");
                    }
                    let what = format!("{isa} {dtype:?} {config:?} n={n}");
                    assert_eq!(bits(&state.master), bits(&reference.p), "{what}: master");
                    assert_eq!(bits(&state.exp_avg), bits(&reference.m), "{what}: exp_avg");
                    assert_eq!(
                        bits(&state.exp_avg_sq),
                        bits(&reference.v),
                        "{what}: exp_avg_sq"
                    );
                    match dtype {
                        GradDtype::Bf16 => {
                            let expected: Vec<u16> = reference
                                .p
                                .iter()
                                .map(|&x| bf16::from_f32(x).to_bits())
                                .collect();
                            let got: Vec<u16> = out_bf16.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(got, expected, "{what}: bf16 copy");
                        }
                        _ => {
                            let expected: Vec<u16> = reference
                                .p
                                .iter()
                                .map(|&x| f16::from_f32(x).to_bits())
                                .collect();
                            let got: Vec<u16> = out_f16.iter().map(|x| x.to_bits()).collect();
                            assert_eq!(got, expected, "{what}: fp16 copy");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn f32_grads_can_still_write_a_sixteen_bit_copy() {
    let n = 1000;
    let grads = values(n, 5, 1.0);
    let init = values(n, 6, 1.0);
    let config = AdamConfig::default();
    let pool = OffloadPool::new(2).expect("2 threads");
    let mut state = HostAdamState::new(&pool, &init);
    let mut out = vec![bf16::ZERO; n];
    let s = OffloadStep {
        step: 1,
        lr: 1e-2,
        grad_factor: 1.0,
    };
    pool.adam_step(
        state.slices(),
        GradsIn::F32(&grads),
        ParamsOut::Bf16(&mut out),
        &s,
        &config,
    )
    .expect("ok");
    assert!(
        state
            .master
            .iter()
            .zip(&out)
            .all(|(&p, o)| bf16::from_f32(p) == *o)
    );
    assert_ne!(
        bits(&state.master),
        bits(&init),
        "the step moved the parameters"
    );
}

#[test]
fn buckets_stepped_as_they_arrive_equal_the_whole_step() {
    let n = 100_000;
    let config = configs()[0];
    let wide = values(n, 7, 1.0);
    let grads: Vec<bf16> = wide.iter().map(|&x| bf16::from_f32(x)).collect();
    let init = values(n, 8, 1.0);
    let pool = OffloadPool::new(2).expect("2 threads");
    let s = OffloadStep {
        step: 1,
        lr: 1e-3,
        grad_factor: 0.5,
    };
    let mut whole = HostAdamState::new(&pool, &init);
    let mut whole_out = vec![bf16::ZERO; n];
    pool.adam_step(
        whole.slices(),
        GradsIn::Bf16(&grads),
        ParamsOut::Bf16(&mut whole_out),
        &s,
        &config,
    )
    .expect("ok");
    let mut by_bucket = HostAdamState::new(&pool, &init);
    let mut bucket_out = vec![bf16::ZERO; n];
    // Backward produces the last buckets first.
    for range in [60_001..n, 17..60_001, 0..17] {
        let staging: Vec<bf16> = grads[range.clone()].to_vec();
        pool.adam_step_range(
            by_bucket.slices(),
            range.clone(),
            GradsIn::Bf16(&staging),
            ParamsOut::Bf16(&mut bucket_out[range]),
            &s,
            &config,
        )
        .expect("ok");
    }
    assert_eq!(by_bucket, whole);
    assert_eq!(bucket_out, whole_out);
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let pool = OffloadPool::new(1).expect("1 thread");
    let config = AdamConfig::default();
    let (mut p, mut m, mut v) = (vec![0.0f32; 8], vec![0.0f32; 8], vec![0.0f32; 7]);
    let s = OffloadStep {
        step: 1,
        lr: 1e-3,
        grad_factor: 1.0,
    };
    let g = [0.0f32; 8];
    let slices = AdamSlices {
        master: &mut p,
        exp_avg: &mut m,
        exp_avg_sq: &mut v,
    };
    let err = pool.adam_step(slices, GradsIn::F32(&g), ParamsOut::None, &s, &config);
    assert!(matches!(
        err,
        Err(OffloadError::StateLengths { exp_avg_sq: 7, .. })
    ));
    let mut state = HostAdamState {
        master: vec![0.0; 8],
        exp_avg: vec![0.0; 8],
        exp_avg_sq: vec![0.0; 8],
    };
    let err = pool.adam_step_range(
        state.slices(),
        4..9,
        GradsIn::F32(&g[..5]),
        ParamsOut::None,
        &s,
        &config,
    );
    assert!(matches!(
        err,
        Err(OffloadError::RangeOutOfBounds { len: 8, .. })
    ));
    let err = pool.adam_step_range(
        state.slices(),
        0..4,
        GradsIn::F32(&g),
        ParamsOut::None,
        &s,
        &config,
    );
    assert!(matches!(
        err,
        Err(OffloadError::GradsLength {
            expected: 4,
            grads: 8
        })
    ));
    let mut out = vec![bf16::ZERO; 3];
    let err = pool.adam_step_range(
        state.slices(),
        0..4,
        GradsIn::F32(&g[..4]),
        ParamsOut::Bf16(&mut out),
        &s,
        &config,
    );
    assert!(matches!(
        err,
        Err(OffloadError::ParamsOutLength {
            expected: 4,
            params_out: 3
        })
    ));
    let zero = OffloadStep { step: 0, ..s };
    let err = pool.adam_step(
        state.slices(),
        GradsIn::F32(&g),
        ParamsOut::None,
        &zero,
        &config,
    );
    assert_eq!(err, Err(OffloadError::StepZero));
    let nan = OffloadStep {
        grad_factor: f32::NAN,
        ..s
    };
    let err = pool.adam_step(
        state.slices(),
        GradsIn::F32(&g),
        ParamsOut::None,
        &nan,
        &config,
    );
    assert!(matches!(err, Err(OffloadError::FactorNotFinite(_))));
    assert!(
        err.expect_err("error")
            .to_string()
            .contains("skip an overflowed step")
    );
}

#[test]
fn speculative_commit_equals_the_in_place_step() {
    let n = 50_000;
    let config = configs()[1];
    let grads: Vec<bf16> = values(n, 9, 1.0)
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let init = values(n, 10, 1.0);
    let pool = OffloadPool::new(2).expect("2 threads");
    let mut exact = HostAdamState::new(&pool, &init);
    let mut spec = SpeculativeState::new(&pool, &init);
    for step in 1..=3 {
        let s = OffloadStep {
            step,
            lr: 1e-3,
            grad_factor: 1.0,
        };
        pool.adam_step(
            exact.slices(),
            GradsIn::Bf16(&grads),
            ParamsOut::None,
            &s,
            &config,
        )
        .expect("ok");
        for range in [30_000..n, 0..30_000] {
            spec.step_range(
                &pool,
                range.clone(),
                GradsIn::Bf16(&grads[range]),
                ParamsOut::None,
                &s,
                &config,
            )
            .expect("ok");
        }
        spec.commit().expect("every element stepped");
        assert_eq!(spec.current(), &exact, "step {step}");
    }
}

#[test]
fn a_forced_rollback_gives_the_exact_order_step() {
    let n = 40_000;
    let config = configs()[0];
    let grads: Vec<bf16> = values(n, 11, 3.0)
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let init = values(n, 12, 1.0);
    let pool = OffloadPool::new(2).expect("2 threads");
    let clip = 0.25f32;

    // The exact order: step 1 unclipped, step 2 clipped, step 3 overflowed (skipped), step 3 again.
    let mut exact = HostAdamState::new(&pool, &init);
    let mut exact_out = vec![bf16::ZERO; n];
    for (step, factor) in [(1, 1.0), (2, clip), (3, 1.0)] {
        let s = OffloadStep {
            step,
            lr: 1e-3,
            grad_factor: factor,
        };
        pool.adam_step(
            exact.slices(),
            GradsIn::Bf16(&grads),
            ParamsOut::Bf16(&mut exact_out),
            &s,
            &config,
        )
        .expect("ok");
    }

    // Speculative: every step starts with factor 1 before the norm is known.
    let mut spec = SpeculativeState::new(&pool, &init);
    let mut out = vec![bf16::ZERO; n];
    let run = |spec: &mut SpeculativeState, step: u64, factor: f32, out: &mut [bf16]| {
        let s = OffloadStep {
            step,
            lr: 1e-3,
            grad_factor: factor,
        };
        for range in [20_000..n, 0..20_000] {
            spec.step_range(
                &pool,
                range.clone(),
                GradsIn::Bf16(&grads[range.clone()]),
                ParamsOut::Bf16(&mut out[range]),
                &s,
                &config,
            )
            .expect("ok");
        }
    };
    run(&mut spec, 1, 1.0, &mut out);
    spec.commit().expect("covered");
    // Step 2: the norm says clip; roll back and redo with the clip factor.
    run(&mut spec, 2, 1.0, &mut out);
    let wrong = spec.sides_next_master_for_test();
    spec.roll_back();
    run(&mut spec, 2, clip, &mut out);
    spec.commit().expect("covered");
    assert_ne!(
        bits(&wrong),
        bits(&spec.current().master),
        "the rollback changed the result"
    );
    // Step 3: overflow; roll back and skip, then run step 3 on the next gradients.
    run(&mut spec, 3, 1.0, &mut out);
    spec.roll_back();
    run(&mut spec, 3, 1.0, &mut out);
    spec.commit().expect("covered");
    assert_eq!(spec.current(), &exact);
    assert_eq!(out, exact_out);
}

#[test]
fn commit_refuses_a_partly_stepped_round() {
    let pool = OffloadPool::new(1).expect("1 thread");
    let init = vec![1.0f32; 100];
    let mut spec = SpeculativeState::new(&pool, &init);
    let g = [bf16::ONE; 100];
    let s = OffloadStep {
        step: 1,
        lr: 1e-3,
        grad_factor: 1.0,
    };
    spec.step_range(
        &pool,
        0..40,
        GradsIn::Bf16(&g[..40]),
        ParamsOut::None,
        &s,
        &AdamConfig::default(),
    )
    .expect("ok");
    spec.step_range(
        &pool,
        60..100,
        GradsIn::Bf16(&g[60..]),
        ParamsOut::None,
        &s,
        &AdamConfig::default(),
    )
    .expect("ok");
    assert_eq!(spec.commit(), Err(UncoveredRange { missing: 40..60 }));
    assert_eq!(spec.current().master, init, "nothing committed");
}

/// Every rounding case of every exponent: all 2^16 high halves with low halves around the
/// rounding point, plus denormals, infinities and NaNs.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_bf16_rounding_is_round_to_nearest_even_everywhere() {
    use super::kernel_x86::bf16_round_16;
    let lows = [0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc000];
    let natives: Vec<bool> = [false, true]
        .into_iter()
        .filter(|&native| !native || Isa::Avx512Bf16.is_available())
        .collect();
    if !Isa::Avx512.is_available() {
        return;
    }
    assert!(natives.contains(&true) || !Isa::Avx512Bf16.is_available());
    for native in natives {
        let mut checked = 0usize;
        for high in 0u32..=0xffff {
            let xs: Vec<f32> = lows
                .iter()
                .map(|&low| f32::from_bits(high << 16 | low))
                .collect();
            for chunk in xs.chunks(8) {
                let mut lane = [0.0f32; 16];
                lane[..8].copy_from_slice(chunk);
                // Denormals next to normals in the same vector.
                lane[8] = f32::from_bits((high & 0x8000) << 16 | (high & 0x7f) << 16 | 0x8000);
                lane[9] = 1.5;
                let got = bf16_round_16(lane, native);
                for (x, g) in lane.iter().zip(got) {
                    let expected = bf16::from_f32(*x).to_bits();
                    if x.is_nan() {
                        assert!(bf16::from_bits(g).is_nan(), "{:#x}", x.to_bits());
                    } else {
                        assert_eq!(g, expected, "{:#010x} native={native}", x.to_bits());
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked >= 1 << 20);
    }
}
