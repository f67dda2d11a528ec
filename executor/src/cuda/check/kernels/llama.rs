//! The Llama family's own kernels against their CPU twins (`rmsnorm.cu`, `rope.cu`,
//! `swiglu.cu`), in f32, bf16 and f16, fed the same (rounded) inputs as the CPU reference.
//! Grouped-query attention is checked with GPT-2's attention in [`super`].

use super::{Precision, Random, dtype, stored, to_f32, tolerance};
use crate::cuda::check::compare::CheckRow;
use crate::cuda::check::gpu::Gpu;
use crate::cuda::error::CudaError;
use crate::cuda::launch::{Rotation, Storage};
use crate::model::rmsnorm::{rmsnorm_backward, rmsnorm_forward};
use crate::model::rope::{Rope, RopeScaling, rope_backward, rope_forward};
use crate::model::swiglu::{swiglu_backward, swiglu_forward};
use dsplan_kernels::Dtype;

pub(super) fn rmsnorm_case(
    gpu: &Gpu,
    out: &mut Vec<CheckRow>,
    p: Precision,
) -> Result<(), CudaError> {
    typed!(p, rmsnorm_typed, gpu, out)
}

fn rmsnorm_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, c) = (70, 200);
    let dt = dtype::<T>();
    let tol = tolerance::<T>();
    let mut rng = Random(13);
    let (inp_t, inp) = stored::<T>(&rng.vec(n * c, 2.0));
    let (w_t, w) = stored::<T>(&rng.vec(c, 1.0));
    let (mut out, mut rstd) = (vec![0.0; n * c], vec![0.0; n]);
    rmsnorm_forward(&mut out, &mut rstd, &inp, &w, 1e-6);
    let (d_inp, d_w) = (gpu.up(&inp_t)?, gpu.up(&w_t)?);
    let mut d_out = gpu.zeros::<T>(n * c)?;
    let mut d_rstd = gpu.zeros::<f32>(n)?;
    let launcher = gpu.launcher();
    launcher.rmsnorm_forward(
        &mut d_out.as_view_mut(),
        &mut d_rstd.as_view_mut(),
        &d_inp.as_view(),
        &d_w.as_view(),
        1e-6,
    )?;
    // 16-bit storage rounds the normalised row before the weight multiplies (transformers'
    // order): one more rounding than the f32 reference, inside the tolerance of one value.
    rows.push(CheckRow::relative(
        "rmsnorm_forward out",
        dt,
        &to_f32(&gpu.down(&d_out)?),
        &out,
        2.0 * tol,
    ));
    rows.push(CheckRow::relative(
        "rmsnorm_forward rstd",
        dt,
        &gpu.down(&d_rstd)?,
        &rstd,
        1e-5,
    ));

    let (dout_t, dout) = stored::<T>(&rng.vec(n * c, 1.0));
    let (dinp0_t, dinp0) = stored::<T>(&rng.vec(n * c, 0.1));
    let (mut dinp, mut dw) = (dinp0.clone(), vec![0.0; c]);
    rmsnorm_backward(&mut dinp, &mut dw, &dout, &inp, &w, &rstd);
    let mut d_dinp = gpu.up(&dinp0_t)?;
    let mut d_dw = gpu.zeros::<T>(c)?;
    let mut scratch = gpu.zeros::<f32>(n.div_ceil(32) * c)?;
    let d_dout = gpu.up(&dout_t)?;
    launcher.rmsnorm_backward(
        &mut d_dinp.as_view_mut(),
        &mut d_dw.as_view_mut(),
        &mut scratch.as_view_mut(),
        &d_dout.as_view(),
        &d_inp.as_view(),
        &d_w.as_view(),
        &d_rstd.as_view(),
    )?;
    let slack = if T::DTYPE == Dtype::F32 { 10.0 } else { 1.0 };
    for (name, device, want) in [
        ("rmsnorm_backward dinp", &d_dinp, &dinp),
        ("rmsnorm_backward dweight", &d_dw, &dw),
    ] {
        rows.push(CheckRow::relative(
            name,
            dt,
            &to_f32(&gpu.down(device)?),
            want,
            tol * slack,
        ));
    }
    Ok(())
}

pub(super) fn rope_case(gpu: &Gpu, out: &mut Vec<CheckRow>, p: Precision) -> Result<(), CudaError> {
    typed!(p, rope_typed, gpu, out)
}

fn rope_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    // Two sequences of 37 rows of [q (4 heads) | k (2 heads) | v (2 heads)], hs 64, with
    // Llama 3.1's scaled frequencies (the table carries rope_theta and the scaling).
    let (b, t, hs, heads, kv) = (2, 37, 64, 4, 2);
    let width = (heads + 2 * kv) * hs;
    let dt = dtype::<T>();
    let tol = tolerance::<T>();
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
    let (x_t, x) = stored::<T>(&rng.vec(b * t * width, 1.0));
    let (d_cos, d_sin) = (gpu.up(table.cos())?, gpu.up(table.sin())?);
    let launcher = gpu.launcher();
    for (name, rotation) in [
        ("rope_forward", Rotation::Forward),
        ("rope_backward", Rotation::Backward),
    ] {
        let mut want = x.clone();
        match rotation {
            Rotation::Forward => rope_forward(&mut want, width, heads + kv, &table),
            Rotation::Backward => rope_backward(&mut want, width, heads + kv, &table),
        }
        let mut d_rows = gpu.up(&x_t)?;
        launcher.rope(
            &mut d_rows.as_view_mut(),
            &d_cos.as_view(),
            &d_sin.as_view(),
            (width, heads + kv, t),
            rotation,
        )?;
        rows.push(CheckRow::relative(
            name,
            dt,
            &to_f32(&gpu.down(&d_rows)?),
            &want,
            tol,
        ));
    }
    Ok(())
}

pub(super) fn swiglu_case(
    gpu: &Gpu,
    out: &mut Vec<CheckRow>,
    p: Precision,
) -> Result<(), CudaError> {
    typed!(p, swiglu_typed, gpu, out)
}

fn swiglu_typed<T: Storage>(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let (n, inner) = (130, 72);
    let dt = dtype::<T>();
    let tol = tolerance::<T>();
    let mut rng = Random(19);
    let (gu_t, gu) = stored::<T>(&rng.vec(n * 2 * inner, 4.0));
    let mut h = vec![0.0; n * inner];
    swiglu_forward(&mut h, &gu, inner);
    let d_gu = gpu.up(&gu_t)?;
    let mut d_h = gpu.zeros::<T>(n * inner)?;
    let launcher = gpu.launcher();
    launcher.swiglu_forward(&mut d_h.as_view_mut(), &d_gu.as_view(), inner)?;
    rows.push(CheckRow::relative(
        "swiglu_forward",
        dt,
        &to_f32(&gpu.down(&d_h)?),
        &h,
        tol,
    ));

    let (dh_t, dh) = stored::<T>(&rng.vec(n * inner, 1.0));
    let mut dgu = vec![0.0; gu.len()];
    swiglu_backward(&mut dgu, &dh, &gu, inner);
    let d_dh = gpu.up(&dh_t)?;
    let mut d_dgu = gpu.zeros::<T>(gu.len())?;
    launcher.swiglu_backward(
        &mut d_dgu.as_view_mut(),
        &d_dh.as_view(),
        &d_gu.as_view(),
        inner,
    )?;
    rows.push(CheckRow::relative(
        "swiglu_backward",
        dt,
        &to_f32(&gpu.down(&d_dgu)?),
        &dgu,
        tol,
    ));
    Ok(())
}
