//! Matrix views over flat buffers and one checked entry point to the `gemm` crate.
//!
//! Every matrix product of the model goes through [`matmul`]: `dst (+)= lhs @ rhs`, where each
//! operand is a strided view (so a transpose is just swapped strides, and one attention head is
//! a column block of the `qkv` rows). The views check their extent against their buffer when
//! built, so the one `unsafe` call into `gemm` reads and writes only inside borrowed memory.

use std::marker::PhantomData;

/// Whether a product replaces the destination or adds to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    /// `dst = lhs @ rhs`.
    Overwrite,
    /// `dst += lhs @ rhs` (gradients accumulate).
    Add,
}

/// How many threads one product may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// The calling thread only (inside an outer parallel loop).
    Single,
    /// The whole rayon pool.
    Pool,
}

/// Index of the last element a `rows x cols` view with these strides touches, plus one.
fn extent(rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * row_stride + (cols - 1) * col_stride + 1
    }
}

/// A read-only strided matrix view: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A contiguous row-major `rows x cols` matrix at the start of `data`.
    ///
    /// # Panics
    /// When `data` is too short (a layout bug).
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// A row-major `rows x cols` matrix whose rows start `row_stride` elements apart.
    ///
    /// # Panics
    /// When `data` is too short (a layout bug).
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        assert!(
            extent(rows, cols, row_stride, 1) <= data.len(),
            "{rows}x{cols} view (row stride {row_stride}) exceeds {} elements",
            data.len()
        );
        Self {
            data,
            rows,
            cols,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose (no copy: the strides swap).
    pub fn t(self) -> Self {
        Self {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..self
        }
    }
}

/// A writable strided matrix view (row-major, rows `row_stride` apart).
///
/// Holds a raw pointer rather than a slice so that column blocks of the same rows (one per
/// attention head) can be written from different threads without two `&mut` slices overlapping.
#[derive(Debug)]
pub struct MatMut<'a> {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    row_stride: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

impl<'a> MatMut<'a> {
    /// A contiguous row-major `rows x cols` matrix at the start of `data`.
    ///
    /// # Panics
    /// When `data` is too short (a layout bug).
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// A row-major `rows x cols` matrix at the start of `data` whose rows start `row_stride`
    /// elements apart (a block of the first `cols` columns of a wider matrix).
    ///
    /// # Panics
    /// When `data` is too short (a layout bug).
    pub fn strided(data: &'a mut [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        assert!(
            extent(rows, cols, row_stride, 1) <= data.len(),
            "{rows}x{cols} view (row stride {row_stride}) exceeds {} elements",
            data.len()
        );
        Self {
            ptr: data.as_mut_ptr(),
            rows,
            cols,
            row_stride,
            _borrow: PhantomData,
        }
    }
}

/// A mutable buffer shared by threads that each write a disjoint, strided part of it.
pub(crate) struct SharedMut<'a> {
    ptr: *mut f32,
    len: usize,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: `SharedMut` only hands out `MatMut` views through the `unsafe fn view`, whose callers
// promise that concurrently live views never touch the same element.
unsafe impl Send for SharedMut<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedMut<'_> {}

impl<'a> SharedMut<'a> {
    /// Shares `data` for disjoint strided writes.
    pub(crate) fn new(data: &'a mut [f32]) -> Self {
        Self {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: PhantomData,
        }
    }

    /// The `rows x cols` view starting at `offset` with rows `row_stride` apart.
    ///
    /// # Safety
    /// No other view of this buffer that is alive at the same time may touch any element of
    /// this one.
    ///
    /// # Panics
    /// When the view exceeds the buffer (a layout bug).
    pub(crate) unsafe fn view(
        &self,
        offset: usize,
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> MatMut<'_> {
        assert!(
            offset + extent(rows, cols, row_stride, 1) <= self.len,
            "view exceeds the shared buffer"
        );
        MatMut {
            // SAFETY: `offset` is inside the buffer (checked above, or the view is empty).
            ptr: unsafe { self.ptr.add(offset.min(self.len)) },
            rows,
            cols,
            row_stride,
            _borrow: PhantomData,
        }
    }
}

/// `dst = lhs @ rhs` or `dst += lhs @ rhs`, in f32.
///
/// # Panics
/// When the shapes do not chain (`lhs` is `m x k`, `rhs` is `k x n`, `dst` is `m x n`): a
/// layout bug.
pub fn matmul(
    dst: MatMut<'_>,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    mode: Accumulate,
    threads: Threads,
) {
    assert!(
        lhs.rows == dst.rows && rhs.cols == dst.cols && lhs.cols == rhs.rows,
        "matmul shapes: ({}x{}) = ({}x{}) @ ({}x{})",
        dst.rows,
        dst.cols,
        lhs.rows,
        lhs.cols,
        rhs.rows,
        rhs.cols
    );
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    if m == 0 || n == 0 {
        return;
    }
    let parallelism = match threads {
        Threads::Single => gemm::Parallelism::None,
        Threads::Pool => gemm::Parallelism::Rayon(0),
    };
    let read_dst = mode == Accumulate::Add;
    if k == 0 {
        if !read_dst {
            for i in 0..m {
                // SAFETY: row `i` of `dst` lies inside its buffer (checked when the view was made).
                unsafe { std::ptr::write_bytes(dst.ptr.add(i * dst.row_stride), 0, n) };
            }
        }
        return;
    }
    let as_isize = |x: usize| isize::try_from(x).unwrap_or(isize::MAX);
    // SAFETY: every view was checked against its buffer when built, `dst` is borrowed mutably
    // (or, for `SharedMut` views, exclusively by the caller's promise), and the shapes chain.
    // gemm computes dst := alpha*dst + beta*lhs@rhs, reading dst only when `read_dst`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.ptr,
            1,
            as_isize(dst.row_stride),
            read_dst,
            lhs.data.as_ptr(),
            as_isize(lhs.col_stride),
            as_isize(lhs.row_stride),
            rhs.data.as_ptr(),
            as_isize(rhs.col_stride),
            as_isize(rhs.row_stride),
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn matches_naive_product_and_transposes() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let expected = naive(&a, &b, m, k, n);

        let mut c = vec![1.0; m * n];
        matmul(
            MatMut::new(&mut c, m, n),
            MatRef::new(&a, m, k),
            MatRef::new(&b, k, n),
            Accumulate::Overwrite,
            Threads::Pool,
        );
        for (x, y) in c.iter().zip(&expected) {
            assert!((x - y).abs() < 1e-5);
        }

        // c += (b^T)^T @ ... : (a^T)^T @ b with a stored transposed.
        let mut a_t = vec![0.0; k * m];
        for i in 0..m {
            for p in 0..k {
                a_t[p * m + i] = a[i * k + p];
            }
        }
        matmul(
            MatMut::new(&mut c, m, n),
            MatRef::new(&a_t, k, m).t(),
            MatRef::new(&b, k, n),
            Accumulate::Add,
            Threads::Single,
        );
        for (x, y) in c.iter().zip(&expected) {
            assert!((x - 2.0 * y).abs() < 1e-5);
        }
    }
}
