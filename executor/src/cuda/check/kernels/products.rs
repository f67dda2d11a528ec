//! cuBLASLt's products against a plain row-major reference: every [`Product`] the step issues
//! (GPT-2's `Conv1D` passes, the Llama family's `nn.Linear` passes with strided operands,
//! bias and accumulation, and the three vocabulary products over padded logits rows), each
//! described once and run by one loop in f32 (full precision) and bf16 (tensor cores),
//! measured norm-wise. The reference itself is held against the CPU model's matmuls on the
//! host.

use super::{Random, stored, to_f32};
use crate::cuda::check::compare::CheckRow;
use crate::cuda::check::gpu::Gpu;
use crate::cuda::error::CudaError;
use crate::cuda::gemm::{Accumulate, Gemm, Pass, Product, WeightLayout};
use dsplan_planner::memory::cuda_layout::padded_vocab;

/// `(N, IC, OC)` of the checked products, and the row distance of the strided ones.
const DIMS: (usize, usize, usize) = (64, 96, 160);
const WIDE: usize = 200;
/// A vocabulary that is not a multiple of 8.
const ODD_VOCAB: usize = 157;

/// Every product of the step, with whether it fuses a bias and its row's label. The three
/// vocabulary products run as the step issues them: `OC = V` real columns in rows
/// [`padded_vocab`] apart (160 in rows of 192); then again for a vocabulary of 157, not a
/// multiple of [`crate::cuda::gemm::ALIGNED_FEATURES`] (GPT-2's 50,257 is not either), whose
/// two gradient products run split in two ([`Product::split_features`]).
fn cases() -> [(&'static str, Product, bool); 12] {
    let with = |pass, weight, stride, accumulate| Product {
        pass,
        weight,
        dims: DIMS,
        stride,
        accumulate,
    };
    let odd = |pass, accumulate| Product {
        pass,
        weight: WeightLayout::OutIn,
        dims: (DIMS.0, DIMS.1, ODD_VOCAB),
        stride: padded_vocab(ODD_VOCAB as u64) as usize,
        accumulate,
    };
    use Accumulate::{Add, Overwrite};
    use Pass::{BackwardInput, BackwardWeight, Forward};
    use WeightLayout::{InOut, OutIn};
    let oc = DIMS.2;
    let vp = padded_vocab(oc as u64) as usize;
    [
        ("matmul_forward", with(Forward, InOut, oc, Overwrite), true),
        (
            "matmul_backward dinp",
            with(BackwardInput, InOut, oc, Overwrite),
            false,
        ),
        (
            "matmul_backward dweight",
            with(BackwardWeight, InOut, oc, Add),
            false,
        ),
        (
            "linear_forward strided",
            with(Forward, OutIn, WIDE, Add),
            true,
        ),
        (
            "linear_backward dinp strided",
            with(BackwardInput, OutIn, WIDE, Add),
            false,
        ),
        (
            "linear_backward dweight strided",
            with(BackwardWeight, OutIn, WIDE, Add),
            false,
        ),
        (
            "logits_forward padded",
            with(Forward, OutIn, vp, Overwrite),
            false,
        ),
        (
            "logits_backward dlnf padded",
            with(BackwardInput, OutIn, vp, Overwrite),
            false,
        ),
        (
            "logits_backward dwte padded",
            with(BackwardWeight, OutIn, vp, Add),
            false,
        ),
        ("logits_forward V 157", odd(Forward, Overwrite), false),
        (
            "logits_backward dlnf V 157 (split)",
            odd(BackwardInput, Overwrite),
            false,
        ),
        (
            "logits_backward dwte V 157 (split)",
            odd(BackwardWeight, Add),
            false,
        ),
    ]
}

/// The product on row-major host data, in f64: the caller's `(out, first, second)` as
/// [`Product::plan`] names them, `out` updated in place (only its block: a strided output's
/// gaps are left as they are).
pub(super) fn reference(
    product: Product,
    first: &[f32],
    second: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (n, ic, oc) = product.dims;
    let s = product.stride;
    let weight = |w: &[f32], i: usize, o: usize| -> f64 {
        f64::from(match product.weight {
            WeightLayout::InOut => w[i * oc + o],
            WeightLayout::OutIn => w[o * ic + i],
        })
    };
    let beta = match product.accumulate {
        Accumulate::Overwrite => 0.0,
        Accumulate::Add => 1.0,
    };
    let mut set = |index: usize, sum: f64| {
        out[index] = (beta * f64::from(out[index]) + sum) as f32;
    };
    match product.pass {
        Pass::Forward => {
            for r in 0..n {
                for o in 0..oc {
                    let b = bias.map_or(0.0, |b| f64::from(b[o]));
                    let sum: f64 = (0..ic)
                        .map(|i| f64::from(first[r * ic + i]) * weight(second, i, o))
                        .sum();
                    set(r * s + o, sum + b);
                }
            }
        }
        Pass::BackwardInput => {
            for r in 0..n {
                for i in 0..ic {
                    let sum: f64 = (0..oc)
                        .map(|o| f64::from(first[r * s + o]) * weight(second, i, o))
                        .sum();
                    set(r * ic + i, sum);
                }
            }
        }
        Pass::BackwardWeight => {
            for i in 0..ic {
                for o in 0..oc {
                    let sum: f64 = (0..n)
                        .map(|r| f64::from(first[r * ic + i]) * f64::from(second[r * s + o]))
                        .sum();
                    let index = match product.weight {
                        WeightLayout::InOut => i * oc + o,
                        WeightLayout::OutIn => o * ic + i,
                    };
                    set(index, sum);
                }
            }
        }
    }
}

/// Random operands for `product`: `(out, first, second, bias)` in their planned lengths.
fn operands(product: Product, bias: bool, rng: &mut Random) -> [Vec<f32>; 4] {
    let plan = product.plan();
    let [a, b, c] = plan.operands;
    let (first, second) = if plan.second_is_a { (b, a) } else { (a, b) };
    [
        rng.vec(c.len(), 0.5),
        rng.vec(first.len(), 1.0),
        rng.vec(second.len(), 0.1),
        if bias {
            rng.vec(product.dims.2, 0.5)
        } else {
            Vec::new()
        },
    ]
}

/// Every product in f32 and bf16, norm-wise against the f64 reference: f32 runs in full
/// precision (rounding alone: about 1e-7 at these sizes), bf16 rounds its output to 8 bits
/// (about 2e-3; an H200 measured 0.004-0.07 element-wise, a measure one cancelling element
/// decides).
pub(super) fn cublaslt(gpu: &Gpu, rows: &mut Vec<CheckRow>) -> Result<(), CudaError> {
    let gemm = Gemm::new(gpu.stream.clone())?;
    let mut rng = Random(29);
    for (name, product, bias) in cases() {
        let host = operands(product, bias, &mut rng);
        rows.push(run::<f32>(
            gpu,
            &gemm,
            product,
            &host,
            &format!("cuBLASLt {name}"),
            1e-5,
        )?);
        rows.push(run::<half::bf16>(
            gpu,
            &gemm,
            product,
            &host,
            &format!("cuBLASLt {name}"),
            1e-2,
        )?);
    }
    Ok(())
}

/// One product on the device in `T` against [`reference`] fed the same rounded inputs.
fn run<T: crate::cuda::gemm::GemmElement>(
    gpu: &Gpu,
    gemm: &Gemm,
    product: Product,
    [out, first, second, bias]: &[Vec<f32>; 4],
    name: &str,
    tol: f64,
) -> Result<CheckRow, CudaError> {
    let [
        (out_t, mut want),
        (first_t, first_r),
        (second_t, second_r),
        (bias_t, bias_r),
    ] = [out, first, second, bias].map(|v| stored::<T>(v));
    let bias_r = (!bias_r.is_empty()).then_some(bias_r.as_slice());
    reference(product, &first_r, &second_r, bias_r, &mut want);
    let mut d_out = gpu.up(&out_t)?;
    let (d_first, d_second) = (gpu.up(&first_t)?, gpu.up(&second_t)?);
    let d_bias = match bias_r {
        Some(_) => Some(gpu.up(&bias_t)?),
        None => None,
    };
    let bias_view = d_bias.as_ref().map(|d| d.as_view());
    gemm.run(
        product,
        &mut d_out.as_view_mut(),
        &d_first.as_view(),
        &d_second.as_view(),
        bias_view.as_ref(),
    )?;
    let dtype = T::DTYPE.suffix();
    Ok(CheckRow::norm_relative(
        name,
        dtype,
        &to_f32(&gpu.down(&d_out)?),
        &want,
        tol,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::classifier::logits_forward;
    use crate::model::matmul::{matmul_backward, matmul_forward};

    /// The reference equals the CPU model's matmuls: `Conv1D` forward with bias, its two
    /// gradients, and the tied logits; a strided `nn.Linear` pass equals the dense one in
    /// its block and leaves the gaps between rows as they were.
    #[test]
    fn the_reference_is_the_cpu_models_product() {
        let (n, ic, oc) = DIMS;
        let mut rng = Random(5);
        let close = |a: &[f32], b: &[f32]| {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| (x - y).abs() <= 1e-4 * (1.0 + y.abs()))
        };
        let by = |pass, weight, stride, accumulate| Product {
            pass,
            weight,
            dims: DIMS,
            stride,
            accumulate,
        };
        let (inp, w, bias, dout) = (
            rng.vec(n * ic, 1.0),
            rng.vec(ic * oc, 0.1),
            rng.vec(oc, 0.5),
            rng.vec(n * oc, 1.0),
        );
        let mut cpu = vec![0.0; n * oc];
        matmul_forward(&mut cpu, &inp, &w, &bias);
        let mut ours = rng.vec(n * oc, 1.0);
        let forward = by(
            Pass::Forward,
            WeightLayout::InOut,
            oc,
            Accumulate::Overwrite,
        );
        reference(forward, &inp, &w, Some(&bias), &mut ours);
        assert!(close(&ours, &cpu));

        let (mut dinp, mut dw, mut db) = (vec![0.0; n * ic], vec![0.0; ic * oc], vec![0.0; oc]);
        matmul_backward(&mut dinp, &mut dw, &mut db, &dout, &inp, &w);
        let mut ours = vec![0.0; n * ic];
        let backward = by(
            Pass::BackwardInput,
            WeightLayout::InOut,
            oc,
            Accumulate::Overwrite,
        );
        reference(backward, &dout, &w, None, &mut ours);
        assert!(close(&ours, &dinp));
        let mut ours = vec![0.0; ic * oc];
        let weight = by(
            Pass::BackwardWeight,
            WeightLayout::InOut,
            oc,
            Accumulate::Add,
        );
        reference(weight, &inp, &dout, None, &mut ours);
        assert!(close(&ours, &dw));

        // The tied logits: wte (V, C) is an nn.Linear weight (OC = V, IC = C).
        let mut logits = vec![0.0; n * oc];
        let wte = rng.vec(oc * ic, 0.2);
        logits_forward(&mut logits, &inp, &wte, ic);
        let mut ours = vec![0.0; n * oc];
        let tied = by(
            Pass::Forward,
            WeightLayout::OutIn,
            oc,
            Accumulate::Overwrite,
        );
        reference(tied, &inp, &wte, None, &mut ours);
        assert!(close(&ours, &logits));

        // Strided output with bias, added to: the block is the dense result plus what was
        // there; the gaps keep their values.
        let strided = by(Pass::Forward, WeightLayout::OutIn, WIDE, Accumulate::Add);
        let before = rng.vec((n - 1) * WIDE + oc, 1.0);
        let mut ours = before.clone();
        reference(strided, &inp, &wte, Some(&bias), &mut ours);
        let mut dense = vec![0.0; n * oc];
        let plain = by(
            Pass::Forward,
            WeightLayout::OutIn,
            oc,
            Accumulate::Overwrite,
        );
        reference(plain, &inp, &wte, Some(&bias), &mut dense);
        for r in 0..n {
            for col in 0..WIDE.min(before.len() - r * WIDE) {
                let k = r * WIDE + col;
                let want = if col < oc {
                    before[k] + dense[r * oc + col]
                } else {
                    before[k]
                };
                assert!(
                    (ours[k] - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{r} {col}"
                );
            }
        }
    }

    /// A split product's parts, each run by the reference on its ranges of the caller's
    /// operands, give the whole product (f64 sums: equal up to the order of the sum).
    #[test]
    fn a_split_products_parts_make_the_whole() {
        let mut rng = Random(7);
        let mut split = 0;
        for (name, product, bias) in cases() {
            let parts = product.parts();
            if parts.len() == 1 {
                continue;
            }
            split += 1;
            let [out, first, second, _] = operands(product, bias, &mut rng);
            let mut whole = out.clone();
            reference(product, &first, &second, None, &mut whole);
            let mut pieces = out.clone();
            for part in parts {
                reference(
                    part.product,
                    &first[part.first],
                    &second[part.second],
                    None,
                    &mut pieces[part.out],
                );
            }
            for (k, (a, b)) in pieces.iter().zip(&whole).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "{name} [{k}]: {a} {b}"
                );
            }
        }
        assert_eq!(split, 2);
    }

    /// The cases cover each pass in both weight layouts, strided and dense.
    #[test]
    fn every_product_kind_is_checked() {
        let cases = cases();
        for pass in [Pass::Forward, Pass::BackwardInput, Pass::BackwardWeight] {
            for weight in [WeightLayout::InOut, WeightLayout::OutIn] {
                assert!(
                    cases
                        .iter()
                        .any(|(_, p, _)| p.pass == pass && p.weight == weight),
                    "{pass:?} {weight:?}"
                );
            }
        }
        assert!(
            cases
                .iter()
                .any(|(_, p, bias)| p.stride > p.dims.2 && *bias)
        );
        assert_eq!(
            cases
                .iter()
                .filter(|(_, p, _)| p.split_features().is_some())
                .count(),
            2,
            "both gradient products of the odd vocabulary run split"
        );
    }
}
