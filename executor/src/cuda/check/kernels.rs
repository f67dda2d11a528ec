//! Every registered kernel against the CPU function it must match, on random inputs, in f32,
//! bf16 and f16, with per-precision tolerances; every cuBLASLt product against a row-major
//! reference ([`products`]); and NCCL's world of one. Each comparison is a [`CheckRow`].
//! [`CASES`] is the table: each case puts its inputs on a [`Bench`] under the names of the
//! operands they stand for, launches the launch table's descriptions of its kernels (bound as
//! the device step binds them), runs the CPU reference and lists the rows it compares.
//! Attention is one case for every family (one key/value head per query head, and grouped).
//!
//! 16-bit cases feed the CPU reference the inputs rounded to the storage type, so the
//! tolerance covers only the kernel's own rounding (outputs stored in 16 bits, f32 arithmetic
//! in a different order).

use std::time::{Duration, Instant};

use dsplan_kernels::{Dtype, KERNELS, SOURCES};
use dsplan_planner::memory::cuda_layout::padded_vocab;

use super::bench::{Bench, NO_RUN};
use super::compare::{CheckKind, CheckRow, Metric};
use super::gpu::Gpu;
use crate::comm::{Comm, ReduceOp};
use crate::cuda::adamw::{AdamScalars, AdamSegment, Decay};
use crate::cuda::element::strided_len;
use crate::cuda::encoder_buckets::TokenBuckets;
use crate::cuda::error::CudaError;
use crate::cuda::launch::bind::RunValues;
use crate::cuda::launch::table::{self, RopeShape};
use crate::cuda::launch::{GroupedAttention, Heads, Rotation, Storage};
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
use crate::model::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::model::rope::{Rope, RopeScaling, rope_backward, rope_forward};
use crate::model::swiglu::{swiglu_backward, swiglu_forward};
use crate::optim::{AdamConfig, adam_step, sum_of_squares};
use crate::train::AttentionKernel;

mod products;

/// A case: its rows, or why it could not run.
pub type Case = fn(&Gpu) -> Result<Vec<CheckRow>, String>;

/// A case body in one precision.
type Body = fn(&Gpu, &mut Vec<CheckRow>, Precision) -> Result<(), CudaError>;

