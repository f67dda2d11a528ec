//! Typed launches of the Llama family's kernels (`rmsnorm.cu`, `rope.cu`, `swiglu.cu`; the
//! grouped-query attention and the split bias gradient are [`super::Launcher`]'s, shared with
//! GPT-2), bound to their descriptions in [`super::table`] like the rest.

use cudarc::driver::{CudaView, CudaViewMut};

use super::table::{self, RopeShape, Rotation};
use super::{Launcher, Operand, Storage, read, write};
use crate::cuda::error::CudaError;

impl Launcher<'_> {
    /// `rmsnorm_forward`: `out = weight * (inp * rstd)`, saving `rstd` (N).
    pub fn rmsnorm_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        rstd: &mut CudaViewMut<'_, f32>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        eps: f32,
    ) -> Result<(), CudaError> {
        let call = table::rmsnorm_forward(T::DTYPE, rstd.len(), weight.len())?;
        self.run(
            &call,
            T::DTYPE,
            &mut [
                write(out),
                write(rstd),
                read(inp),
                read(weight),
                Operand::Float(eps),
            ],
        )
    }

    /// `rmsnorm_backward` then `add_partials`: `dinp +=`, `dweight +=`. `scratch` holds
    /// `ceil(N / 32) * C` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_backward<T: Storage>(
        &self,
        dinp: &mut CudaViewMut<'_, T>,
        dweight: &mut CudaViewMut<'_, T>,
        scratch: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        rstd: &CudaView<'_, f32>,
    ) -> Result<(), CudaError> {
        let calls = table::rmsnorm_backward(T::DTYPE, rstd.len(), weight.len())?;
        let [backward, sum] = calls.as_slice() else {
            return Err(CudaError::Shape("rmsnorm_backward is two launches".into()));
        };
        self.run(
            backward,
            T::DTYPE,
            &mut [
                write(dinp),
                write(scratch),
                read(dout),
                read(inp),
                read(weight),
                read(rstd),
            ],
        )?;
        let sums = scratch.as_view();
        self.run(sum, T::DTYPE, &mut [write(dweight), read(&sums)])
    }

    /// `rope_forward` or `rope_backward`, in place on `rows` `(N, width)`: the first
    /// `heads * hs` columns of each row are turned by the angles of `cos` and `sin`
    /// `(T, hs/2)` (the host's [`crate::model::rope::RopeTable`]); row `r` is at position
    /// `r % T`. `shape` is `(width, heads, T)`.
    pub fn rope<T: Storage>(
        &self,
        rows: &mut CudaViewMut<'_, T>,
        cos: &CudaView<'_, f32>,
        sin: &CudaView<'_, f32>,
        shape: (usize, usize, usize),
        rotation: Rotation,
    ) -> Result<(), CudaError> {
        let (width, heads, seq_len) = shape;
        let shape = RopeShape {
            len: rows.len(),
            table: cos.len(),
            width,
            heads,
            seq_len,
        };
        let call = table::rope(T::DTYPE, shape, rotation)?;
        self.run(&call, T::DTYPE, &mut [write(rows), read(cos), read(sin)])
    }

    /// `swiglu_forward`: `out (N, I) = silu(gate) * up` from `gate_up (N, 2I)`.
    pub fn swiglu_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        gate_up: &CudaView<'_, T>,
        inner: usize,
    ) -> Result<(), CudaError> {
        let rows = table::swiglu_rows(gate_up.len(), inner)?;
        let call = table::swiglu_forward(T::DTYPE, rows, inner)?;
        self.run(&call, T::DTYPE, &mut [write(out), read(gate_up)])
    }

    /// `swiglu_backward`: `dgate_up (N, 2I)` written from `dout (N, I)` and `gate_up`.
    pub fn swiglu_backward<T: Storage>(
        &self,
        dgate_up: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        gate_up: &CudaView<'_, T>,
        inner: usize,
    ) -> Result<(), CudaError> {
        let rows = table::swiglu_rows(gate_up.len(), inner)?;
        let call = table::swiglu_backward(T::DTYPE, rows, inner)?;
        self.run(
            &call,
            T::DTYPE,
            &mut [write(dgate_up), read(dout), read(gate_up)],
        )
    }

    /// `encoder_backward_wte` alone: `dwte[token] += dout` rows by token buckets (the Llama
    /// family has no position table). The buckets come from `TokenBuckets::new` over tokens
    /// < V (the run's data check), so every row index is < N and every token row is inside
    /// dwte.
    pub fn embedding_backward<T: Storage>(
        &self,
        dwte: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        bucket_tokens: &CudaView<'_, u32>,
        bucket_starts: &CudaView<'_, i32>,
        bucket_rows: &CudaView<'_, i32>,
    ) -> Result<(), CudaError> {
        let rows = bucket_rows.len();
        let channels = table::rows_of("dout", dout.len(), rows)?;
        let calls = table::embedding_backward(T::DTYPE, rows, bucket_tokens.len(), channels)?;
        for call in &calls {
            self.run(
                call,
                T::DTYPE,
                &mut [
                    write(dwte),
                    read(dout),
                    read(bucket_tokens),
                    read(bucket_starts),
                    read(bucket_rows),
                ],
            )?;
        }
        Ok(())
    }
}
