//! Matrix products through cuBLASLt, in the CPU model's row-major conventions.
//!
//! cuBLASLt is column-major; a row-major `(r, c)` matrix is the column-major `(c, r)` matrix
//! with the same bytes, so each row-major product `C = A B` is issued as `C^T = B^T A^T`.
//! Bias is fused through cuBLASLt's `BIAS` epilogue (added per output column). bf16/f16
//! inputs run on tensor cores with f32 accumulation; **f32 inputs use cudarc's
//! `CUBLAS_COMPUTE_32F_FAST_TF32`**, so f32 products carry TF32 rounding (about 1e-3 relative)
//! and GPU tests compare them with that tolerance.

use std::sync::Arc;

use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaStream, CudaView, CudaViewMut};

use super::error::CudaError;

/// A cuBLASLt handle with its workspace, on one stream.
#[derive(Debug)]
pub struct Gemm {
    blas: CudaBlasLT,
}

fn check(what: &str, len: usize, rows: usize, cols: usize) -> Result<(), CudaError> {
    if len == rows * cols {
        Ok(())
    } else {
        Err(CudaError::Shape(format!(
            "{what} has {len} elements, expected ({rows}, {cols})"
        )))
    }
}

/// Elements a `(rows, cols)` block spans when its rows lie `stride` apart.
pub fn strided_len(rows: usize, cols: usize, stride: usize) -> usize {
    match rows {
        0 => 0,
        r => (r - 1) * stride + cols,
    }
}

