//! Matrix products through cuBLASLt, in the CPU model's row-major conventions.
//!
//! cuBLASLt is column-major; a row-major `(r, c)` matrix is the column-major `(c, r)` matrix
//! with the same bytes, so each row-major product `C = A B` is issued as `C^T = B^T A^T`.
//! Bias is fused through cuBLASLt's `BIAS` epilogue (added per output column). bf16/f16
//! inputs run on tensor cores with f32 accumulation (cudarc's `Matmul`); **f32 inputs run in
//! full f32 precision** ([`full_f32`]: cudarc's f32 path is TF32, PyTorch's default is not).
//!
//! Every product of the step is one [`Product`] (which pass, the weight's layout, the sizes,
//! the stride of the strided operand, overwrite or add); [`Product::plan`] turns it into the
//! cuBLASLt configuration and the shape each operand must have, on the host, and
//! [`Gemm::run`] is the one call into cuBLASLt.

use std::sync::Arc;

use cudarc::cublaslt::result::CublasError;
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut};

use super::element::strided_len;
use super::error::CudaError;
use super::launch::Storage;

mod full_f32;

/// The operands of one cuBLASLt call, in its order: `c = op(a) op(b) (+ bias) + beta c`.
pub struct Operands<'r, 'a, 'c, T> {
    /// The first factor.
    pub a: &'r CudaView<'a, T>,
    /// The second factor.
    pub b: &'r CudaView<'a, T>,
    /// The output (read too when `beta` is not 0).
    pub c: &'r mut CudaViewMut<'c, T>,
    /// The bias added per output column, if any.
    pub bias: Option<&'r CudaView<'a, T>>,
}

/// An element type products run in, and how cuBLASLt computes them: bf16 and f16 on tensor
/// cores with f32 accumulation (cudarc's `Matmul`), f32 in full f32 precision ([`full_f32`]).
pub trait GemmElement: Storage {
    /// `c = op(a) op(b) (+ bias) + beta c`, as `config` describes it.
    ///
    /// # Safety
    /// Every operand's length matches `config` ([`Gemm::run`] checks them first).
    unsafe fn matmul(
        blas: &CudaBlasLT,
        config: MatmulConfig,
        operands: Operands<'_, '_, '_, Self>,
    ) -> Result<(), CublasError>;
}

impl GemmElement for f32 {
    unsafe fn matmul(
        blas: &CudaBlasLT,
        config: MatmulConfig,
        operands: Operands<'_, '_, '_, f32>,
    ) -> Result<(), CublasError> {
        // SAFETY: the caller's promise.
        unsafe { full_f32::matmul(blas, config, operands) }
    }
}

/// bf16 and f16: cudarc's product (compute type `CUBLAS_COMPUTE_32F`).
macro_rules! tensor_core_element {
    ($t:ty) => {
        impl GemmElement for $t {
            unsafe fn matmul(
                blas: &CudaBlasLT,
                config: MatmulConfig,
                Operands { a, b, c, bias }: Operands<'_, '_, '_, $t>,
            ) -> Result<(), CublasError> {
                // SAFETY: the caller's promise.
                unsafe { Matmul::<$t>::matmul(blas, config, a, b, c, bias, None) }
            }
        }
    };
}
tensor_core_element!(half::bf16);
tensor_core_element!(half::f16);

/// A cuBLASLt handle with its workspace, on one stream.
#[derive(Debug)]
pub struct Gemm {
    blas: CudaBlasLT,
}

/// Whether a product overwrites its output or adds to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    /// `out = product`.
    Overwrite,
    /// `out += product`.
    Add,
}

impl Accumulate {
    fn beta(self) -> f32 {
        match self {
            Accumulate::Overwrite => 0.0,
            Accumulate::Add => 1.0,
        }
    }
}

/// Which pass of a linear layer a product is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `out (N, OC) = inp (N, IC) · W (+ bias)`.
    Forward,
    /// `dinp (N, IC) = dout (N, OC) · Wᵀ`.
    BackwardInput,
    /// `dW += inpᵀ · dout` (in the weight's layout).
    BackwardWeight,
}

/// How the weight is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// `(IC, OC)`: GPT-2's `Conv1D`.
    InOut,
    /// `(OC, IC)`: `nn.Linear` (the Llama family, and the tied `lm_head` over `wte`).
    OutIn,
}

/// One product: the pass, the weight's layout, `(N, IC, OC)`, the distance between the rows
/// of the `(N, OC)` operand (the output forward, `dout` backward; `OC` when dense) and
/// whether the output is overwritten or added to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Product {
    /// Forward or which backward.
    pub pass: Pass,
    /// The weight's layout.
    pub weight: WeightLayout,
    /// `(rows, in_features, out_features)`.
    pub dims: (usize, usize, usize),
    /// Elements between rows of the `(N, OC)` operand.
    pub stride: usize,
    /// Overwrite or add.
    pub accumulate: Accumulate,
}