/// Every case, in the order `dsplan report --check` runs them.
pub const CASES: &[(&str, Case)] = &[
    ("encoder", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, encoder, g, r))
    }),
    ("layernorm", |gpu| all_dtypes(gpu, layernorm_widths)),
    ("gelu and bias", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, gelu_and_bias, g, r))
    }),
    ("accumulate", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, accumulate_case, g, r))
    }),
    ("attention", |gpu| attention(gpu, Heads::Shared)),
    ("classifier", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, classifier, g, r))
    }),
    ("rmsnorm", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, rmsnorm, g, r))
    }),
    ("rope", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, rope, g, r))
    }),
    ("swiglu", |gpu| {
        all_dtypes(gpu, |g, r, p| typed!(p, swiglu, g, r))
    }),
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
fn all_dtypes(gpu: &Gpu, case: Body) -> Result<Vec<CheckRow>, String> {
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
use typed;

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

fn to_f32<T: Storage>(v: &[T]) -> Vec<f32> {
    v.iter().map(|&x| x.to_f32()).collect()
}

/// `host` rounded to `T`: what the GPU stores, and what the CPU reference is fed.
fn stored<T: Storage>(host: &[f32]) -> (Vec<T>, Vec<f32>) {
    let typed: Vec<T> = host.iter().map(|&x| T::from_f32(x)).collect();
    let back = to_f32(&typed);
    (typed, back)
}

/// `host` rounded to `T`, read back as f32: what the GPU stores of it.
fn rounded<T: Storage>(host: &[f32]) -> Vec<f32> {
    stored::<T>(host).1
}

/// Relative tolerance of one stored value in `T` (a few units in the last place).
fn tolerance<T: Storage>() -> f64 {
    match T::DTYPE {
        Dtype::F32 => 2e-5,
        Dtype::Bf16 => 2e-2,
        _ => 4e-3,
    }
}

/// The backward kernels' extra slack in f32 (their partial sums add in another order).
fn backward_slack<T: Storage>() -> f64 {
    if T::DTYPE == Dtype::F32 { 10.0 } else { 1.0 }
}

/// The launch of one kernel shape, as the bench launches it.
fn one(call: Result<table::KernelCall, CudaError>) -> Result<Vec<table::KernelCall>, CudaError> {
    Ok(vec![call?])
}

fn encoder<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (b, t, c, v) = (3, 17, 96, 50);
    let mut rng = Random(7);
    let tokens: Vec<u32> = (0..b * t)
        .map(|i| (i * 31 % 11 + i % 3) as u32 % v as u32)
        .collect();
    let mut bench = Bench::<T>::new(gpu);
    let wte = bench.model("wte", &rng.vec(v * c, 1.0))?;
    let wpe = bench.model("wpe", &rng.vec(t * c, 1.0))?;
    bench.u32s("tokens", &tokens)?;
    bench.zeros("out", b * t * c)?;
    let mut out = vec![0.0; b * t * c];
    encoder_forward(&mut out, &tokens, &wte, &wpe, t);
    bench.launch(&one(table::encoder_forward(T::DTYPE, b * t, t, c))?, NO_RUN)?;
    let tol = tolerance::<T>();
    rows.push(bench.relative("encoder_forward", "out", &out, tol)?);

    let dout = bench.model("dout", &rng.vec(b * t * c, 1.0))?;
    let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; t * c]);
    encoder_backward(&mut dwte, &mut dwpe, &dout, &tokens, t);
    let buckets = TokenBuckets::new(&tokens)
        .ok_or_else(|| CudaError::Shape("token buckets: batch too large".to_string()))?;
    bench.zeros("dwte", v * c)?;
    bench.zeros("dwpe", t * c)?;
    bench.u32s("bucket_token", &buckets.tokens)?;
    bench.i32s("bucket_start", &buckets.starts)?;
    bench.i32s("bucket_rows", &buckets.rows)?;
    let groups = buckets.tokens.len();
    let calls = table::encoder_backward(T::DTYPE, buckets.rows.len(), groups, t, c)?;
    bench.launch(&calls, NO_RUN)?;
    rows.push(bench.relative("encoder_backward dwte", "dwte", &dwte, tol)?);
    rows.push(bench.relative("encoder_backward dwpe", "dwpe", &dwpe, tol)?);
    Ok(())
}

/// LayerNorm at three widths: 200 channels; 776, whose 16-bit rows the backward kernel reads in
/// 16-byte chunks, up to four a lane (one in the last slot); and 100, not a whole number of
/// chunks, which keeps its 16-bit loads. The rows of the last two are named with their width.
fn layernorm_widths(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    for (c, label) in [(200, ""), (776, ", 776 channels"), (100, ", 100 channels")] {
        let mut rows = Vec::new();
        typed!(p, layernorm, gpu, &mut rows, c)?;
        out.extend(rows.into_iter().map(|mut row| {
            row.name.push_str(label);
            row
        }));
    }
    Ok(())
}

