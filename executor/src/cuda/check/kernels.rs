//! Every registered kernel against the CPU function it must match, on random inputs, in f32,
//! bf16 and f16, with per-precision tolerances; every cuBLASLt product against a row-major
//! reference ([`products`]); and NCCL's world of one. Each comparison is a [`CheckRow`]. The
//! Llama family's own kernels (RMSNorm, RoPE, SwiGLU) are in [`llama`]; attention is one case
//! for both families (one key/value head per query head, and grouped).
//!
//! 16-bit cases feed the CPU reference the inputs rounded to the storage type, so the
//! tolerance covers only the kernel's own rounding (outputs stored in 16 bits, f32 arithmetic
//! in a different order).

use std::time::{Duration, Instant};

use dsplan_kernels::{Dtype, KERNELS, SOURCES};
use dsplan_planner::memory::cuda_layout::padded_vocab;

use super::compare::{CheckKind, CheckRow, Metric};
use super::gpu::Gpu;
use crate::comm::{Comm, ReduceOp};
use crate::cuda::adamw::{AdamScalars, AdamSegment, Decay};
use crate::cuda::element::strided_len;
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::error::CudaError;
use crate::cuda::launch::{GroupedAttention, Heads, Storage};
use crate::cuda::nccl::NcclComm;
use crate::launch::LaunchEnv;
use crate::model::attention::{
    AttentionDims, grouped_attention_backward, grouped_attention_forward,
};
use crate::model::classifier::crossentropy_forward_backward;
use crate::model::encoder::{encoder_backward, encoder_forward};
use crate::model::gelu::{gelu_backward_inplace, gelu_forward};
use crate::model::layernorm::{layernorm_backward, layernorm_forward};
use crate::model::matmul::add_column_sums;
use crate::model::residual::{accumulate, residual_forward};
use crate::optim::{AdamConfig, adam_step, sum_of_squares};
use crate::train::AttentionKernel;

/// A case: its rows, or why it could not run.
pub type Case = fn(&Gpu) -> Result<Vec<CheckRow>, String>;

/// Every case, in the order `dsplan report --check` runs them.
pub const CASES: &[(&str, Case)] = &[
    ("encoder", |gpu| all_dtypes(gpu, encoder_case)),
    ("layernorm", |gpu| all_dtypes(gpu, layernorm_case)),
    ("gelu and bias", |gpu| all_dtypes(gpu, gelu_and_bias_case)),
    ("accumulate", |gpu| all_dtypes(gpu, accumulate_case)),
    ("attention", |gpu| attention(gpu, Heads::Shared)),
    ("classifier", |gpu| all_dtypes(gpu, classifier_case)),
    ("rmsnorm", |gpu| all_dtypes(gpu, llama::rmsnorm_case)),
    ("rope", |gpu| all_dtypes(gpu, llama::rope_case)),
    ("swiglu", |gpu| all_dtypes(gpu, llama::swiglu_case)),
    ("grouped-query attention", |gpu| {
        attention(gpu, Heads::Grouped)
    }),
    ("casts", |gpu| rows(gpu, casts)),
    ("unscale and norm", |gpu| rows(gpu, unscale_norm)),
    ("adamw", |gpu| rows(gpu, adamw)),
    ("cuBLASLt", |gpu| rows(gpu, products::cublaslt)),
    ("NCCL", nccl_world_of_one),
];

