//! Typed launches of the Llama family's kernels (`rmsnorm.cu`, `rope.cu`, `swiglu.cu` and the
//! grouped-query entry points of `attention.cu`), with the same discipline as the rest of
//! [`super::Launcher`]: lengths checked against the shape before the launch, the grid from the
//! registry's rule, the semantics of the CPU twin the registry names.

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};
use dsplan_kernels::Work;

use super::{Launcher, Storage, attention_scale, expect_len, int, long, spec};
use crate::cuda::error::CudaError;

/// Which way [`Launcher::rope`] turns the pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// By `+angle`: `rope_forward` (`executor::model::rope::rope_forward`).
    Forward,
    /// By `-angle`, the transpose: `rope_backward` on the gradient.
    Backward,
}

/// The sizes of one grouped-query attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupedAttention {
    /// `B`.
    pub batch: usize,
    /// `T`.
    pub seq_len: usize,
    /// `NH`, query heads.
    pub n_head: usize,
    /// `KV`, key/value heads (divides `NH`).
    pub kv_heads: usize,
    /// `hs`.
    pub head_dim: usize,
}

impl GroupedAttention {
    /// Elements of a `[q | k | v]` row: `(NH + 2 KV) hs`.
    fn width(&self) -> usize {
        (self.n_head + 2 * self.kv_heads) * self.head_dim
    }