fn layernorm<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>, c: usize) -> Result<(), CudaError> {
    let n = 70;
    let tol = tolerance::<T>();
    let eps = RunValues {
        eps: 1e-5,
        ..NO_RUN
    };
    let mut rng = Random(11);
    let mut bench = Bench::<T>::new(gpu);
    let shifted: Vec<f32> = rng.vec(n * c, 2.0).iter().map(|x| x + 0.5).collect();
    let inp = bench.model("inp", &shifted)?;
    let w = bench.model("weight", &rng.vec(c, 1.0))?;
    let b = bench.model("bias", &rng.vec(c, 0.5))?;
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm_forward(&mut out, &mut mean, &mut rstd, &inp, &w, &b, 1e-5);
    bench.zeros("out", n * c)?;
    bench.f32_zeros("mean", n)?;
    bench.f32_zeros("rstd", n)?;
    bench.launch(&one(table::layernorm_forward(T::DTYPE, n, c))?, eps)?;
    rows.push(bench.relative("layernorm_forward out", "out", &out, tol)?);
    rows.push(bench.relative("layernorm_forward mean", "mean", &mean, 1e-5)?);
    rows.push(bench.relative("layernorm_forward rstd", "rstd", &rstd, 1e-5)?);

    let dout = bench.model("dout", &rng.vec(n * c, 1.0))?;
    let mut dinp = bench.model("dinp", &rng.vec(n * c, 0.1))?;
    let (mut dw, mut db) = (vec![0.0; c], vec![0.0; c]);
    layernorm_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w, &mean, &rstd);
    bench.zeros("dweight", c)?;
    bench.zeros("dbias", c)?;
    bench.f32_zeros("partials", n.div_ceil(32) * 2 * c)?;
    bench.launch(&table::layernorm_backward(T::DTYPE, n, c)?, NO_RUN)?;
    let slack = backward_slack::<T>();
    for (name, operand, want) in [
        ("layernorm_backward dinp", "dinp", &dinp),
        ("layernorm_backward dweight", "dweight", &dw),
        ("layernorm_backward dbias", "dbias", &db),
    ] {
        rows.push(bench.relative(name, operand, want, tol * slack)?);
    }

    // Residual add fused with the LayerNorm (`b`: the input above).
    let a = bench.model("a", &rng.vec(n * c, 1.0))?;
    bench.model("b", &shifted)?;
    let mut residual = vec![0.0; n * c];
    residual_forward(&mut residual, &a, &inp);
    let residual_stored = rounded::<T>(&residual);
    layernorm_forward(
        &mut out,
        &mut mean,
        &mut rstd,
        &residual_stored,
        &w,
        &b,
        1e-5,
    );
    bench.zeros("residual", n * c)?;
    bench.launch(
        &one(table::residual_layernorm_forward(T::DTYPE, n, c))?,
        eps,
    )?;
    rows.push(bench.relative(
        "residual_layernorm_forward residual",
        "residual",
        &residual_stored,
        tol,
    )?);
    rows.push(bench.relative("residual_layernorm_forward out", "out", &out, tol)?);
    Ok(())
}

/// A reduced bucket added into a gradient partition, 16-bit stores rounded as the kernel's.
fn accumulate_case<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let n = 1000;
    let mut rng = Random(11);
    let mut bench = Bench::<T>::new(gpu);
    let mut sum = bench.model("dst", &rng.vec(n, 2.0))?;
    let src = bench.model("src", &rng.vec(n, 2.0))?;
    accumulate(&mut sum, &src);
    bench.launch(&one(table::accumulate(T::DTYPE, n))?, NO_RUN)?;
    rows.push(bench.relative("accumulate", "dst", &sum, tolerance::<T>())?);
    Ok(())
}