/// The rows of one case body; its error in words.
fn rows(
    gpu: &Gpu,
    body: fn(&Gpu, &mut Vec<CheckRow>) -> Result<(), CudaError>,
) -> Result<Vec<CheckRow>, String> {
    let mut out = Vec::new();
    body(gpu, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// A generic case in f32, bf16 and f16.
fn all_dtypes(
    gpu: &Gpu,
    case: fn(&Gpu, &mut Vec<CheckRow>, Precision) -> Result<(), CudaError>,
) -> Result<Vec<CheckRow>, String> {
    let mut out = Vec::new();
    for precision in Precision::ALL {
        case(gpu, &mut out, precision).map_err(|e| format!("{}: {e}", precision.dtype()))?;
    }
    Ok(out)
}

/// The storage type a generic case runs in.
#[derive(Debug, Clone, Copy)]
enum Precision {
    F32,
    Bf16,
    F16,
}

impl Precision {
    const ALL: [Precision; 3] = [Precision::F32, Precision::Bf16, Precision::F16];

    fn dtype(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::F16 => "f16",
        }
    }
}

/// Dispatches a generic case body over a [`Precision`].
macro_rules! typed {
    ($precision:expr, $body:ident, $($arg:expr),*) => {
        match $precision {
            Precision::F32 => $body::<f32>($($arg),*),
            Precision::Bf16 => $body::<half::bf16>($($arg),*),
            Precision::F16 => $body::<half::f16>($($arg),*),
        }
    };
}

mod llama;
mod products;

/// Compiles every kernel file for the device (or reads it from the kernel cache) and looks up
/// every entry point of every registered kernel: one row per file.
pub fn compile_all(gpu: &Gpu) -> Vec<CheckRow> {
    SOURCES
        .iter()
        .map(|source| {
            let start = Instant::now();
            let specs: Vec<_> = KERNELS
                .iter()
                .filter(|k| k.source.file_name == source.file_name)
                .collect();
            let mut entries = 0;
            for spec in &specs {
                for entry in spec.entry_points {
                    if let Err(e) = gpu.modules.function(spec, entry) {
                        return CheckRow::failed(
                            CheckKind::Compile,
                            source.file_name,
                            format!("{}: {e}", entry),
                        );
                    }
                    entries += 1;
                }
            }
            let outcome = gpu
                .modules
                .cache_outcomes()
                .into_iter()
                .find(|(name, _)| *name == source.file_name)
                .map_or_else(|| "not loaded".to_string(), |(_, o)| format!("{o:?}"));
            CheckRow::done(
                CheckKind::Compile,
                source.file_name,
                format!(
                    "{} kernels, {entries} entry points for {}, {:.2} s ({outcome})",
                    specs.len(),
                    gpu.arch,
                    start.elapsed().as_secs_f64()
                ),
            )
        })
        .collect()
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
fn tolerance<T: Storage>() -> f64 {
    match T::DTYPE {
        Dtype::F32 => 2e-5,
        Dtype::Bf16 => 2e-2,
        _ => 4e-3,
    }
}

fn dtype<T: Storage>() -> &'static str {
    T::DTYPE.suffix()
}

fn encoder_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    typed!(p, encoder_typed, gpu, out)
}

fn encoder_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (b, t, c, v) = (3, 17, 96, 50);
    let mut rng = Random(7);
    let tokens: Vec<u32> = (0..b * t)
        .map(|i| (i * 31 % 11 + i % 3) as u32 % v as u32)
        .collect();
    let (wte_t, wte) = stored::<T>(&rng.vec(v * c, 1.0));
    let (wpe_t, wpe) = stored::<T>(&rng.vec(t * c, 1.0));
    let mut out = vec![0.0; b * t * c];
    encoder_forward(&mut out, &tokens, &wte, &wpe, t);
    let mut d_out = gpu.zeros::<T>(b * t * c)?;
    let (d_tokens, d_wte, d_wpe) = (gpu.up(&tokens)?, gpu.up(&wte_t)?, gpu.up(&wpe_t)?);
    gpu.launcher().encoder_forward(
        &mut d_out.as_view_mut(),
        &d_tokens.as_view(),
        &d_wte.as_view(),
        &d_wpe.as_view(),
        t,
        c,
    )?;
    let tol = tolerance::<T>();
    rows.push(CheckRow::relative(
        "encoder_forward",
        dtype::<T>(),
        &to_f32(&gpu.down(&d_out)?),
        &out,
        tol,
    ));

    let (dout_t, dout) = stored::<T>(&rng.vec(b * t * c, 1.0));
    let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; t * c]);
    encoder_backward(&mut dwte, &mut dwpe, &dout, &tokens, t);
    let buckets = TokenBuckets::new(&tokens)
        .ok_or_else(|| CudaError::Shape("token buckets: batch too large".to_string()))?;
    let (mut d_dwte, mut d_dwpe) = (gpu.zeros::<T>(v * c)?, gpu.zeros::<T>(t * c)?);
    let d_dout = gpu.up(&dout_t)?;
    let (bt, bs, br) = (
        gpu.up(&buckets.tokens)?,
        gpu.up(&buckets.starts)?,
        gpu.up(&buckets.rows)?,
    );
    gpu.launcher().encoder_backward(
        &mut d_dwte.as_view_mut(),
        &mut d_dwpe.as_view_mut(),
        &d_dout.as_view(),
        &bt.as_view(),
        &bs.as_view(),
        &br.as_view(),
        t,
        c,
    )?;
    rows.push(CheckRow::relative(
        "encoder_backward dwte",
        dtype::<T>(),
        &to_f32(&gpu.down(&d_dwte)?),
        &dwte,
        tol,
    ));
    rows.push(CheckRow::relative(
        "encoder_backward dwpe",
        dtype::<T>(),
        &to_f32(&gpu.down(&d_dwpe)?),
        &dwpe,
        tol,
    ));
    Ok(())
}