    /// Checks the sizes and `qkv`'s length; the work of `heads` blocks per batch row.
    fn work(&self, qkv_len: usize, heads: usize) -> Result<Work, CudaError> {
        if self.kv_heads == 0 || !self.n_head.is_multiple_of(self.kv_heads) {
            return Err(CudaError::Shape(format!(
                "{} key/value heads do not divide {} query heads",
                self.kv_heads, self.n_head
            )));
        }
        expect_len("qkv", qkv_len, self.batch * self.seq_len * self.width())?;
        Ok(Work::Attention {
            batch: self.batch as u64,
            seq_len: self.seq_len as u64,
            heads: heads as u64,
            head_dim: self.head_dim as u64,
        })
    }
}

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
        let channels = weight.len();
        let rows = rstd.len();
        expect_len("inp", inp.len(), rows * channels)?;
        expect_len("out", out.len(), rows * channels)?;
        let spec = spec("rmsnorm_forward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            spec,
            Work::Rows {
                rows: rows as u64,
                cols: channels as u64,
            },
        )?;
        let (rows, channels) = (int("N", rows)?, int("C", channels)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(rstd)
            .arg(inp)
            .arg(weight)
            .arg(&rows)
            .arg(&channels)
            .arg(&eps);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
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
        let channels = weight.len();
        let rows = rstd.len();
        for (what, len) in [
            ("dinp", dinp.len()),
            ("dout", dout.len()),
            ("inp", inp.len()),
        ] {
            expect_len(what, len, rows * channels)?;
        }
        expect_len("dweight", dweight.len(), channels)?;
        let spec = spec("rmsnorm_backward")?;
        let cfg = Self::config(
            spec,
            Work::Rows {
                rows: rows as u64,
                cols: channels as u64,
            },
        )?;
        let chunks = cfg.grid_dim.0 as usize;
        expect_len("scratch", scratch.len(), chunks * channels)?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let (rows_i, channels_i) = (int("N", rows)?, int("C", channels)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(dinp)
            .arg(&mut *scratch)
            .arg(dout)
            .arg(inp)
            .arg(weight)
            .arg(rstd)
            .arg(&rows_i)
            .arg(&channels_i);
        // SAFETY: lengths checked above, scratch sized for the grid.
        unsafe { b.launch(cfg) }?;
        let scratch = scratch.as_view();
        self.add_partials(dweight, &scratch, chunks, channels, long(channels))
    }

    /// `rope_forward` or `rope_backward`, in place on `rows` `(N, width)`: the first
    /// `heads * hs` columns of each row are turned by the angles of `cos` and `sin`
    /// `(T, hs/2)` (the host's [`crate::model::rope::RopeTable`]); row `r` is at position
    /// `r % T`.
    pub fn rope<T: Storage>(
        &self,
        rows: &mut CudaViewMut<'_, T>,
        cos: &CudaView<'_, f32>,
        sin: &CudaView<'_, f32>,
        shape: (usize, usize, usize),
        rotation: Rotation,
    ) -> Result<(), CudaError> {
        let (width, heads, seq_len) = shape;
        expect_len("sin", sin.len(), cos.len())?;
        if seq_len == 0 || cos.len() % seq_len != 0 || width == 0 || rows.len() % width != 0 {
            return Err(CudaError::Shape(format!(
                "the table ({} values) is not (T = {seq_len}, hs/2), or the rows not {width} wide",
                cos.len()
            )));
        }
        let half = cos.len() / seq_len;
        let n_rows = rows.len() / width;
        if heads * 2 * half > width {
            return Err(CudaError::Shape(format!(
                "{heads} heads of {} do not fit rows of {width}",
                2 * half
            )));
        }
        let spec = spec(match rotation {
            Rotation::Forward => "rope_forward",
            Rotation::Backward => "rope_backward",
        })?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements((n_rows * heads * half) as u64))?;
        let (n_rows, width, heads, half, seq_len) = (
            int("N", n_rows)?,
            int("width", width)?,
            int("heads", heads)?,
            int("hs/2", half)?,
            int("T", seq_len)?,
        );
        let mut b = self.stream.launch_builder(&f);
        b.arg(rows)
            .arg(cos)
            .arg(sin)
            .arg(&n_rows)
            .arg(&width)
            .arg(&heads)
            .arg(&half)
            .arg(&seq_len);
        // SAFETY: the rotated columns fit each row, the table holds T rows of hs/2 (checked).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `swiglu_forward`: `out (N, I) = silu(gate) * up` from `gate_up (N, 2I)`.
    pub fn swiglu_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        gate_up: &CudaView<'_, T>,
        inner: usize,
    ) -> Result<(), CudaError> {
        let rows = Self::swiglu_rows(gate_up.len(), inner)?;
        expect_len("out", out.len(), rows * inner)?;
        let spec = spec("swiglu_forward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements((rows * inner) as u64))?;
        let (rows, inner) = (int("N", rows)?, int("I", inner)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(gate_up).arg(&rows).arg(&inner);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `swiglu_backward`: `dgate_up (N, 2I)` written from `dout (N, I)` and `gate_up`.
    pub fn swiglu_backward<T: Storage>(
        &self,
        dgate_up: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        gate_up: &CudaView<'_, T>,
        inner: usize,
    ) -> Result<(), CudaError> {
        let rows = Self::swiglu_rows(gate_up.len(), inner)?;
        expect_len("dgate_up", dgate_up.len(), gate_up.len())?;
        expect_len("dout", dout.len(), rows * inner)?;
        let spec = spec("swiglu_backward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements((rows * inner) as u64))?;
        let (rows, inner) = (int("N", rows)?, int("I", inner)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(dgate_up)
            .arg(dout)
            .arg(gate_up)
            .arg(&rows)
            .arg(&inner);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `encoder_backward_wte` alone: `dwte[token] += dout` rows by token buckets (the Llama
    /// family has no position table).
    pub fn embedding_backward<T: Storage>(
        &self,
        dwte: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        bucket_tokens: &CudaView<'_, u32>,
        bucket_starts: &CudaView<'_, i32>,
        bucket_rows: &CudaView<'_, i32>,
    ) -> Result<(), CudaError> {
        let rows = bucket_rows.len();
        if rows == 0 || dout.len() % rows != 0 {
            return Err(CudaError::Shape(format!(
                "dout ({} elements) is not {rows} rows",
                dout.len()
            )));
        }
        let channels = dout.len() / rows;
        expect_len(
            "bucket starts",
            bucket_starts.len(),
            bucket_tokens.len() + 1,
        )?;
        if bucket_tokens.is_empty() {
            return Ok(());
        }
        let spec = spec("encoder_backward_wte")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            spec,
            Work::Groups {
                groups: bucket_tokens.len() as u64,
                cols: channels as u64,
            },
        )?;
        let channels_i = int("C", channels)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(dwte)
            .arg(dout)
            .arg(bucket_tokens)
            .arg(bucket_starts)
            .arg(bucket_rows)
            .arg(&channels_i);
        // SAFETY: the buckets come from `TokenBuckets::new` over tokens < V (the run's data
        // check), so every row index is < N and every token row is inside dwte.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Several biases' gradients from one `(N, W)` output gradient: `column_partials` over all
    /// `W` columns, then each bias adds its columns (`dbiases[i]` the columns after
    /// `dbiases[..i]`'s). `scratch` holds `ceil(N / 64) * W` f32.
    pub fn split_bias_backward<T: Storage>(
        &self,
        dbiases: &mut [CudaViewMut<'_, T>],
        scratch: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let width: usize = dbiases.iter().map(|b| b.len()).sum();
        if width == 0 || dout.len() % width != 0 {
            return Err(CudaError::Shape(format!("dout is not (N, {width})")));
        }
        let rows = dout.len() / width;
        let spec = spec("column_partials")?;
        let cfg = Self::config(
            spec,
            Work::Rows {
                rows: rows as u64,
                cols: width as u64,
            },
        )?;
        let chunks = cfg.grid_dim.1 as usize;
        expect_len("scratch", scratch.len(), chunks * width)?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let (rows_i, width_i) = (int("N", rows)?, int("W", width)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut *scratch).arg(dout).arg(&rows_i).arg(&width_i);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        let mut column = 0;
        for dbias in dbiases.iter_mut() {
            let cols = dbias.len();
            let partials = scratch.slice(column..);
            self.add_partials(dbias, &partials, chunks, cols, long(width))?;
            column += cols;
        }
        Ok(())
    }

    /// Rows of a `[gate | up]` buffer of `len` elements.
    fn swiglu_rows(len: usize, inner: usize) -> Result<usize, CudaError> {
        if inner == 0 || !len.is_multiple_of(2 * inner) {
            return Err(CudaError::Shape(format!(
                "gate_up ({len} elements) is not (N, 2 x {inner})"
            )));
        }
        Ok(len / (2 * inner))
    }

    /// `attention_forward_gqa`: `out (B, T, NH hs)` and `lse (B, NH, T)` from
    /// `qkv (B, T, (NH + 2 KV) hs)`.
    pub fn attention_forward_gqa<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        lse: &mut CudaViewMut<'_, f32>,
        qkv: &CudaView<'_, T>,
        dims: GroupedAttention,
    ) -> Result<(), CudaError> {
        let work = dims.work(qkv.len(), dims.n_head)?;
        let GroupedAttention {
            batch,
            seq_len,
            n_head,
            kv_heads,
            head_dim,
        } = dims;
        expect_len("out", out.len(), batch * seq_len * n_head * head_dim)?;
        expect_len("lse", lse.len(), batch * n_head * seq_len)?;
        let spec = spec("attention_forward_gqa")?;
        let f = self
            .modules
            .function(spec, spec.entry_point_for_head_dim(T::DTYPE, head_dim)?)?;
        let cfg = Self::config(spec, work)?;
        let scale = attention_scale(head_dim);
        let (t, nh, kv) = (int("T", seq_len)?, int("NH", n_head)?, int("KV", kv_heads)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(lse)
            .arg(qkv)
            .arg(&t)
            .arg(&nh)
            .arg(&kv)
            .arg(&scale);
        // SAFETY: lengths checked above; the entry point exists for this head size.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Grouped-query attention backward: `delta (B, NH, T)` scratch, then dk/dv (one block per
    /// key/value head, its group's query heads summed in order) and dq into
    /// `dqkv (B, T, (NH + 2 KV) hs)` (written, not accumulated).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward_gqa<T: Storage>(
        &self,
        dqkv: &mut CudaViewMut<'_, T>,
        delta: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
        out: &CudaView<'_, T>,
        qkv: &CudaView<'_, T>,
        lse: &CudaView<'_, f32>,
        dims: GroupedAttention,
    ) -> Result<(), CudaError> {
        let query_work = dims.work(qkv.len(), dims.n_head)?;
        let key_work = dims.work(qkv.len(), dims.kv_heads)?;
        let GroupedAttention {
            batch,
            seq_len,
            n_head,
            kv_heads,
            head_dim,
        } = dims;
        let a = n_head * head_dim;
        expect_len("dqkv", dqkv.len(), qkv.len())?;
        expect_len("dout", dout.len(), batch * seq_len * a)?;
        expect_len("out", out.len(), batch * seq_len * a)?;
        expect_len("lse", lse.len(), batch * n_head * seq_len)?;
        expect_len("delta", delta.len(), batch * n_head * seq_len)?;
        let scale = attention_scale(head_dim);
        let (b_i, t_i, nh_i, kv_i, hs_i) = (
            int("B", batch)?,
            int("T", seq_len)?,
            int("NH", n_head)?,
            int("KV", kv_heads)?,
            int("hs", head_dim)?,
        );

        let pre = spec("attention_backward_preprocess")?;
        let f = self.modules.function(pre, pre.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            pre,
            Work::Rows {
                rows: (batch * n_head * seq_len) as u64,
                cols: head_dim as u64,
            },
        )?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut *delta)
            .arg(dout)
            .arg(out)
            .arg(&b_i)
            .arg(&t_i)
            .arg(&nh_i)
            .arg(&hs_i);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        let delta = delta.as_view();

        for (name, work) in [
            ("attention_backward_dkdv_gqa", key_work),
            ("attention_backward_dq_gqa", query_work),
        ] {
            let spec = spec(name)?;
            let f = self
                .modules
                .function(spec, spec.entry_point_for_head_dim(T::DTYPE, head_dim)?)?;
            let cfg = Self::config(spec, work)?;
            let mut b = self.stream.launch_builder(&f);
            b.arg(&mut *dqkv)
                .arg(dout)
                .arg(qkv)
                .arg(lse)
                .arg(&delta)
                .arg(&t_i)
                .arg(&nh_i)
                .arg(&kv_i)
                .arg(&scale);
            // SAFETY: lengths checked above; dk/dv and dq write disjoint columns of dqkv.
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }
}