fn gelu_and_bias<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, oc) = (130, 72);
    let tol = tolerance::<T>();
    let mut rng = Random(5);
    let mut bench = Bench::<T>::new(gpu);
    let pre = bench.model("pre", &rng.vec(n * oc, 4.0))?;
    let bias = bench.model("bias", &rng.vec(oc, 1.0))?;
    let with_bias: Vec<f32> = pre
        .iter()
        .enumerate()
        .map(|(i, x)| x + bias[i % oc])
        .collect();
    let with_bias_stored = rounded::<T>(&with_bias);
    let mut out = vec![0.0; n * oc];
    gelu_forward(&mut out, &with_bias_stored);
    bench.zeros("out", n * oc)?;
    bench.launch(&one(table::bias_gelu_forward(T::DTYPE, n, oc))?, NO_RUN)?;
    rows.push(bench.relative("bias_gelu_forward pre", "pre", &with_bias_stored, tol)?);
    rows.push(bench.relative("bias_gelu_forward out", "out", &out, tol)?);
    // GELU alone, and its gradient, of the biased `pre` the kernel left.
    bench.rename("pre", "inp")?;
    bench.launch(&one(table::gelu_forward(T::DTYPE, n * oc))?, NO_RUN)?;
    rows.push(bench.relative("gelu_forward", "out", &out, tol)?);

    let dout_host = rng.vec(n * oc, 1.0);
    let dout = bench.model("d", &dout_host)?;
    let mut grad = dout.clone();
    gelu_backward_inplace(&mut grad, &with_bias_stored);
    bench.launch(&one(table::gelu_backward(T::DTYPE, n * oc))?, NO_RUN)?;
    rows.push(bench.relative("gelu_backward_inplace", "d", &grad, tol)?);

    let mut dbias = vec![0.0; oc];
    add_column_sums(&mut dbias, &dout);
    bench.model("data", &dout_host)?;
    bench.zeros("dbias", oc)?;
    bench.f32_zeros("partials", n.div_ceil(64) * oc)?;
    bench.launch(&table::bias_backward(T::DTYPE, n, &[oc])?, NO_RUN)?;
    rows.push(bench.relative(
        "bias_backward (column_partials, add_partials)",
        "dbias",
        &dbias,
        tol * 2.0,
    )?);
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
    let mut bench = Bench::<T>::new(gpu);
    let qkv = bench.model("qkv", &rng.vec(b * t * width, 1.0))?;
    let mut out = vec![0.0; b * t * a];
    let mut att = vec![0.0; b * nh * t * t];
    grouped_attention_forward(&mut out, &mut att, &qkv, dims, kv_heads);
    bench.zeros("out", b * t * a)?;
    bench.f32_zeros("lse", b * nh * t)?;
    let forward = table::attention_forward(T::DTYPE, gqa, heads, kernel)?;
    bench.launch(&[forward], NO_RUN)?;
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
    rows.push(bench.relative(
        &format!("{prefix}_forward{suffix} {label}"),
        "out",
        &out,
        rtol + rounded_operand,
    )?);

    let dout = bench.model("dout", &rng.vec(b * t * a, 1.0))?;
    let mut dqkv = vec![0.0; qkv.len()];
    let mut datt = vec![0.0; att.len()];
    grouped_attention_backward(&mut dqkv, &mut datt, &dout, &qkv, &att, dims, kv_heads);
    bench.zeros("dqkv", qkv.len())?;
    bench.f32_zeros("delta", b * nh * t)?;
    let backward = table::attention_backward(T::DTYPE, gqa, heads, kernel)?;
    bench.launch(&backward, NO_RUN)?;
    rows.push(bench.relative(
        &format!("{prefix}_backward{suffix} {label} dqkv"),
        "dqkv",
        &dqkv,
        rtol * 5.0 + rounded_operand,
    )?);
    Ok(())
}