/// LayerNorm at three widths: 200 channels; 776, whose 16-bit rows the backward kernel reads in
/// 16-byte chunks, up to four a lane (one in the last slot); and 100, not a whole number of
/// chunks, which keeps its 16-bit loads. The rows of the last two are named with their width.
fn layernorm_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    for (c, label) in [(200, ""), (776, ", 776 channels"), (100, ", 100 channels")] {
        let mut rows = Vec::new();
        typed!(p, layernorm_typed, gpu, &mut rows, c)?;
        out.extend(rows.into_iter().map(|mut row| {
            row.name.push_str(label);
            row
        }));
    }
    Ok(())
}

fn layernorm_typed<T: Storage>(
    gpu: &Gpu,
    rows: &mut Vec<CheckRow>,
    c: usize,
) -> Result<(), CudaError> {
    let n = 70;
    let dt = dtype::<T>();
    let tol = tolerance::<T>();
    let mut rng = Random(11);
    let shifted: Vec<f32> = rng.vec(n * c, 2.0).iter().map(|x| x + 0.5).collect();
    let (inp_t, inp) = stored::<T>(&shifted);
    let (w_t, w) = stored::<T>(&rng.vec(c, 1.0));
    let (b_t, b) = stored::<T>(&rng.vec(c, 0.5));
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm_forward(&mut out, &mut mean, &mut rstd, &inp, &w, &b, 1e-5);
    let (d_inp, d_w, d_b) = (gpu.up(&inp_t)?, gpu.up(&w_t)?, gpu.up(&b_t)?);
    let mut d_out = gpu.zeros::<T>(n * c)?;
    let (mut d_mean, mut d_rstd) = (gpu.zeros::<f32>(n)?, gpu.zeros::<f32>(n)?);
    let launcher = gpu.launcher();
    launcher.layernorm_forward(
        &mut d_out.as_view_mut(),
        &mut d_mean.as_view_mut(),
        &mut d_rstd.as_view_mut(),
        &d_inp.as_view(),
        &d_w.as_view(),
        &d_b.as_view(),
        1e-5,
    )?;
    rows.push(CheckRow::relative(
        "layernorm_forward out",
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        tol,
    ));
    rows.push(CheckRow::relative(
        "layernorm_forward mean",
        dt,
        &gpu.down(&d_mean)?,
        &mean,
        1e-5,
    ));
    rows.push(CheckRow::relative(
        "layernorm_forward rstd",
        dt,
        &gpu.down(&d_rstd)?,
        &rstd,
        1e-5,
    ));

    let (dout_t, dout) = stored::<T>(&rng.vec(n * c, 1.0));
    let (dinp0_t, dinp0) = stored::<T>(&rng.vec(n * c, 0.1));
    let (mut dinp, mut dw, mut db) = (dinp0.clone(), vec![0.0; c], vec![0.0; c]);
    layernorm_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w, &mean, &rstd);
    let mut d_dinp = gpu.up(&dinp0_t)?;
    let (mut d_dw, mut d_db) = (gpu.zeros::<T>(c)?, gpu.zeros::<T>(c)?);
    let mut scratch = gpu.zeros::<f32>(n.div_ceil(32) * 2 * c)?;
    let d_dout = gpu.up(&dout_t)?;
    launcher.layernorm_backward(
        &mut d_dinp.as_view_mut(),
        &mut d_dw.as_view_mut(),
        &mut d_db.as_view_mut(),
        &mut scratch.as_view_mut(),
        &d_dout.as_view(),
        &d_inp.as_view(),
        &d_w.as_view(),
        &d_mean.as_view(),
        &d_rstd.as_view(),
    )?;
    let slack = if T::DTYPE == Dtype::F32 { 10.0 } else { 1.0 };
    for (name, device, want) in [
        ("layernorm_backward dinp", &d_dinp, &dinp),
        ("layernorm_backward dweight", &d_dw, &dw),
        ("layernorm_backward dbias", &d_db, &db),
    ] {
        rows.push(CheckRow::relative(
            name,
            dt,
            &to_f32(&gpu.down(device)?),
            want,
            tol * slack,
        ));
    }

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
    let d_a = gpu.up(&a_t)?;
    let mut d_residual = gpu.zeros::<T>(n * c)?;
    launcher.residual_layernorm_forward(
        &mut d_residual.as_view_mut(),
        &mut d_out.as_view_mut(),
        &mut d_mean.as_view_mut(),
        &mut d_rstd.as_view_mut(),
        &d_a.as_view(),
        &d_inp.as_view(),
        &d_w.as_view(),
        &d_b.as_view(),
        1e-5,
    )?;
    rows.push(CheckRow::relative(
        "residual_layernorm_forward residual",
        dt,
        &to_f32(&gpu.down(&d_residual)?),
        &residual_stored,
        tol,
    ));
    rows.push(CheckRow::relative(
        "residual_layernorm_forward out",
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        tol,
    ));
    Ok(())
}

