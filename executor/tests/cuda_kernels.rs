//! Every registered kernel against the CPU function it must match, on random inputs, in f32,
//! bf16 and f16, with per-precision tolerances. **Needs an NVIDIA GPU** (sm_80 or newer) and
//! `libnvrtc`, `libcublasLt` (and `libnccl` for the NCCL test) on `LD_LIBRARY_PATH`; run there
//! with `cargo test -p dsplan-executor --test cuda_kernels -- --ignored`.
//!
//! 16-bit cases feed the CPU reference the inputs rounded to the storage type, so the
//! tolerance covers only the kernel's own rounding (outputs stored in 16 bits, f32 arithmetic
//! in a different order).

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use dsplan_executor::comm::Comm;
use dsplan_executor::cuda::adamw::{AdamScalars, AdamSegment, Decay};
use dsplan_executor::cuda::encoder_buckets::TokenBuckets;
use dsplan_executor::cuda::gemm::Gemm;
use dsplan_executor::cuda::launch::{Launcher, Storage};
use dsplan_executor::cuda::modules::KernelModules;
use dsplan_executor::cuda::nccl::NcclComm;
use dsplan_executor::cuda::{DeviceChoice, LaunchEnv, choose_backend};
use dsplan_executor::model::attention::{AttentionDims, attention_backward, attention_forward};
use dsplan_executor::model::classifier::{crossentropy_forward_backward, logits_forward};
use dsplan_executor::model::encoder::{encoder_backward, encoder_forward};
use dsplan_executor::model::gelu::{gelu_backward_inplace, gelu_forward};
use dsplan_executor::model::layernorm::{layernorm_backward, layernorm_forward};
use dsplan_executor::model::matmul::{add_column_sums, matmul_backward, matmul_forward};
use dsplan_executor::model::residual::residual_forward;
use dsplan_executor::optim::{AdamConfig, adam_step, sum_of_squares};
use dsplan_kernels::cache::CubinCache;

struct Gpu {
    stream: Arc<CudaStream>,
    modules: KernelModules,
}

fn gpu() -> Gpu {
    let choice = choose_backend(DeviceChoice::Cuda, 0)
        .unwrap_or_else(|e| panic!("this test needs a GPU: {e}"));
    eprintln!("running on {:?}", choice.backend);
    let ctx = CudaContext::new(0).expect("CUDA context");
    let stream = ctx.default_stream();
    let modules = KernelModules::new(ctx, CubinCache::default_dir().map(CubinCache::new))
        .expect("kernel modules");
    Gpu { stream, modules }
}

impl Gpu {
    fn launcher(&self) -> Launcher<'_> {
        Launcher::new(&self.modules, self.stream.clone())
    }
    fn up<T: DeviceRepr>(&self, host: &[T]) -> CudaSlice<T> {
        self.stream.clone_htod(host).expect("upload")
    }
    fn down<T: DeviceRepr>(&self, device: &CudaSlice<T>) -> Vec<T> {
        let host = self.stream.clone_dtoh(device).expect("download");
        self.stream.synchronize().expect("sync");
        host
    }
    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> CudaSlice<T> {
        self.stream.alloc_zeros(n).expect("alloc")
    }
}

/// A small deterministic generator (xorshift), uniform in [-scale, scale).
struct Random(u64);

impl Random {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// `host` rounded to `T`: what the GPU stores, and what the CPU reference is fed.
fn stored<T: Storage>(host: &[f32]) -> (Vec<T>, Vec<f32>) {
    let typed: Vec<T> = host.iter().map(|&x| T::from_f32(x)).collect();
    let back = typed.iter().map(|&x| x.to_f32()).collect();
    (typed, back)
}

fn to_f32<T: Storage>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

/// Relative tolerance of one stored value in `T` (a few units in the last place).
fn tolerance<T: Storage>() -> f32 {
    match T::DTYPE {
        dsplan_kernels::Dtype::F32 => 2e-5,
        dsplan_kernels::Dtype::Bf16 => 2e-2,
        _ => 4e-3,
    }
}

#[track_caller]
fn assert_close(what: &str, got: &[f32], want: &[f32], rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-6);
    let mut worst = (0usize, 0.0f32);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g - w).abs() / (w.abs() + scale * 1e-2);
        if err.is_nan() || err > worst.1 {
            worst = (i, err);
        }
    }
    assert!(
        worst.1 <= rtol,
        "{what}: element {} is {} vs {} (relative error {:.3e} > {rtol:.1e})",
        worst.0,
        got[worst.0],
        want[worst.0],
        worst.1
    );
}