/// The classifier on logits with padded rows, as the step lays them out (`V = 1000` in rows
/// `Vp = 1024` apart, [`padded_vocab`]): the losses and the real columns' gradient against
/// the CPU model's unpadded ones, and the padding, filled with NaN, left as it was (a kernel
/// that read it would also turn the losses NaN).
fn classifier<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, v) = (9, 1000);
    let stride = padded_vocab(v as u64) as usize;
    let mut rng = Random(13);
    let logits = rounded::<T>(&rng.vec(n * v, 6.0));
    let mut padded = vec![f32::NAN; strided_len(n, v, stride)];
    for (row, real) in padded.chunks_mut(stride).zip(logits.chunks(v)) {
        row[..v].copy_from_slice(real);
    }
    let targets: Vec<Option<u32>> = (0..n)
        .map(|i| (i != 4).then_some((i * 97 % v) as u32))
        .collect();
    let (mut grad, mut losses) = (logits.clone(), vec![0.0; n]);
    let dloss = 1.0 / 8.0;
    crossentropy_forward_backward(&mut grad, &mut losses, &targets, dloss);
    let mut bench = Bench::<T>::new(gpu);
    bench.model("logits", &padded)?;
    bench.f32_zeros("losses", n)?;
    let device_targets: Vec<i32> = targets.iter().map(|t| t.map_or(-1, |t| t as i32)).collect();
    bench.i32s("targets", &device_targets)?;
    let call = table::fused_classifier(T::DTYPE, n, v, stride)?;
    bench.launch(&[call], RunValues { dloss, ..NO_RUN })?;
    let back = bench.f32_out("logits")?;
    let (mut real, mut padding) = (Vec::new(), Vec::new());
    for row in back.chunks(stride) {
        let (r, p) = row.split_at(v.min(row.len()));
        real.extend_from_slice(r);
        padding.extend_from_slice(p);
    }
    let dt = bench.dtype();
    rows.push(bench.relative("fused_classifier losses", "losses", &losses, 1e-5)?);
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

fn rmsnorm<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, c) = (70, 200);
    let tol = tolerance::<T>();
    let mut rng = Random(13);
    let mut bench = Bench::<T>::new(gpu);
    let inp = bench.model("inp", &rng.vec(n * c, 2.0))?;
    let w = bench.model("weight", &rng.vec(c, 1.0))?;
    let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
    rmsnorm_forward(&mut out, &mut rstd, &inp, &w, 1e-6);
    bench.zeros("out", n * c)?;
    bench.f32_zeros("rstd", n)?;
    let forward = table::rmsnorm_forward(T::DTYPE, n, c)?;
    bench.launch(
        &[forward],
        RunValues {
            eps: 1e-6,
            ..NO_RUN
        },
    )?;
    // 16-bit storage rounds the normalised row before the weight multiplies (transformers'
    // order): one more rounding than the f32 reference, inside the tolerance of one value.
    rows.push(bench.relative("rmsnorm_forward out", "out", &out, 2.0 * tol)?);
    rows.push(bench.relative("rmsnorm_forward rstd", "rstd", &rstd, 1e-5)?);

    let dout = bench.model("dout", &rng.vec(n * c, 1.0))?;
    let mut dinp = bench.model("dinp", &rng.vec(n * c, 0.1))?;
    let mut dw = vec![0.0; c];
    rmsnorm_backward(&mut dinp, &mut dw, &dout, &inp, &w, &rstd);
    bench.zeros("dweight", c)?;
    bench.f32_zeros("partials", n.div_ceil(32) * c)?;
    bench.launch(&table::rmsnorm_backward(T::DTYPE, n, c)?, NO_RUN)?;
    let slack = backward_slack::<T>();
    for (name, operand, want) in [
        ("rmsnorm_backward dinp", "dinp", &dinp),
        ("rmsnorm_backward dweight", "dweight", &dw),
    ] {
        rows.push(bench.relative(name, operand, want, tol * slack)?);
    }
    Ok(())
}

fn rope<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    // Two sequences of 37 rows of [q (4 heads) | k (2 heads) | v (2 heads)], hs 64, with
    // Llama 3.1's scaled frequencies (the table carries rope_theta and the scaling).
    let (b, t, hs, heads, kv) = (2, 37, 64, 4, 2);
    let width = (heads + 2 * kv) * hs;
    let rope = Rope {
        theta: 500_000.0,
        scaling: RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_positions: 16,
        },
    };
    let table = rope.table(hs, t);
    let mut rng = Random(17);
    let x_host = rng.vec(b * t * width, 1.0);
    let mut bench = Bench::<T>::new(gpu);
    bench.f32s("cos_t", table.cos())?;
    bench.f32s("sin_t", table.sin())?;
    for (name, rotation) in [
        ("rope_forward", Rotation::Forward),
        ("rope_backward", Rotation::Backward),
    ] {
        let mut want = bench.model("rows", &x_host)?;
        match rotation {
            Rotation::Forward => rope_forward(&mut want, width, heads + kv, &table),
            Rotation::Backward => rope_backward(&mut want, width, heads + kv, &table),
        }
        let shape = RopeShape {
            len: x_host.len(),
            table: table.cos().len(),
            width,
            heads: heads + kv,
            seq_len: t,
        };
        bench.launch(&one(table::rope(T::DTYPE, shape, rotation))?, NO_RUN)?;
        rows.push(bench.relative(name, "rows", &want, tolerance::<T>())?);
    }
    Ok(())
}