fn accumulate_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    typed!(p, accumulate_typed, gpu, out)
}

/// A reduced bucket added into a gradient partition, 16-bit stores rounded as the kernel's.
fn accumulate_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let n = 1000;
    let mut rng = Random(11);
    let (dst_t, dst) = stored::<T>(&rng.vec(n, 2.0));
    let (src_t, src) = stored::<T>(&rng.vec(n, 2.0));
    let mut sum = dst;
    accumulate(&mut sum, &src);
    let mut d_dst = gpu.up(&dst_t)?;
    let d_src = gpu.up(&src_t)?;
    gpu.launcher()
        .accumulate(&mut d_dst.as_view_mut(), &d_src.as_view())?;
    rows.push(CheckRow::relative(
        "accumulate",
        dtype::<T>(),
        &to_f32(&gpu.down(&d_dst)?),
        &sum,
        tolerance::<T>(),
    ));
    Ok(())
}

fn gelu_and_bias_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    typed!(p, gelu_and_bias_typed, gpu, out)
}

fn gelu_and_bias_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, oc) = (130, 72);
    let dt = dtype::<T>();
    let tol = tolerance::<T>();
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
    let mut d_pre = gpu.up(&pre_t)?;
    let mut d_out = gpu.zeros::<T>(n * oc)?;
    let d_bias = gpu.up(&bias_t)?;
    let launcher = gpu.launcher();
    launcher.bias_gelu_forward(
        &mut d_pre.as_view_mut(),
        &mut d_out.as_view_mut(),
        &d_bias.as_view(),
    )?;
    rows.push(CheckRow::relative(
        "bias_gelu_forward pre",
        dt,
        &to_f32(&gpu.down(&d_pre)?),
        &with_bias_stored,
        tol,
    ));
    rows.push(CheckRow::relative(
        "bias_gelu_forward out",
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        tol,
    ));
    launcher.gelu_forward(&mut d_out.as_view_mut(), &d_pre.as_view())?;
    rows.push(CheckRow::relative(
        "gelu_forward",
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        tol,
    ));

    let (d_t, dout) = stored::<T>(&rng.vec(n * oc, 1.0));
    let mut grad = dout.clone();
    gelu_backward_inplace(&mut grad, &with_bias_stored);
    let mut d_grad = gpu.up(&d_t)?;
    launcher.gelu_backward_inplace(&mut d_grad.as_view_mut(), &d_pre.as_view())?;
    rows.push(CheckRow::relative(
        "gelu_backward_inplace",
        dt,
        &to_f32(&gpu.down(&d_grad)?),
        &grad,
        tol,
    ));

    let mut dbias = vec![0.0; oc];
    add_column_sums(&mut dbias, &dout);
    let mut d_dbias = gpu.zeros::<T>(oc)?;
    let mut scratch = gpu.zeros::<f32>(n.div_ceil(64) * oc)?;
    let d_dout = gpu.up(&d_t)?;
    launcher.bias_backward(
        &mut d_dbias.as_view_mut(),
        &mut scratch.as_view_mut(),
        &d_dout.as_view(),
    )?;
    rows.push(CheckRow::relative(
        "bias_backward (column_partials, add_partials)",
        dt,
        &to_f32(&gpu.down(&d_dbias)?),
        &dbias,
        tol * 2.0,
    ));
    Ok(())
}

