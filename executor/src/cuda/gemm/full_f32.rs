//! f32 products in full f32 precision (`CUBLAS_COMPUTE_32F`).
//!
//! cudarc's `Matmul<f32>` asks cuBLASLt for `CUBLAS_COMPUTE_32F_FAST_TF32`, which rounds the
//! operands to TF32 (10 mantissa bits). PyTorch multiplies f32 in full precision unless told
//! otherwise (`torch.backends.cuda.matmul.allow_tf32` is off by default), and dsplan's f32 runs
//! are held against PyTorch's and the CPU backend's, so f32 goes through this one call instead:
//! the same cuBLASLt sequence as cudarc's (layouts, descriptor, one heuristic, the product),
//! with the full-precision compute type and no workspace. bf16 and f16 stay on cudarc's path.
//! Measured on an H200 (2026-11-26): the TF32 path missed the CPU's f32 step by 9e-4 in the
//! parameters after one AdamW step; this one is what the f32 checks hold to 1e-5.

use std::ffi::c_void;
use std::mem::size_of;

use cudarc::cublaslt::result::{self, CublasError};
use cudarc::cublaslt::sys;
use cudarc::cublaslt::{CudaBlasLT, MatmulConfig, MatmulShared};
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::Operands;

/// A matrix layout, destroyed on drop.
struct Layout(sys::cublasLtMatrixLayout_t);

impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `create_matrix_layout`, destroyed once.
        let _ = unsafe { result::destroy_matrix_layout(self.0) };
    }
}

/// A matmul descriptor, destroyed on drop.
struct Desc(sys::cublasLtMatmulDesc_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_desc`, destroyed once.
        let _ = unsafe { result::destroy_matmul_desc(self.0) };
    }
}

/// A heuristic preference, destroyed on drop.
struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `create_matmul_pref`, destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// Sets one attribute of `desc` to `value`.
///
/// # Safety
/// `T` must be the attribute's C type.
unsafe fn set<T>(
    desc: &Desc,
    attribute: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), CublasError> {
    // SAFETY: `value` outlives the call and has the attribute's size (the caller's promise).
    unsafe {
        result::set_matmul_desc_attribute(
            desc.0,
            attribute,
            value as *const T as *const c_void,
            size_of::<T>(),
        )
    }
}

/// `c = op(a) op(b) (+ bias) + beta c` in full f32 precision, as `config` describes it.
///
/// # Safety
/// Every operand's length must match the dimensions and leading dimensions in `config` (the
/// caller, `Gemm::run`, has checked them).
pub(super) unsafe fn matmul(
    blas: &CudaBlasLT,
    config: MatmulConfig,
    Operands { a, b, c, bias }: Operands<'_, '_, '_, f32>,
) -> Result<(), CublasError> {
    use sys::cublasLtMatmulDescAttributes_t as Attr;
    let f32_type = sys::cudaDataType_t::CUDA_R_32F;
    let stored = |transposed: bool, rows: u64, cols: u64| match transposed {
        true => (cols, rows),
        false => (rows, cols),
    };
    let (a_rows, a_cols) = stored(config.transa, config.m, config.k);
    let (b_rows, b_cols) = stored(config.transb, config.k, config.n);
    let a_layout = Layout(result::create_matrix_layout(
        f32_type, a_rows, a_cols, config.lda,
    )?);
    let b_layout = Layout(result::create_matrix_layout(
        f32_type, b_rows, b_cols, config.ldb,
    )?);
    let c_layout = Layout(result::create_matrix_layout(
        f32_type, config.m, config.n, config.ldc,
    )?);
    let desc = Desc(result::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        f32_type,
    )?);
    // cublasOperation_t, an int32: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
    let operation = |transposed: bool| -> i32 { i32::from(transposed) };
    let stream = blas.stream();
    // SAFETY: the attributes' C types: cublasOperation_t (int32), a device pointer
    // (CUdeviceptr), cublasLtEpilogue_t.
    unsafe {
        set(
            &desc,
            Attr::CUBLASLT_MATMUL_DESC_TRANSA,
            &operation(config.transa),
        )?;
        set(
            &desc,
            Attr::CUBLASLT_MATMUL_DESC_TRANSB,
            &operation(config.transb),
        )?;
    }
    let (bias_ptr, _bias_record) = bias.map(|b| b.device_ptr(stream)).unzip();
    if let Some(ptr) = bias_ptr {
        // SAFETY: as above.
        unsafe {
            set(&desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptr)?;
            set(
                &desc,
                Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            )?;
        }
    }
    let pref = Pref(result::create_matmul_pref()?);
    let handle = *blas.handle();
    // SAFETY: every handle above is live; the layouts describe the operands (caller's promise).
    let heuristic = unsafe {
        result::get_matmul_algo_heuristic(
            handle, desc.0, a_layout.0, b_layout.0, c_layout.0, c_layout.0, pref.0,
        )?
    };
    let (a_ptr, _a_record) = a.device_ptr(stream);
    let (b_ptr, _b_record) = b.device_ptr(stream);
    let (c_ptr, _c_record) = c.device_ptr_mut(stream);
    // SAFETY: as above; no workspace (size 0), so the heuristic chose an algorithm without one.
    unsafe {
        result::matmul(
            handle,
            desc.0,
            &config.alpha as *const f32 as *const c_void,
            &config.beta as *const f32 as *const c_void,
            a_ptr as *const c_void,
            a_layout.0,
            b_ptr as *const c_void,
            b_layout.0,
            c_ptr as *const c_void,
            c_layout.0,
            c_ptr as *mut c_void,
            c_layout.0,
            &heuristic.algo,
            std::ptr::null_mut(),
            0,
            stream.cu_stream() as *mut _,
        )
    }
}