fn swiglu<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, inner) = (130, 72);
    let tol = tolerance::<T>();
    let mut rng = Random(19);
    let mut bench = Bench::<T>::new(gpu);
    let gu = bench.model("gate_up", &rng.vec(n * 2 * inner, 4.0))?;
    let mut h = vec![0.0; n * inner];
    swiglu_forward(&mut h, &gu, inner);
    bench.zeros("out", n * inner)?;
    bench.launch(&one(table::swiglu_forward(T::DTYPE, n, inner))?, NO_RUN)?;
    rows.push(bench.relative("swiglu_forward", "out", &h, tol)?);

    let dh = bench.model("dout", &rng.vec(n * inner, 1.0))?;
    let mut dgu = vec![0.0; gu.len()];
    swiglu_backward(&mut dgu, &dh, &gu, inner);
    bench.zeros("dgate_up", gu.len())?;
    bench.launch(&one(table::swiglu_backward(T::DTYPE, n, inner))?, NO_RUN)?;
    rows.push(bench.relative("swiglu_backward", "dgate_up", &dgu, tol)?);
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
    let n = values.len();
    let (mut to_bf16, mut to_f16) = (Bench::<half::bf16>::new(gpu), Bench::<half::f16>::new(gpu));
    for (bench, to) in [
        (&mut to_bf16 as &mut dyn CastBench, Dtype::Bf16),
        (&mut to_f16, Dtype::F16),
    ] {
        bench.cast(&values, table::cast(Dtype::F32, to, n)?)?;
    }
    let bf16: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
    let f16: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
    rows.push(CheckRow::exact(
        "cast f32 -> bf16",
        "bf16",
        &to_bf16.model_out("out")?,
        &bf16,
    ));
    rows.push(CheckRow::exact(
        "cast f32 -> f16",
        "f16",
        &to_f16.model_out("out")?,
        &f16,
    ));
    for (bench, from) in [
        (&mut to_bf16 as &mut dyn CastBench, Dtype::Bf16),
        (&mut to_f16, Dtype::F16),
    ] {
        bench.cast_back(table::cast(from, Dtype::F32, n)?)?;
    }
    rows.push(CheckRow::exact(
        "cast bf16 -> f32",
        "bf16",
        &to_bf16.f32_out("out")?,
        &to_f32(&bf16),
    ));
    rows.push(CheckRow::exact(
        "cast f16 -> f32",
        "f16",
        &to_f16.f32_out("out")?,
        &to_f32(&f16),
    ));
    Ok(())
}

/// The two halves of a cast round trip on a bench of the 16-bit type.
trait CastBench {
    /// `out = inp` from f32 `values`.
    fn cast(&mut self, values: &[f32], call: table::KernelCall) -> Result<(), CudaError>;
    /// The 16-bit `out` cast back into a new f32 `out`.
    fn cast_back(&mut self, call: table::KernelCall) -> Result<(), CudaError>;
}

impl<T: Storage> CastBench for Bench<'_, T> {
    fn cast(&mut self, values: &[f32], call: table::KernelCall) -> Result<(), CudaError> {
        self.f32s("inp", values)?;
        self.zeros("out", values.len())?;
        self.launch(&[call], NO_RUN)
    }

    fn cast_back(&mut self, call: table::KernelCall) -> Result<(), CudaError> {
        let n = self.model_out("out")?.len();
        self.rename("out", "inp")?;
        self.f32_zeros("out", n)?;
        self.launch(&[call], NO_RUN)
    }
}