/// Attention against `grouped_attention_forward` / `_backward` (GPT-2's attention when every
/// query head has its own key/value head), head sizes 64 and 128: [`Heads::Shared`] with
/// three heads, [`Heads::Grouped`] with four query heads sharing two key/value heads and four
/// sharing one. Both implementations: the scalar kernels (`attention_*` rows, every
/// precision) and the tensor-core kernels (`attention_tc_*` rows, bf16 and f16). T = 70 is
/// not a multiple of any tile, so partial tiles and the causal diagonal inside a tile are
/// both exercised.
pub(super) fn attention(gpu: &Gpu, heads: Heads) -> Result<Vec<CheckRow>, String> {
    let groups: &[(usize, usize)] = match heads {
        Heads::Shared => &[(3, 3)],
        Heads::Grouped => &[(4, 2), (4, 1)],
    };
    let mut out = Vec::new();
    for head_dim in [64, 128] {
        for &(n_head, kv_heads) in groups {
            let dims = GroupedAttention {
                batch: 2,
                seq_len: 70,
                n_head,
                kv_heads,
                head_dim,
            };
            for kernel in [AttentionKernel::Scalar, AttentionKernel::TensorCore] {
                for p in Precision::ALL {
                    if kernel == AttentionKernel::TensorCore && matches!(p, Precision::F32) {
                        continue; // f32 keeps the scalar kernels
                    }
                    typed!(p, attention_typed, gpu, &mut out, dims, (heads, kernel)).map_err(
                        |e| {
                            format!(
                                "{kernel} attention, head size {head_dim}, {n_head} heads over \
                                 {kv_heads}, {}: {e}",
                                p.dtype()
                            )
                        },
                    )?;
                }
            }
        }
    }
    Ok(out)
}

fn attention_typed<T: Storage>(
    gpu: &Gpu,
    rows: &mut Vec<CheckRow>,
    gqa: GroupedAttention,
    (heads, kernel): (Heads, AttentionKernel),
) -> Result<(), CudaError> {
    let GroupedAttention {
        batch: b,
        seq_len: t,
        n_head: nh,
        kv_heads,
        head_dim,
    } = gqa;
    let a = nh * head_dim;
    let width = (nh + 2 * kv_heads) * head_dim;
    let dt = dtype::<T>();
    let dims = AttentionDims {
        batch: b,
        seq_len: t,
        n_head: nh,
        head_dim,
    };
    let prefix = match kernel {
        AttentionKernel::Scalar => "attention",
        AttentionKernel::TensorCore => "attention_tc",
    };
    let (suffix, label, seed) = match heads {
        Heads::Shared => ("", format!("hs{head_dim}"), 3 + head_dim as u64),
        Heads::Grouped => (
            "_gqa",
            format!("hs{head_dim} {nh}q/{kv_heads}kv"),
            23 + head_dim as u64 + kv_heads as u64,
        ),
    };
    let mut rng = Random(seed);
    let (qkv_t, qkv) = stored::<T>(&rng.vec(b * t * width, 1.0));
    let mut out = vec![0.0; b * t * a];
    let mut att = vec![0.0; b * nh * t * t];
    grouped_attention_forward(&mut out, &mut att, &qkv, dims, kv_heads);
    let d_qkv = gpu.up(&qkv_t)?;
    let mut d_out = gpu.zeros::<T>(b * t * a)?;
    let mut d_lse = gpu.zeros::<f32>(b * nh * t)?;
    let launcher = gpu.launcher();
    launcher.attention_forward(
        &mut d_out.as_view_mut(),
        &mut d_lse.as_view_mut(),
        &d_qkv.as_view(),
        gqa,
        (heads, kernel),
    )?;
    // The tensor-core kernels round P (forward, dk/dv) and dS (dk, dq) to the storage type
    // before their products, as FlashAttention does (f32 accumulation, like the scalar kernels).
    // Each output element then carries sum_i |p_i e_i x_i| / l, e_i <= u (unit roundoff: 2^-9
    // bf16, 2^-11 f16), at most u max|x| = u here (inputs uniform in [-1, 1]); the metric
    // divides by |w| + 1e-2 max|w|, and max|w| is about 1 (query 0 attends to key 0 alone), so
    // the rounding adds at most u / 1e-2 (0.195 bf16, 0.049 f16) to the scalar tolerance. A
    // lane emulation of attention_tc.cu on these shapes (kernels/tools/attention_tc_emulate.py)
    // gave at most 0.082 forward and 0.095 dqkv in bf16, 0.012 and 0.012 in f16; a wrong
    // fragment, tile or mask is O(1).
    let rounded_operand = match (kernel, T::DTYPE) {
        (AttentionKernel::Scalar, _) | (_, Dtype::F32) => 0.0,
        (AttentionKernel::TensorCore, Dtype::Bf16) => 2f64.powi(-9) / 1e-2,
        (AttentionKernel::TensorCore, _) => 2f64.powi(-11) / 1e-2,
    };
    let rtol = tolerance::<T>() * if T::DTYPE == Dtype::F32 { 20.0 } else { 1.0 };
    rows.push(CheckRow::relative(
        &format!("{prefix}_forward{suffix} {label}"),
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        rtol + rounded_operand,
    ));

    let (dout_t, dout) = stored::<T>(&rng.vec(b * t * a, 1.0));
    let mut dqkv = vec![0.0; qkv.len()];
    let mut datt = vec![0.0; att.len()];
    grouped_attention_backward(&mut dqkv, &mut datt, &dout, &qkv, &att, dims, kv_heads);
    let d_dout = gpu.up(&dout_t)?;
    let mut d_dqkv = gpu.zeros::<T>(qkv.len())?;
    let mut d_delta = gpu.zeros::<f32>(b * nh * t)?;
    launcher.attention_backward(
        &mut d_dqkv.as_view_mut(),
        &mut d_delta.as_view_mut(),
        &d_dout.as_view(),
        &d_out.as_view(),
        &d_qkv.as_view(),
        &d_lse.as_view(),
        gqa,
        (heads, kernel),
    )?;
    rows.push(CheckRow::relative(
        &format!("{prefix}_backward{suffix} {label} dqkv"),
        dt,
        &to_f32(&gpu.down(&d_dqkv)?),
        &dqkv,
        rtol * 5.0 + rounded_operand,
    ));
    Ok(())
}