fn encoder_case<T: Storage>(gpu: &Gpu) {
    let (b, t, c, v) = (3, 17, 96, 50);
    let mut rng = Random(7);
    let tokens: Vec<u32> = (0..b * t)
        .map(|i| (i * 31 % 11 + i % 3) as u32 % v as u32)
        .collect();
    let (wte_t, wte) = stored::<T>(&rng.vec(v * c, 1.0));
    let (wpe_t, wpe) = stored::<T>(&rng.vec(t * c, 1.0));
    let mut out = vec![0.0; b * t * c];
    encoder_forward(&mut out, &tokens, &wte, &wpe, t);
    let mut d_out = gpu.zeros::<T>(b * t * c);
    let (d_tokens, d_wte, d_wpe) = (gpu.up(&tokens), gpu.up(&wte_t), gpu.up(&wpe_t));
    gpu.launcher()
        .encoder_forward(
            &mut d_out.as_view_mut(),
            &d_tokens.as_view(),
            &d_wte.as_view(),
            &d_wpe.as_view(),
            t,
            c,
        )
        .expect("encoder_forward");
    assert_close(
        "encoder_forward",
        &to_f32(&gpu.down(&d_out)),
        &out,
        tolerance::<T>(),
    );

    let (dout_t, dout) = stored::<T>(&rng.vec(b * t * c, 1.0));
    let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; t * c]);
    encoder_backward(&mut dwte, &mut dwpe, &dout, &tokens, t);
    let buckets = TokenBuckets::new(&tokens).expect("small batch");
    let (mut d_dwte, mut d_dwpe) = (gpu.zeros::<T>(v * c), gpu.zeros::<T>(t * c));
    let d_dout = gpu.up(&dout_t);
    let (bt, bs, br) = (
        gpu.up(&buckets.tokens),
        gpu.up(&buckets.starts),
        gpu.up(&buckets.rows),
    );
    gpu.launcher()
        .encoder_backward(
            &mut d_dwte.as_view_mut(),
            &mut d_dwpe.as_view_mut(),
            &d_dout.as_view(),
            &bt.as_view(),
            &bs.as_view(),
            &br.as_view(),
            t,
            c,
        )
        .expect("encoder_backward");
    assert_close("dwte", &to_f32(&gpu.down(&d_dwte)), &dwte, tolerance::<T>());
    assert_close("dwpe", &to_f32(&gpu.down(&d_dwpe)), &dwpe, tolerance::<T>());
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn encoder_matches_cpu() {
    let gpu = gpu();
    encoder_case::<f32>(&gpu);
    encoder_case::<half::bf16>(&gpu);
    encoder_case::<half::f16>(&gpu);
}