fn check_strided(
    what: &str,
    len: usize,
    rows: usize,
    cols: usize,
    stride: usize,
) -> Result<(), CudaError> {
    if stride >= cols && len == strided_len(rows, cols, stride) {
        Ok(())
    } else {
        Err(CudaError::Shape(format!(
            "{what} has {len} elements, expected ({rows}, {cols}) with rows {stride} apart"
        )))
    }
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

    /// `out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC)`: `matmul_forward`.
    pub fn matmul_forward<T>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        bias: Option<&CudaView<'_, T>>,
        (rows, in_features, out_features): (usize, usize, usize),
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("out", out.len(), rows, out_features)?;
        check("inp", inp.len(), rows, in_features)?;
        check("weight", weight.len(), in_features, out_features)?;
        if let Some(bias) = bias {
            check("bias", bias.len(), 1, out_features)?;
        }
        let cfg = config(
            (out_features, rows, in_features),
            (Op::Plain, out_features),
            (Op::Plain, in_features),
            out_features,
            0.0,
        );
        // SAFETY: every operand's length matches the dimensions given to cuBLASLt (checked).
        unsafe { self.blas.matmul(cfg, weight, inp, out, bias, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `dinp (N, IC) = dout (N, OC) @ weight^T`: the first half of `matmul_backward`.
    pub fn matmul_backward_input<T>(
        &self,
        dinp: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        (rows, in_features, out_features): (usize, usize, usize),
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("dinp", dinp.len(), rows, in_features)?;
        check("dout", dout.len(), rows, out_features)?;
        check("weight", weight.len(), in_features, out_features)?;
        let cfg = config(
            (in_features, rows, out_features),
            (Op::Transposed, out_features),
            (Op::Plain, out_features),
            in_features,
            0.0,
        );
        // SAFETY: lengths checked against the dimensions.
        unsafe { self.blas.matmul(cfg, weight, dout, dinp, None, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `dweight (IC, OC) += inp^T @ dout`: the second half of `matmul_backward` (the bias
    /// gradient is `Launcher::bias_backward`).
    pub fn matmul_backward_weight<T>(
        &self,
        dweight: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
        dout: &CudaView<'_, T>,
        (rows, in_features, out_features): (usize, usize, usize),
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("dweight", dweight.len(), in_features, out_features)?;
        check("inp", inp.len(), rows, in_features)?;
        check("dout", dout.len(), rows, out_features)?;
        let cfg = config(
            (out_features, in_features, rows),
            (Op::Plain, out_features),
            (Op::Transposed, in_features),
            out_features,
            1.0,
        );
        // SAFETY: lengths checked against the dimensions.
        unsafe { self.blas.matmul(cfg, dout, inp, dweight, None, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `out (N, OC) (+)= inp (N, IC) @ weight^T + bias (OC)` with an `nn.Linear` weight
    /// `(OC, IC)` (the Llama family's projections); `out`'s rows lie `out_stride` elements
    /// apart (a column block of a wider buffer when `out_stride > OC`).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_forward<T>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        bias: Option<&CudaView<'_, T>>,
        (rows, in_features, out_features): (usize, usize, usize),
        out_stride: usize,
        accumulate: Accumulate,
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check_strided("out", out.len(), rows, out_features, out_stride)?;
        check("inp", inp.len(), rows, in_features)?;
        check("weight", weight.len(), out_features, in_features)?;
        if let Some(bias) = bias {
            check("bias", bias.len(), 1, out_features)?;
        }
        let cfg = config(
            (out_features, rows, in_features),
            (Op::Transposed, in_features),
            (Op::Plain, in_features),
            out_stride,
            accumulate.beta(),
        );
        // SAFETY: every operand's length matches the dimensions and strides (checked).
        unsafe { self.blas.matmul(cfg, weight, inp, out, bias, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `dinp (N, IC) (+)= dout (N, OC) @ weight` with an `nn.Linear` weight `(OC, IC)`;
    /// `dout`'s rows lie `dout_stride` elements apart.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_backward_input<T>(
        &self,
        dinp: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        (rows, in_features, out_features): (usize, usize, usize),
        dout_stride: usize,
        accumulate: Accumulate,
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("dinp", dinp.len(), rows, in_features)?;
        check_strided("dout", dout.len(), rows, out_features, dout_stride)?;
        check("weight", weight.len(), out_features, in_features)?;
        let cfg = config(
            (in_features, rows, out_features),
            (Op::Plain, in_features),
            (Op::Plain, dout_stride),
            in_features,
            accumulate.beta(),
        );
        // SAFETY: lengths checked against the dimensions and strides.
        unsafe { self.blas.matmul(cfg, weight, dout, dinp, None, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `dweight (OC, IC) += dout^T @ inp` with an `nn.Linear` weight; `dout`'s rows lie
    /// `dout_stride` elements apart.
    pub fn linear_backward_weight<T>(
        &self,
        dweight: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
        dout: &CudaView<'_, T>,
        (rows, in_features, out_features): (usize, usize, usize),
        dout_stride: usize,
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("dweight", dweight.len(), out_features, in_features)?;
        check("inp", inp.len(), rows, in_features)?;
        check_strided("dout", dout.len(), rows, out_features, dout_stride)?;
        let cfg = config(
            (in_features, out_features, rows),
            (Op::Plain, in_features),
            (Op::Transposed, dout_stride),
            in_features,
            1.0,
        );
        // SAFETY: lengths checked against the dimensions and strides.
        unsafe { self.blas.matmul(cfg, inp, dout, dweight, None, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }

    /// `logits (N, V) = lnf (N, C) @ wte^T`: `logits_forward` (the tied `lm_head`).
    pub fn logits_forward<T>(
        &self,
        logits: &mut CudaViewMut<'_, T>,
        lnf: &CudaView<'_, T>,
        wte: &CudaView<'_, T>,
        (rows, channels, vocab): (usize, usize, usize),
    ) -> Result<(), CudaError>
    where
        CudaBlasLT: Matmul<T>,
    {
        check("logits", logits.len(), rows, vocab)?;
        check("lnf", lnf.len(), rows, channels)?;
        check("wte", wte.len(), vocab, channels)?;
        let cfg = config(
            (vocab, rows, channels),
            (Op::Transposed, channels),
            (Op::Plain, channels),
            vocab,
            0.0,
        );
        // SAFETY: lengths checked against the dimensions.
        unsafe { self.blas.matmul(cfg, wte, lnf, logits, None, None) }
            .map_err(|e| CudaError::Blas(format!("{e:?}")))
    }
}