fn classifier_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    typed!(p, classifier_typed, gpu, out)
}

/// The classifier on logits with padded rows, as the step lays them out (`V = 1000` in rows
/// `Vp = 1024` apart, [`padded_vocab`]): the losses and the real columns' gradient against
/// the CPU model's unpadded ones, and the padding, filled with NaN, left as it was (a kernel
/// that read it would also turn the losses NaN).
fn classifier_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, v) = (9, 1000);
    let stride = padded_vocab(v as u64) as usize;
    let dt = dtype::<T>();
    let mut rng = Random(13);
    let (_, logits) = stored::<T>(&rng.vec(n * v, 6.0));
    let mut padded = vec![f32::NAN; strided_len(n, v, stride)];
    for (row, real) in padded.chunks_mut(stride).zip(logits.chunks(v)) {
        row[..v].copy_from_slice(real);
    }
    let (padded_t, _) = stored::<T>(&padded);
    let targets: Vec<Option<u32>> = (0..n)
        .map(|i| (i != 4).then_some((i * 97 % v) as u32))
        .collect();
    let (mut grad, mut losses) = (logits.clone(), vec![0.0; n]);
    let dloss = 1.0 / 8.0;
    crossentropy_forward_backward(&mut grad, &mut losses, &targets, dloss);
    let device_targets: Vec<i32> = targets.iter().map(|t| t.map_or(-1, |t| t as i32)).collect();
    let mut d_logits = gpu.up(&padded_t)?;
    let mut d_losses = gpu.zeros::<f32>(n)?;
    let d_targets = gpu.up(&device_targets)?;
    gpu.launcher().fused_classifier(
        &mut d_logits.as_view_mut(),
        &mut d_losses.as_view_mut(),
        &d_targets.as_view(),
        dloss,
        (v, stride),
    )?;
    let back = to_f32(&gpu.down(&d_logits)?);
    let (mut real, mut padding) = (Vec::new(), Vec::new());
    for row in back.chunks(stride) {
        let (r, p) = row.split_at(v.min(row.len()));
        real.extend_from_slice(r);
        padding.extend_from_slice(p);
    }
    rows.push(CheckRow::relative(
        "fused_classifier losses",
        dt,
        &gpu.down(&d_losses)?,
        &losses,
        1e-5,
    ));
    rows.push(CheckRow::relative(
        "fused_classifier dlogits",
        dt,
        &real,
        &grad,
        tolerance::<T>() * 5.0,
    ));
    rows.push(CheckRow::exact(
        "fused_classifier row padding untouched",
        dt,
        &padding,
        &vec![f32::NAN; padding.len()],
    ));
    Ok(())
}