/// The unscale-and-norm kernels: the unscaled gradients exactly, their sum of squares in f64,
/// and the overflow flag for a NaN.
fn unscale_norm(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let mut rng = Random(19);
    let grads = rng.vec(1_000_003, 3.0);
    let inv_scale = 1.0 / 1024.0f32;
    let unscaled: Vec<f32> = grads.iter().map(|g| g * inv_scale).collect();
    let want = sum_of_squares(&unscaled);
    let mut bench = Bench::<f32>::new(gpu);
    bench.model("grads", &grads)?;
    bench.f64_zeros("partials", 1024)?;
    bench.f64_zeros("total", 1)?;
    bench.i32s("found_inf", &[0])?;
    let calls = table::unscale_and_norm(Dtype::F32, grads.len())?;
    bench.launch(
        &calls,
        RunValues {
            inv_scale,
            ..NO_RUN
        },
    )?;
    let got = bench.f64_out("total")?[0];
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
        &bench.i32_out("found_inf")?,
        &[0],
    ));
    rows.push(CheckRow::exact(
        "unscale_norm unscaled gradients",
        "f32",
        &bench.f32_out("grads")?,
        &unscaled,
    ));
    let mut with_nan = grads.clone();
    with_nan[123_456] = f32::NAN;
    bench.model("grads", &with_nan)?;
    bench.launch(&calls, NO_RUN)?;
    rows.push(CheckRow::exact(
        "unscale_norm found_inf (a NaN)",
        "i32",
        &bench.i32_out("found_inf")?,
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
    let mut bench = Bench::<half::bf16>::new(gpu);
    let grads = bench.model("grads", &rng.vec(n, 0.01))?;
    let split = 60_000;
    let (mut cpu_p, mut m, mut v) = (params.clone(), vec![0.0; n], vec![0.0; n]);
    let lr = 6e-4;
    let no_decay = AdamConfig {
        weight_decay: 0.0,
        ..config
    };
    let cpu = |e| CudaError::Shape(format!("CPU adam_step: {e:?}"));
    for (range, config) in [(0..split, &config), (split..n, &no_decay)] {
        adam_step(
            &mut cpu_p[range.clone()],
            &grads[range.clone()],
            &mut m[range.clone()],
            &mut v[range],
            1,
            lr,
            config,
        )
        .map_err(cpu)?;
    }
    let segments = [
        AdamSegment::new(0, split, Decay::Apply),
        AdamSegment::new(split, n - split, Decay::Exempt),
    ];
    bench.f32s("master", &params)?;
    bench.zeros("params_out", n)?;
    bench.f32_zeros("exp_avg", n)?;
    bench.f32_zeros("exp_avg_sq", n)?;
    bench.segments("segments", &segments)?;
    let adam = Some(AdamScalars::new(&config, 1, lr, 1.0));
    let call = table::adamw(Dtype::Bf16, n, segments.len())?;
    bench.launch(&[call], RunValues { adam, ..NO_RUN })?;
    let master = bench.f32_out("master")?;
    rows.push(CheckRow::relative(
        "adamw master",
        "f32",
        &master,
        &cpu_p,
        1e-6,
    ));
    for (name, operand, want) in [
        ("adamw exp_avg", "exp_avg", &m),
        ("adamw exp_avg_sq", "exp_avg_sq", &v),
    ] {
        rows.push(CheckRow::relative(
            name,
            "f32",
            &bench.f32_out(operand)?,
            want,
            1e-6,
        ));
    }
    let copy: Vec<half::bf16> = master.iter().map(|&p| half::bf16::from_f32(p)).collect();
    rows.push(CheckRow::exact(
        "adamw bf16 copy",
        "bf16",
        &bench.model_out("params_out")?,
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