/// One product of a split one ([`Product::parts`]): the product, and the element ranges of
/// the caller's `(out, first, second)` it is given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductPart {
    /// The product over the ranges.
    pub product: Product,
    /// Its output's elements.
    pub out: std::ops::Range<usize>,
    /// Its first operand's elements.
    pub first: std::ops::Range<usize>,
    /// Its second operand's elements.
    pub second: std::ops::Range<usize>,
}

/// The shape one operand must have: `(rows, cols)` with rows `stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operand {
    /// Its name in the product.
    pub name: &'static str,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements between rows (`cols` when dense).
    pub stride: usize,
}

impl Operand {
    fn dense(name: &'static str, rows: usize, cols: usize) -> Self {
        Self {
            name,
            rows,
            cols,
            stride: cols,
        }
    }

    /// Elements it spans.
    pub fn len(&self) -> usize {
        strided_len(self.rows, self.cols, self.stride)
    }

    /// Whether it spans no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check(&self, len: usize) -> Result<(), CudaError> {
        if self.stride >= self.cols && len == self.len() {
            return Ok(());
        }
        let Operand {
            name,
            rows,
            cols,
            stride,
        } = *self;
        Err(CudaError::Shape(if stride == cols {
            format!("{name} has {len} elements, expected ({rows}, {cols})")
        } else {
            format!("{name} has {len} elements, expected ({rows}, {cols}) with rows {stride} apart")
        }))
    }
}

/// A product as cuBLASLt runs it: its configuration, and the shapes of `A`, `B` and `C` (the
/// output) in cuBLASLt's order.
#[derive(Debug, Clone)]
pub struct ProductPlan {
    /// cuBLASLt's configuration.
    pub config: MatmulConfig,
    /// `A`, `B`, `C`.
    pub operands: [Operand; 3],
    /// Whether `A` is the caller's second operand (the weight, or `dout` of a weight
    /// gradient) and `B` its first; otherwise the other way round.
    pub second_is_a: bool,
}

/// Whether cuBLASLt reads an operand transposed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// As stored (column-major).
    Plain,
    /// Transposed.
    Transposed,
}

/// A column-major `C (m, n) = op(A) (m, k) op(B) (k, n) + beta C`, with A's and B's leading
/// dimensions, and C's.
fn config(
    (m, n, k): (usize, usize, usize),
    (a, lda): (Op, usize),
    (b, ldb): (Op, usize),
    ldc: usize,
    beta: f32,
) -> MatmulConfig {
    let (transa, transb) = (a == Op::Transposed, b == Op::Transposed);
    MatmulConfig {
        transa,
        transb,
        transc: false,
        m: m as u64,
        n: n as u64,
        k: k as u64,
        alpha: 1.0,
        lda: lda as i64,
        ldb: ldb as i64,
        beta,
        ldc: ldc as i64,
        stride_a: None,
        stride_b: None,
        stride_c: None,
        stride_bias: None,
        batch_size: None,
    }
}

/// Elements cuBLASLt's Hopper GEMM kernels need an operand's contiguous extent to be a whole
/// number of (16 bytes of bf16/f16). GPT-2's vocabulary is 50,257: its two gradient products,
/// whose logits operand is contiguous along the vocabulary, ran on Turing-era
/// `cutlass_75_..._s1688gemm` kernels at 95 and 130 TFLOP/s on an H200 and an H100
/// (2026-11-27, 22.8 ms of a 70.6 ms step), where the forward product, contiguous along the
/// hidden size, ran at 517.
pub const ALIGNED_FEATURES: usize = 8;

impl Product {
    /// A gradient product of an `nn.Linear` weight ([`WeightLayout::OutIn`]) over
    /// out-features not a multiple of [`ALIGNED_FEATURES`], as two products: the first
    /// features rounded down to a multiple, then the rest (`dinp`: the second adds to the
    /// first; `dW`: each writes its own rows). `None` for every other product, which runs
    /// as it is: forward products read the out-features as columns of the output only, and
    /// `Conv1D` weights hold them as columns (no contiguous split).
    pub fn split_features(&self) -> Option<[Product; 2]> {
        let (rows, inf, outf) = self.dims;
        let split = outf - outf % ALIGNED_FEATURES;
        let gradient = matches!(self.pass, Pass::BackwardInput | Pass::BackwardWeight);
        if !gradient || self.weight != WeightLayout::OutIn || split == outf || split == 0 {
            return None;
        }
        let head = Product {
            dims: (rows, inf, split),
            ..*self
        };
        let tail = Product {
            dims: (rows, inf, outf - split),
            accumulate: match self.pass {
                Pass::BackwardInput => Accumulate::Add,
                _ => self.accumulate,
            },
            ..*self
        };
        Some([head, tail])
    }