/// f32 to bf16 and f16 and back, bit for bit against the `half` crate's rounding.
fn casts(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
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
    let d_values = gpu.up(&values)?;
    let mut d_bf16 = gpu.zeros::<half::bf16>(values.len())?;
    let mut d_f16 = gpu.zeros::<half::f16>(values.len())?;
    let launcher = gpu.launcher();
    launcher.cast(&mut d_bf16.as_view_mut(), &d_values.as_view())?;
    launcher.cast(&mut d_f16.as_view_mut(), &d_values.as_view())?;
    let bf16: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let f16: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
    rows.push(CheckRow::exact(
        "cast f32 -> bf16",
        "bf16",
        &gpu.down(&d_bf16)?,
        &bf16,
    ));
    rows.push(CheckRow::exact(
        "cast f32 -> f16",
        "f16",
        &gpu.down(&d_f16)?,
        &f16,
    ));
    let mut back = gpu.zeros::<f32>(values.len())?;
    launcher.cast(&mut back.as_view_mut(), &d_bf16.as_view())?;
    rows.push(CheckRow::exact(
        "cast bf16 -> f32",
        "bf16",
        &gpu.down(&back)?,
        &to_f32(&bf16),
    ));
    launcher.cast(&mut back.as_view_mut(), &d_f16.as_view())?;
    rows.push(CheckRow::exact(
        "cast f16 -> f32",
        "f16",
        &gpu.down(&back)?,
        &to_f32(&f16),
    ));
    Ok(())
}

/// The unscale-and-norm kernels: the unscaled gradients exactly, their sum of squares in f64,
/// and the overflow flag for a NaN.
fn unscale_norm(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let mut rng = Random(19);
    let grads = rng.vec(1_000_003, 3.0);
    let inv_scale = 1.0 / 1024.0f32;
    let unscaled: Vec<f32> = grads.iter().map(|g| g * inv_scale).collect();
    let want = sum_of_squares(&unscaled);
    let mut d_grads = gpu.up(&grads)?;
    let mut partials = gpu.zeros::<f64>(1024)?;
    let mut total = gpu.zeros::<f64>(1)?;
    let mut found_inf = gpu.zeros::<i32>(1)?;
    let launcher = gpu.launcher();
    launcher.unscale_and_norm(
        &mut d_grads.as_view_mut(),
        inv_scale,
        &mut partials.as_view_mut(),
        &mut total.as_view_mut(),
        &mut found_inf.as_view_mut(),
    )?;
    let got = gpu.down(&total)?[0];
    rows.push(CheckRow::measured(
        CheckKind::Kernel,
        "unscale_norm sum of squares",
        "f64",
        Metric::ScalarRelative,
        ((got - want).abs() / want, (got - want).abs()),
        1e-12,
    ));
    rows.push(CheckRow::exact(
        "unscale_norm found_inf (finite input)",
        "i32",
        &gpu.down(&found_inf)?,
        &[0],
    ));
    rows.push(CheckRow::exact(
        "unscale_norm unscaled gradients",
        "f32",
        &gpu.down(&d_grads)?,
        &unscaled,
    ));
    let mut with_nan = grads.clone();
    with_nan[123_456] = f32::NAN;
    let mut d_nan = gpu.up(&with_nan)?;
    launcher.unscale_and_norm(
        &mut d_nan.as_view_mut(),
        1.0,
        &mut partials.as_view_mut(),
        &mut total.as_view_mut(),
        &mut found_inf.as_view_mut(),
    )?;
    rows.push(CheckRow::exact(
        "unscale_norm found_inf (a NaN)",
        "i32",
        &gpu.down(&found_inf)?,
        &[1],
    ));
    Ok(())
}