fn layernorm_case<T: Storage>(gpu: &Gpu) {
    let (n, c) = (70, 200);
    let mut rng = Random(11);
    let (inp_t, inp) = stored::<T>(
        &rng.vec(n * c, 2.0)
            .iter()
            .map(|x| x + 0.5)
            .collect::<Vec<_>>(),
    );
    let (w_t, w) = stored::<T>(&rng.vec(c, 1.0));
    let (b_t, b) = stored::<T>(&rng.vec(c, 0.5));
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm_forward(&mut out, &mut mean, &mut rstd, &inp, &w, &b, 1e-5);
    let (d_inp, d_w, d_b) = (gpu.up(&inp_t), gpu.up(&w_t), gpu.up(&b_t));
    let mut d_out = gpu.zeros::<T>(n * c);
    let (mut d_mean, mut d_rstd) = (gpu.zeros::<f32>(n), gpu.zeros::<f32>(n));
    let launcher = gpu.launcher();
    launcher
        .layernorm_forward(
            &mut d_out.as_view_mut(),
            &mut d_mean.as_view_mut(),
            &mut d_rstd.as_view_mut(),
            &d_inp.as_view(),
            &d_w.as_view(),
            &d_b.as_view(),
            1e-5,
        )
        .expect("layernorm_forward");
    assert_close("ln out", &to_f32(&gpu.down(&d_out)), &out, tolerance::<T>());
    assert_close("ln mean", &gpu.down(&d_mean), &mean, 1e-5);
    assert_close("ln rstd", &gpu.down(&d_rstd), &rstd, 1e-5);

    let (dout_t, dout) = stored::<T>(&rng.vec(n * c, 1.0));
    let (dinp0_t, dinp0) = stored::<T>(&rng.vec(n * c, 0.1));
    let (mut dinp, mut dw, mut db) = (dinp0.clone(), vec![0.0; c], vec![0.0; c]);
    layernorm_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w, &mean, &rstd);
    let mut d_dinp = gpu.up(&dinp0_t);
    let (mut d_dw, mut d_db) = (gpu.zeros::<T>(c), gpu.zeros::<T>(c));
    let mut scratch = gpu.zeros::<f32>(n.div_ceil(32) * 2 * c);
    let d_dout = gpu.up(&dout_t);
    launcher
        .layernorm_backward(
            &mut d_dinp.as_view_mut(),
            &mut d_dw.as_view_mut(),
            &mut d_db.as_view_mut(),
            &mut scratch.as_view_mut(),
            &d_dout.as_view(),
            &d_inp.as_view(),
            &d_w.as_view(),
            &d_mean.as_view(),
            &d_rstd.as_view(),
        )
        .expect("layernorm_backward");
    let slack = if T::DTYPE == dsplan_kernels::Dtype::F32 {
        10.0
    } else {
        1.0
    };
    assert_close(
        "ln dinp",
        &to_f32(&gpu.down(&d_dinp)),
        &dinp,
        tolerance::<T>() * slack,
    );
    assert_close(
        "ln dweight",
        &to_f32(&gpu.down(&d_dw)),
        &dw,
        tolerance::<T>() * slack,
    );
    assert_close(
        "ln dbias",
        &to_f32(&gpu.down(&d_db)),
        &db,
        tolerance::<T>() * slack,
    );

    // Residual add fused with the LayerNorm.
    let (a_t, a) = stored::<T>(&rng.vec(n * c, 1.0));
    let mut residual = vec![0.0; n * c];
    residual_forward(&mut residual, &a, &inp);
    let (_, residual_stored) = stored::<T>(&residual);
    layernorm_forward(
        &mut out,
        &mut mean,
        &mut rstd,
        &residual_stored,
        &w,
        &b,
        1e-5,
    );
    let d_a = gpu.up(&a_t);
    let mut d_residual = gpu.zeros::<T>(n * c);
    launcher
        .residual_layernorm_forward(
            &mut d_residual.as_view_mut(),
            &mut d_out.as_view_mut(),
            &mut d_mean.as_view_mut(),
            &mut d_rstd.as_view_mut(),
            &d_a.as_view(),
            &d_inp.as_view(),
            &d_w.as_view(),
            &d_b.as_view(),
            1e-5,
        )
        .expect("residual_layernorm_forward");
    assert_close(
        "residual",
        &to_f32(&gpu.down(&d_residual)),
        &residual_stored,
        tolerance::<T>(),
    );
    assert_close(
        "residual ln",
        &to_f32(&gpu.down(&d_out)),
        &out,
        tolerance::<T>(),
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn layernorm_matches_cpu() {
    let gpu = gpu();
    layernorm_case::<f32>(&gpu);
    layernorm_case::<half::bf16>(&gpu);
    layernorm_case::<half::f16>(&gpu);
}

fn gelu_and_bias_case<T: Storage>(gpu: &Gpu) {
    let (n, oc) = (130, 72);
    let mut rng = Random(5);
    let (pre_t, pre) = stored::<T>(&rng.vec(n * oc, 4.0));
    let (bias_t, bias) = stored::<T>(&rng.vec(oc, 1.0));
    let with_bias: Vec<f32> = pre
        .iter()
        .enumerate()
        .map(|(i, x)| x + bias[i % oc])
        .collect();
    let (_, with_bias_stored) = stored::<T>(&with_bias);
    let mut out = vec![0.0; n * oc];
    gelu_forward(&mut out, &with_bias_stored);
    let mut d_pre = gpu.up(&pre_t);
    let mut d_out = gpu.zeros::<T>(n * oc);
    let d_bias = gpu.up(&bias_t);
    let launcher = gpu.launcher();
    launcher
        .bias_gelu_forward(
            &mut d_pre.as_view_mut(),
            &mut d_out.as_view_mut(),
            &d_bias.as_view(),
        )
        .expect("bias_gelu_forward");
    assert_close(
        "bias+gelu pre",
        &to_f32(&gpu.down(&d_pre)),
        &with_bias_stored,
        tolerance::<T>(),
    );
    assert_close(
        "bias+gelu out",
        &to_f32(&gpu.down(&d_out)),
        &out,
        tolerance::<T>(),
    );
    launcher
        .gelu_forward(&mut d_out.as_view_mut(), &d_pre.as_view())
        .expect("gelu_forward");
    assert_close("gelu", &to_f32(&gpu.down(&d_out)), &out, tolerance::<T>());

    let (d_t, dout) = stored::<T>(&rng.vec(n * oc, 1.0));
    let mut grad = dout.clone();
    gelu_backward_inplace(&mut grad, &with_bias_stored);
    let mut d_grad = gpu.up(&d_t);
    launcher
        .gelu_backward_inplace(&mut d_grad.as_view_mut(), &d_pre.as_view())
        .expect("gelu_backward");
    assert_close(
        "gelu backward",
        &to_f32(&gpu.down(&d_grad)),
        &grad,
        tolerance::<T>(),
    );

    let mut dbias = vec![0.0; oc];
    add_column_sums(&mut dbias, &dout);
    let mut d_dbias = gpu.zeros::<T>(oc);
    let mut scratch = gpu.zeros::<f32>(n.div_ceil(64) * oc);
    let d_dout = gpu.up(&d_t);
    launcher
        .bias_backward(
            &mut d_dbias.as_view_mut(),
            &mut scratch.as_view_mut(),
            &d_dout.as_view(),
        )
        .expect("bias_backward");
    assert_close(
        "dbias",
        &to_f32(&gpu.down(&d_dbias)),
        &dbias,
        tolerance::<T>() * 2.0,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gelu_and_bias_match_cpu() {
    let gpu = gpu();
    gelu_and_bias_case::<f32>(&gpu);
    gelu_and_bias_case::<half::bf16>(&gpu);
    gelu_and_bias_case::<half::f16>(&gpu);
}

fn attention_case<T: Storage>(gpu: &Gpu, head_dim: usize) {
    let (b, t, nh) = (2, 70, 3);
    let c = nh * head_dim;
    let dims = AttentionDims {
        batch: b,
        seq_len: t,
        n_head: nh,
        head_dim,
    };
    let mut rng = Random(3 + head_dim as u64);
    let (qkv_t, qkv) = stored::<T>(&rng.vec(b * t * 3 * c, 1.0));
    let mut out = vec![0.0; b * t * c];
    let mut att = vec![0.0; b * nh * t * t];
    attention_forward(&mut out, &mut att, &qkv, dims);
    let d_qkv = gpu.up(&qkv_t);
    let mut d_out = gpu.zeros::<T>(b * t * c);
    let mut d_lse = gpu.zeros::<f32>(b * nh * t);
    let launcher = gpu.launcher();
    launcher
        .attention_forward(
            &mut d_out.as_view_mut(),
            &mut d_lse.as_view_mut(),
            &d_qkv.as_view(),
            b,
            t,
            nh,
            head_dim,
        )
        .expect("attention_forward");
    let rtol = tolerance::<T>()
        * if T::DTYPE == dsplan_kernels::Dtype::F32 {
            20.0
        } else {
            1.0
        };
    assert_close("attention out", &to_f32(&gpu.down(&d_out)), &out, rtol);

    let (dout_t, dout) = stored::<T>(&rng.vec(b * t * c, 1.0));
    let mut dqkv = vec![0.0; qkv.len()];
    let mut datt = vec![0.0; att.len()];
    attention_backward(&mut dqkv, &mut datt, &dout, &qkv, &att, dims);
    let d_dout = gpu.up(&dout_t);
    let mut d_dqkv = gpu.zeros::<T>(qkv.len());
    let mut d_delta = gpu.zeros::<f32>(b * nh * t);
    launcher
        .attention_backward(
            &mut d_dqkv.as_view_mut(),
            &mut d_delta.as_view_mut(),
            &d_dout.as_view(),
            &d_out.as_view(),
            &d_qkv.as_view(),
            &d_lse.as_view(),
            (b, t, nh, head_dim),
        )
        .expect("attention_backward");
    assert_close(
        "attention dqkv",
        &to_f32(&gpu.down(&d_dqkv)),
        &dqkv,
        rtol * 5.0,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn attention_matches_cpu_without_a_score_matrix() {
    let gpu = gpu();
    for head_dim in [64, 128] {
        attention_case::<f32>(&gpu, head_dim);
        attention_case::<half::bf16>(&gpu, head_dim);
        attention_case::<half::f16>(&gpu, head_dim);
    }
}

fn classifier_case<T: Storage>(gpu: &Gpu) {
    let (n, v) = (9, 1000);
    let mut rng = Random(13);
    let (logits_t, logits) = stored::<T>(&rng.vec(n * v, 6.0));
    let targets: Vec<Option<u32>> = (0..n)
        .map(|i| (i != 4).then_some((i * 97 % v) as u32))
        .collect();
    let (mut grad, mut losses) = (logits.clone(), vec![0.0; n]);
    let dloss = 1.0 / 8.0;
    crossentropy_forward_backward(&mut grad, &mut losses, &targets, dloss);
    let device_targets: Vec<i32> = targets.iter().map(|t| t.map_or(-1, |t| t as i32)).collect();
    let mut d_logits = gpu.up(&logits_t);
    let mut d_losses = gpu.zeros::<f32>(n);
    let d_targets = gpu.up(&device_targets);
    gpu.launcher()
        .fused_classifier(
            &mut d_logits.as_view_mut(),
            &mut d_losses.as_view_mut(),
            &d_targets.as_view(),
            dloss,
        )
        .expect("fused_classifier");
    assert_close("losses", &gpu.down(&d_losses), &losses, 1e-5);
    assert_close(
        "dlogits",
        &to_f32(&gpu.down(&d_logits)),
        &grad,
        tolerance::<T>() * 5.0,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn classifier_matches_cpu() {
    let gpu = gpu();
    classifier_case::<f32>(&gpu);
    classifier_case::<half::bf16>(&gpu);
    classifier_case::<half::f16>(&gpu);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn casts_round_like_the_half_crate() {
    let gpu = gpu();
    let mut rng = Random(17);
    let mut values = rng.vec(10_000, 100.0);
    values.extend([
        0.0,
        -0.0,
        1e-30,
        65504.0,
        70000.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    let d_values = gpu.up(&values);
    let mut d_bf16 = gpu.zeros::<half::bf16>(values.len());
    let mut d_f16 = gpu.zeros::<half::f16>(values.len());
    let launcher = gpu.launcher();
    launcher
        .cast(&mut d_bf16.as_view_mut(), &d_values.as_view())
        .expect("to bf16");
    launcher
        .cast(&mut d_f16.as_view_mut(), &d_values.as_view())
        .expect("to f16");
    let bf16: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let f16: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
    assert_eq!(gpu.down(&d_bf16), bf16);
    assert_eq!(gpu.down(&d_f16), f16);
    let mut back = gpu.zeros::<f32>(values.len());
    launcher
        .cast(&mut back.as_view_mut(), &d_bf16.as_view())
        .expect("from bf16");
    assert_eq!(gpu.down(&back), to_f32(&bf16));
    launcher
        .cast(&mut back.as_view_mut(), &d_f16.as_view())
        .expect("from f16");
    assert_eq!(gpu.down(&back), to_f32(&f16));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn unscale_norm_matches_cpu_and_flags_overflow() {
    let gpu = gpu();
    let mut rng = Random(19);
    let grads = rng.vec(1_000_003, 3.0);
    let inv_scale = 1.0 / 1024.0f32;
    let unscaled: Vec<f32> = grads.iter().map(|g| g * inv_scale).collect();
    let want = sum_of_squares(&unscaled);
    let mut d_grads = gpu.up(&grads);
    let mut partials = gpu.zeros::<f64>(1024);
    let mut total = gpu.zeros::<f64>(1);
    let mut found_inf = gpu.zeros::<i32>(1);
    let launcher = gpu.launcher();
    launcher
        .unscale_and_norm(
            &mut d_grads.as_view_mut(),
            inv_scale,
            &mut partials.as_view_mut(),
            &mut total.as_view_mut(),
            &mut found_inf.as_view_mut(),
        )
        .expect("unscale_and_norm");
    let got = gpu.down(&total)[0];
    assert!((got - want).abs() <= want * 1e-12, "{got} vs {want}");
    assert_eq!(gpu.down(&found_inf), vec![0]);
    assert_eq!(gpu.down(&d_grads), unscaled);
    let mut with_nan = grads.clone();
    with_nan[123_456] = f32::NAN;
    let mut d_nan = gpu.up(&with_nan);
    launcher
        .unscale_and_norm(
            &mut d_nan.as_view_mut(),
            1.0,
            &mut partials.as_view_mut(),
            &mut total.as_view_mut(),
            &mut found_inf.as_view_mut(),
        )
        .expect("unscale_and_norm");
    assert_eq!(gpu.down(&found_inf), vec![1]);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn adamw_matches_cpu_adam_step_and_writes_the_16_bit_copy() {
    let gpu = gpu();
    let mut rng = Random(23);
    let n = 100_000;
    let config = AdamConfig {
        weight_decay: 0.1,
        ..AdamConfig::default()
    };
    let params = rng.vec(n, 1.0);
    let (grads_t, grads) = stored::<half::bf16>(&rng.vec(n, 0.01));
    // Two segments: the first decays, the second is exempt (run on the CPU as two calls).
    let split = 60_000;
    let (mut cpu_p, mut m, mut v) = (params.clone(), vec![0.0; n], vec![0.0; n]);
    let lr = 6e-4;
    adam_step(
        &mut cpu_p[..split],
        &grads[..split],
        &mut m[..split],
        &mut v[..split],
        1,
        lr,
        &config,
    )
    .expect("decayed");
    let no_decay = AdamConfig {
        weight_decay: 0.0,
        ..config
    };
    adam_step(
        &mut cpu_p[split..],
        &grads[split..],
        &mut m[split..],
        &mut v[split..],
        1,
        lr,
        &no_decay,
    )
    .expect("exempt");
    let segments = [
        AdamSegment::new(0, split, Decay::Apply),
        AdamSegment::new(split, n - split, Decay::Exempt),
    ];
    let mut d_master = gpu.up(&params);
    let mut d_copy = gpu.zeros::<half::bf16>(n);
    let d_grads = gpu.up(&grads_t);
    let (mut d_m, mut d_v) = (gpu.zeros::<f32>(n), gpu.zeros::<f32>(n));
    let d_segments = gpu.up(&segments);
    gpu.launcher()
        .adamw(
            &mut d_master.as_view_mut(),
            Some(&mut d_copy.as_view_mut()),
            &d_grads.as_view(),
            &mut d_m.as_view_mut(),
            &mut d_v.as_view_mut(),
            &d_segments.as_view(),
            &segments,
            AdamScalars::new(&config, 1, lr, 1.0),
        )
        .expect("adamw");
    let master = gpu.down(&d_master);
    assert_close("master", &master, &cpu_p, 1e-6);
    assert_close("exp_avg", &gpu.down(&d_m), &m, 1e-6);
    assert_close("exp_avg_sq", &gpu.down(&d_v), &v, 1e-6);
    let copy: Vec<half::bf16> = master.iter().map(|&p| half::bf16::from_f32(p)).collect();
    assert_eq!(gpu.down(&d_copy), copy);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn cublaslt_gemms_match_cpu_matmul() {
    let gpu = gpu();
    let gemm = Gemm::new(gpu.stream.clone()).expect("cuBLASLt");
    let (n, ic, oc) = (64, 96, 160);
    let mut rng = Random(29);
    let (inp, w, bias) = (
        rng.vec(n * ic, 1.0),
        rng.vec(ic * oc, 0.1),
        rng.vec(oc, 0.5),
    );
    let mut out = vec![0.0; n * oc];
    matmul_forward(&mut out, &inp, &w, &bias);
    let (d_inp, d_w, d_bias) = (gpu.up(&inp), gpu.up(&w), gpu.up(&bias));
    let mut d_out = gpu.zeros::<f32>(n * oc);
    gemm.matmul_forward(
        &mut d_out.as_view_mut(),
        &d_inp.as_view(),
        &d_w.as_view(),
        Some(&d_bias.as_view()),
        (n, ic, oc),
    )
    .expect("matmul_forward");
    // f32 GEMMs run in TF32 (cudarc's compute type): about 1e-3 relative.
    assert_close("matmul_forward", &gpu.down(&d_out), &out, 5e-3);

    let dout = rng.vec(n * oc, 1.0);
    let (mut dinp, mut dw, mut db) = (vec![0.0; n * ic], vec![0.0; ic * oc], vec![0.0; oc]);
    matmul_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w);
    let d_dout = gpu.up(&dout);
    let mut d_dinp = gpu.zeros::<f32>(n * ic);
    let mut d_dw = gpu.zeros::<f32>(ic * oc);
    gemm.matmul_backward_input(
        &mut d_dinp.as_view_mut(),
        &d_dout.as_view(),
        &d_w.as_view(),
        (n, ic, oc),
    )
    .expect("dinp");
    gemm.matmul_backward_weight(
        &mut d_dw.as_view_mut(),
        &d_inp.as_view(),
        &d_dout.as_view(),
        (n, ic, oc),
    )
    .expect("dweight");
    assert_close("dinp", &gpu.down(&d_dinp), &dinp, 5e-3);
    assert_close("dweight", &gpu.down(&d_dw), &dw, 5e-3);

    let (v, c) = (300, ic);
    let wte = rng.vec(v * c, 0.2);
    let mut logits = vec![0.0; n * v];
    logits_forward(&mut logits, &inp, &wte, c);
    let d_wte = gpu.up(&wte);
    let mut d_logits = gpu.zeros::<f32>(n * v);
    gemm.logits_forward(
        &mut d_logits.as_view_mut(),
        &d_inp.as_view(),
        &d_wte.as_view(),
        (n, c, v),
    )
    .expect("logits");
    assert_close("logits", &gpu.down(&d_logits), &logits, 5e-3);

    // bf16 on tensor cores.
    let (inp_t, inp_r) = stored::<half::bf16>(&inp);
    let (w_t, w_r) = stored::<half::bf16>(&w);
    let (bias_t, bias_r) = stored::<half::bf16>(&bias);
    matmul_forward(&mut out, &inp_r, &w_r, &bias_r);
    let (d_inp, d_w, d_bias) = (gpu.up(&inp_t), gpu.up(&w_t), gpu.up(&bias_t));
    let mut d_out = gpu.zeros::<half::bf16>(n * oc);
    gemm.matmul_forward(
        &mut d_out.as_view_mut(),
        &d_inp.as_view(),
        &d_w.as_view(),
        Some(&d_bias.as_view()),
        (n, ic, oc),
    )
    .expect("bf16 matmul_forward");
    assert_close(
        "bf16 matmul_forward",
        &to_f32(&gpu.down(&d_out)),
        &out,
        2e-2,
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and libnccl"]
fn nccl_world_of_one_round_trips() {
    let gpu = gpu();
    let env = LaunchEnv::from_lookup(|_| None).expect("job of one");
    let mut comm =
        NcclComm::from_env(gpu.stream.clone(), &env, Duration::from_secs(30)).expect("NCCL");
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    let mut data = vec![1.5f32, -2.0, 3.25];
    comm.all_reduce(&mut data, dsplan_executor::comm::ReduceOp::Sum)
        .expect("all_reduce");
    assert_eq!(data, vec![1.5, -2.0, 3.25]);
    let mut gathered = vec![0.0; 3];
    comm.all_gather(&data, &mut gathered).expect("all_gather");
    assert_eq!(gathered, data);
    assert_eq!(
        comm.all_reduce_scalar(2.5, dsplan_executor::comm::ReduceOp::Max)
            .expect("scalar"),
        2.5
    );
    comm.barrier().expect("barrier");
    assert!(comm.all_gather(&data, &mut [0.0; 4]).is_err());
}