    /// The products it runs as ([`Self::split_features`]; itself alone when not split), each
    /// with the ranges of the caller's `(out, first, second)` it reads and writes.
    pub fn parts(&self) -> Vec<ProductPart> {
        let plan = self.plan();
        let [a, b, c] = plan.operands;
        let (first, second) = if plan.second_is_a { (b, a) } else { (a, b) };
        let whole = ProductPart {
            product: *self,
            out: 0..c.len(),
            first: 0..first.len(),
            second: 0..second.len(),
        };
        let Some([head, tail]) = self.split_features() else {
            return vec![whole];
        };
        let (rows, inf, _) = self.dims;
        let (split, s) = (head.dims.2, self.stride);
        // The strided (N, OC) operand's columns ..split and split..: rows s apart from 0 and
        // from split; the weight's (or its gradient's) rows ..split and split.. of IC each.
        let columns = |part: &Product, from: usize| from..from + strided_len(rows, part.dims.2, s);
        let [w_head, w_tail] = [0..split * inf, split * inf..self.dims.2 * inf];
        match self.pass {
            // dinp = dout[:, ..split] W[..split] + dout[:, split..] W[split..]
            Pass::BackwardInput => vec![
                ProductPart {
                    product: head,
                    first: columns(&head, 0),
                    second: w_head,
                    ..whole.clone()
                },
                ProductPart {
                    product: tail,
                    first: columns(&tail, split),
                    second: w_tail,
                    ..whole
                },
            ],
            // dW[..split] (+)= dout[:, ..split]^T inp; dW[split..] (+)= dout[:, split..]^T inp
            _ => vec![
                ProductPart {
                    product: head,
                    out: w_head,
                    second: columns(&head, 0),
                    ..whole.clone()
                },
                ProductPart {
                    product: tail,
                    out: w_tail,
                    second: columns(&tail, split),
                    ..whole
                },
            ],
        }
    }

    /// Whether the caller's `(out, first, second)` have the lengths the product spans.
    fn check_lengths(&self, out: usize, first: usize, second: usize) -> Result<(), CudaError> {
        let plan = self.plan();
        let [a_shape, b_shape, c_shape] = plan.operands;
        let (a, b) = if plan.second_is_a {
            (second, first)
        } else {
            (first, second)
        };
        a_shape.check(a)?;
        b_shape.check(b)?;
        c_shape.check(out)
    }

    /// The cuBLASLt configuration and operand shapes. The caller's operands are
    /// `(out, first, second)`: forward `(out, inp, weight)`, backward input
    /// `(dinp, dout, weight)`, backward weight `(dweight, inp, dout)`.
    pub fn plan(&self) -> ProductPlan {
        let (rows, inf, outf) = self.dims;
        let s = self.stride;
        let beta = self.accumulate.beta();
        let strided = |name| Operand {
            name,
            rows,
            cols: outf,
            stride: s,
        };
        use Op::{Plain, Transposed};
        use Pass::{BackwardInput, BackwardWeight, Forward};
        use WeightLayout::{InOut, OutIn};
        // The weight is A: as stored `(IC, OC)` or transposed `(OC, IC)` forward, the other
        // way for the input gradient.
        let (weight, forward_a, backward_a) = match self.weight {
            InOut => (
                Operand::dense("weight", inf, outf),
                (Plain, outf),
                (Transposed, outf),
            ),
            OutIn => (
                Operand::dense("weight", outf, inf),
                (Transposed, inf),
                (Plain, inf),
            ),
        };
        let dweight = Operand {
            name: "dweight",
            ..weight
        };
        let inp = |name| Operand::dense(name, rows, inf);
        let (config, operands, second_is_a) = match (self.pass, self.weight) {
            (Forward, _) => (
                config((outf, rows, inf), forward_a, (Plain, inf), s, beta),
                [weight, inp("inp"), strided("out")],
                true,
            ),
            (BackwardInput, _) => (
                config((inf, rows, outf), backward_a, (Plain, s), inf, beta),
                [weight, strided("dout"), inp("dinp")],
                true,
            ),
            (BackwardWeight, InOut) => (
                config((outf, inf, rows), (Plain, s), (Transposed, inf), outf, beta),
                [strided("dout"), inp("inp"), dweight],
                true,
            ),
            (BackwardWeight, OutIn) => (
                config((inf, outf, rows), (Plain, inf), (Transposed, s), inf, beta),
                [inp("inp"), strided("dout"), dweight],
                false,
            ),
        };
        ProductPlan {
            config,
            operands,
            second_is_a,
        }
    }
}