/// The fused AdamW kernel against `adam_step` over two segments (decayed, exempt), and the
/// bf16 copy of the master weights it writes.
fn adamw(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let mut rng = Random(23);
    let n = 100_000;
    let config = AdamConfig {
        weight_decay: 0.1,
        ..AdamConfig::default()
    };
    let params = rng.vec(n, 1.0);
    let (grads_t, grads) = stored::<half::bf16>(&rng.vec(n, 0.01));
    let split = 60_000;
    let (mut cpu_p, mut m, mut v) = (params.clone(), vec![0.0; n], vec![0.0; n]);
    let lr = 6e-4;
    let no_decay = AdamConfig {
        weight_decay: 0.0,
        ..config
    };
    let cpu = |e| CudaError::Shape(format!("CPU adam_step: {e:?}"));
    adam_step(
        &mut cpu_p[..split],
        &grads[..split],
        &mut m[..split],
        &mut v[..split],
        1,
        lr,
        &config,
    )
    .map_err(cpu)?;
    adam_step(
        &mut cpu_p[split..],
        &grads[split..],
        &mut m[split..],
        &mut v[split..],
        1,
        lr,
        &no_decay,
    )
    .map_err(cpu)?;
    let segments = [
        AdamSegment::new(0, split, Decay::Apply),
        AdamSegment::new(split, n - split, Decay::Exempt),
    ];
    let mut d_master = gpu.up(&params)?;
    let mut d_copy = gpu.zeros::<half::bf16>(n)?;
    let d_grads = gpu.up(&grads_t)?;
    let (mut d_m, mut d_v) = (gpu.zeros::<f32>(n)?, gpu.zeros::<f32>(n)?);
    let d_segments = gpu.up(&segments)?;
    gpu.launcher().adamw(
        &mut d_master.as_view_mut(),
        Some(&mut d_copy.as_view_mut()),
        &d_grads.as_view(),
        &mut d_m.as_view_mut(),
        &mut d_v.as_view_mut(),
        &d_segments.as_view(),
        &segments,
        AdamScalars::new(&config, 1, lr, 1.0),
    )?;
    let master = gpu.down(&d_master)?;
    rows.push(CheckRow::relative(
        "adamw master",
        "f32",
        &master,
        &cpu_p,
        1e-6,
    ));
    rows.push(CheckRow::relative(
        "adamw exp_avg",
        "f32",
        &gpu.down(&d_m)?,
        &m,
        1e-6,
    ));
    rows.push(CheckRow::relative(
        "adamw exp_avg_sq",
        "f32",
        &gpu.down(&d_v)?,
        &v,
        1e-6,
    ));
    let copy: Vec<half::bf16> = master.iter().map(|&p| half::bf16::from_f32(p)).collect();
    rows.push(CheckRow::exact(
        "adamw bf16 copy",
        "bf16",
        &gpu.down(&d_copy)?,
        &copy,
    ));
    Ok(())
}

/// NCCL with one rank: every collective returns its input (skipped without `libnccl`).
fn nccl_world_of_one(gpu: &Gpu) -> Result<Vec<CheckRow>, String> {
    let name = "NCCL world of one";
    // SAFETY: only tries to open the library by its candidate names.
    if !unsafe { cudarc::nccl::sys::is_culib_present() } {
        return Ok(vec![CheckRow::skipped(
            CheckKind::Kernel,
            name,
            "libnccl cannot be loaded (needed only for more than one GPU); see `dsplan report`",
        )]);
    }
    let env = LaunchEnv::from_lookup(|_| None).map_err(|e| e.to_string())?;
    let mut comm = NcclComm::from_env(gpu.stream.clone(), &env, Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let input = vec![1.5f32, -2.0, 3.25];
    let mut data = input.clone();
    comm.all_reduce(&mut data, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    let mut rows = vec![CheckRow::exact(
        "NCCL all_reduce, one rank",
        "f32",
        &data,
        &input,
    )];
    let mut gathered = vec![0.0; 3];
    comm.all_gather(&data, &mut gathered)
        .map_err(|e| e.to_string())?;
    rows.push(CheckRow::exact(
        "NCCL all_gather, one rank",
        "f32",
        &gathered,
        &input,
    ));
    let scalar = comm
        .all_reduce_scalar(2.5, ReduceOp::Max)
        .map_err(|e| e.to_string())?;
    rows.push(CheckRow::exact(
        "NCCL all_reduce_scalar, one rank",
        "f64",
        &[scalar],
        &[2.5],
    ));
    comm.barrier().map_err(|e| e.to_string())?;
    if comm.all_gather(&data, &mut [0.0; 4]).is_ok() {
        rows.push(CheckRow::failed(
            CheckKind::Kernel,
            "NCCL all_gather refuses a wrong output length",
            "accepted 4 elements for 3 from one rank",
        ));
    }
    Ok(rows)
}