impl Gemm {
    /// A handle on `stream` (loads `libcublasLt`; the caller has checked the driver).
    pub fn new(stream: Arc<CudaStream>) -> Result<Self, CudaError> {
        // SAFETY: only opens the library.
        if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
            return Err(CudaError::Blas(
                "libcublasLt not found (pip install nvidia-cublas; put its lib directory on \
                 LD_LIBRARY_PATH)"
                    .to_string(),
            ));
        }
        let blas = CudaBlasLT::new(stream).map_err(|e| CudaError::Blas(format!("{e:?}")))?;
        Ok(Self { blas })
    }

    /// `product` on the caller's `(out, first, second)` (see [`Product::plan`]), with a fused
    /// bias (forward only), every length checked first. A gradient product of an `nn.Linear`
    /// weight whose out-features are not a whole number of [`ALIGNED_FEATURES`] runs as two
    /// ([`Product::split_features`]).
    pub fn run<T: GemmElement>(
        &self,
        product: Product,
        out: &mut CudaViewMut<'_, T>,
        first: &CudaView<'_, T>,
        second: &CudaView<'_, T>,
        bias: Option<&CudaView<'_, T>>,
    ) -> Result<(), CudaError> {
        product.check_lengths(out.len(), first.len(), second.len())?;
        if let Some(bias) = bias {
            // Forward products are never split: the bias goes with the one part.
            if product.pass != Pass::Forward {
                return Err(CudaError::Shape(
                    "a bias is fused into forward products only".to_string(),
                ));
            }
            Operand::dense("bias", 1, product.dims.2).check(bias.len())?;
        }
        let out_of_range = || CudaError::Shape("a split product's operand is out of range".into());
        for part in product.parts() {
            let mut out = out.try_slice_mut(part.out).ok_or_else(out_of_range)?;
            let first = first.try_slice(part.first).ok_or_else(out_of_range)?;
            let second = second.try_slice(part.second).ok_or_else(out_of_range)?;
            part.product
                .check_lengths(out.len(), first.len(), second.len())?;
            let plan = part.product.plan();
            let (a, b) = if plan.second_is_a {
                (&second, &first)
            } else {
                (&first, &second)
            };
            let operands = Operands {
                a,
                b,
                c: &mut out,
                bias,
            };
            // SAFETY: every operand's length matches the dimensions and strides given to
            // cuBLASLt (checked above).
            unsafe { T::matmul(&self.blas, plan.config, operands) }
                .map_err(|e| CudaError::Blas(format!("{e:?}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(transa, transb, m, n, k, lda, ldb, ldc, beta)` of a configuration.
    type Key = (bool, bool, u64, u64, u64, i64, i64, i64, f32);

    fn key(c: &MatmulConfig) -> Key {
        (
            c.transa, c.transb, c.m, c.n, c.k, c.lda, c.ldb, c.ldc, c.beta,
        )
    }

    /// Each product's configuration and operand order, pinned to what the seven hand-written
    /// products issued before they became one (N = 5, IC = 3, OC = 7, strided rows 11 apart):
    /// `(product, configuration, A's name, B's name, A is the caller's second operand)`.
    #[test]
    fn every_product_keeps_its_cublaslt_configuration() {
        let dims = (5, 3, 7);
        let (n, ic, oc, s) = (5u64, 3u64, 7u64, 11i64);
        let (ici, oci) = (3i64, 7i64);
        let with = |pass, weight, stride, accumulate| Product {
            pass,
            weight,
            dims,
            stride,
            accumulate,
        };
        use Accumulate::{Add, Overwrite};
        use Pass::{BackwardInput, BackwardWeight, Forward};
        use WeightLayout::{InOut, OutIn};
        #[rustfmt::skip]
        let cases: [(Product, Key, &str, &str, bool); 7] = [
            // matmul_forward: config((OC, N, IC), (Plain, OC), (Plain, IC), OC, 0); A = weight.
            (with(Forward, InOut, 7, Overwrite), (false, false, oc, n, ic, oci, ici, oci, 0.0), "weight", "inp", true),
            // matmul_backward_input: ((IC, N, OC), (T, OC), (Plain, OC), IC, 0); A = weight.
            (with(BackwardInput, InOut, 7, Overwrite), (true, false, ic, n, oc, oci, oci, ici, 0.0), "weight", "dout", true),
            // matmul_backward_weight: ((OC, IC, N), (Plain, OC), (T, IC), OC, 1); A = dout.
            (with(BackwardWeight, InOut, 7, Add), (false, true, oc, ic, n, oci, ici, oci, 1.0), "dout", "inp", true),
            // linear_forward: ((OC, N, IC), (T, IC), (Plain, IC), stride, beta); A = weight.
            (with(Forward, OutIn, 11, Add), (true, false, oc, n, ic, ici, ici, s, 1.0), "weight", "inp", true),
            // linear_backward_input: ((IC, N, OC), (Plain, IC), (Plain, stride), IC, beta).
            (with(BackwardInput, OutIn, 11, Overwrite), (false, false, ic, n, oc, ici, s, ici, 0.0), "weight", "dout", true),
            // linear_backward_weight: ((IC, OC, N), (Plain, IC), (T, stride), IC, 1); A = inp.
            (with(BackwardWeight, OutIn, 11, Add), (false, true, ic, oc, n, ici, s, ici, 1.0), "inp", "dout", false),
            // logits_forward (N, C = IC, V = OC): ((V, N, C), (T, C), (Plain, C), V, 0).
            (with(Forward, OutIn, 7, Overwrite), (true, false, oc, n, ic, ici, ici, oci, 0.0), "weight", "inp", true),
        ];
        for (product, expected, a, b, second_is_a) in cases {
            let plan = product.plan();
            assert_eq!(key(&plan.config), expected, "{product:?}");
            assert_eq!(plan.operands[0].name, a, "{product:?}");
            assert_eq!(plan.operands[1].name, b, "{product:?}");
            assert_eq!(plan.second_is_a, second_is_a, "{product:?}");
            assert!(!plan.config.transc && plan.config.alpha == 1.0);
        }
    }

    /// Gradient products of an `nn.Linear` weight with out-features off a multiple of 8 split
    /// at the multiple below (the input gradient's second half adds, the weight gradient's
    /// halves keep the accumulation); forward products, `Conv1D` weights and aligned widths
    /// do not split.
    #[test]
    fn unaligned_gradient_products_split_at_a_multiple_of_8() {
        let at = |pass, weight, outf| Product {
            pass,
            weight,
            dims: (16, 768, outf),
            stride: 50_304,
            accumulate: Accumulate::Overwrite,
        };
        let [head, tail] = at(Pass::BackwardInput, WeightLayout::OutIn, 50_257)
            .split_features()
            .expect("split");
        assert_eq!((head.dims.2, tail.dims.2), (50_256, 1));
        assert_eq!(
            (head.accumulate, tail.accumulate),
            (Accumulate::Overwrite, Accumulate::Add)
        );
        assert_eq!((head.stride, tail.stride), (50_304, 50_304));
        let [head, tail] = at(Pass::BackwardWeight, WeightLayout::OutIn, 157)
            .split_features()
            .expect("split");
        assert_eq!((head.dims.2, tail.dims.2), (152, 5));
        assert_eq!(tail.accumulate, Accumulate::Overwrite);
        for (pass, weight, outf) in [
            (Pass::Forward, WeightLayout::OutIn, 50_257),
            (Pass::BackwardInput, WeightLayout::InOut, 50_257),
            (Pass::BackwardWeight, WeightLayout::OutIn, 50_304),
            (Pass::BackwardWeight, WeightLayout::OutIn, 5),
        ] {
            let product = at(pass, weight, outf);
            assert!(product.split_features().is_none(), "{product:?}");
            assert_eq!(product.parts().len(), 1, "{product:?}");
        }
    }

    /// The operand shapes: a strided `(N, OC)` operand spans `(N - 1) S + OC`, the weight
    /// follows its layout, and a wrong length is named.
    #[test]
    fn operand_shapes_follow_the_layout_and_the_stride() {
        let product = Product {
            pass: Pass::Forward,
            weight: WeightLayout::OutIn,
            dims: (5, 3, 7),
            stride: 11,
            accumulate: Accumulate::Overwrite,
        };
        let [weight, inp, out] = product.plan().operands;
        assert_eq!((weight.rows, weight.cols), (7, 3));
        assert_eq!(inp.len(), 15);
        assert_eq!(out.len(), 4 * 11 + 7);
        assert!(out.check(51).is_ok());
        let message = out.check(35).expect_err("dense length").to_string();
        assert!(message.contains("out has 35 elements") && message.contains("11 apart"));
        let narrow = Operand { stride: 6, ..out };
        assert!(
            narrow.check(narrow.len()).is_err(),
            "rows closer than a row's width"
        );
    }
}
