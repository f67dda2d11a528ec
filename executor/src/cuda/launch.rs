//! Typed launches of the registered kernels: each wrapper checks its buffers' lengths against
//! the problem's shape (a kernel reading past a buffer is undefined behaviour, so a wrong shape
//! must be an error before the launch), sizes the grid with the registry's rule, and launches
//! on the given stream. The semantics of each are those of the CPU function the registry names.
//! The Llama family's launches (RMSNorm, RoPE, SwiGLU, grouped-query attention) are in
//! [`llama`].

use std::sync::Arc;

use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use dsplan_kernels::{Dtype, KernelSpec, Work, kernel};

use super::adamw::{AdamScalars, AdamSegment};
use super::error::CudaError;
use super::modules::KernelModules;

pub mod llama;

pub use llama::{GroupedAttention, Rotation};

/// An element type tensors are stored in on the GPU.
pub trait Storage: DeviceRepr + ValidAsZeroBits + Copy + Send + Sync + 'static {
    /// Its registry dtype.
    const DTYPE: Dtype;
    /// From f32, rounding to nearest even.
    fn from_f32(x: f32) -> Self;
    /// To f32 (exact).
    fn to_f32(self) -> f32;
}

impl Storage for f32 {
    const DTYPE: Dtype = Dtype::F32;
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Storage for half::bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

impl Storage for half::f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

/// Launches kernels from `modules` on `stream`.
#[derive(Debug)]
pub struct Launcher<'m> {
    modules: &'m KernelModules,
    stream: Arc<CudaStream>,
}

fn spec(name: &str) -> Result<&'static KernelSpec, CudaError> {
    kernel(name).ok_or_else(|| CudaError::Shape(format!("no kernel `{name}` is registered")))
}

fn expect_len(what: &str, len: usize, expected: usize) -> Result<(), CudaError> {
    if len == expected {
        Ok(())
    } else {
        Err(CudaError::Shape(format!(
            "{what} has {len} elements, the shape needs {expected}"
        )))
    }
}

fn int(what: &str, value: usize) -> Result<i32, CudaError> {
    i32::try_from(value).map_err(|_| CudaError::Shape(format!("{what} = {value} exceeds i32")))
}

fn long(value: usize) -> i64 {
    value as i64
}

impl<'m> Launcher<'m> {
    /// A launcher on `stream` (which must belong to the modules' context).
    pub fn new(modules: &'m KernelModules, stream: Arc<CudaStream>) -> Self {
        Self { modules, stream }
    }

    /// The stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn config(spec: &KernelSpec, work: Work) -> Result<LaunchConfig, CudaError> {
        let dims = spec.launch.dims(work)?;
        Ok(LaunchConfig {
            grid_dim: dims.grid,
            block_dim: dims.block,
            shared_mem_bytes: 0,
        })
    }

    /// `encoder_forward`: `out (N, C) = wte[tokens] + wpe[t]`.
    pub fn encoder_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        tokens: &CudaView<'_, u32>,
        wte: &CudaView<'_, T>,
        wpe: &CudaView<'_, T>,
        seq_len: usize,
        channels: usize,
    ) -> Result<(), CudaError> {
        let rows = tokens.len();
        expect_len("out", out.len(), rows * channels)?;
        if seq_len == 0 || rows % seq_len != 0 || wpe.len() < seq_len * channels {
            return Err(CudaError::Shape(format!(
                "{rows} tokens do not form rows of T = {seq_len} within wpe"
            )));
        }
        let spec = spec("encoder_forward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements((rows * channels) as u64))?;
        let (rows, seq_len, channels) =
            (int("rows", rows)?, int("T", seq_len)?, int("C", channels)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(tokens)
            .arg(wte)
            .arg(wpe)
            .arg(&rows)
            .arg(&seq_len)
            .arg(&channels);
        // SAFETY: lengths checked above against the kernel's indexing; tokens must be < V
        // (checked by the caller, as for the CPU encoder).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `encoder_backward_wpe` then `encoder_backward_wte` (with host-built token buckets already
    /// on the device): `dwpe[t] += ...`, `dwte[token] += ...`.
    #[allow(clippy::too_many_arguments)]
    pub fn encoder_backward<T: Storage>(
        &self,
        dwte: &mut CudaViewMut<'_, T>,
        dwpe: &mut CudaViewMut<'_, T>,
        dout: &CudaView<'_, T>,
        bucket_tokens: &CudaView<'_, u32>,
        bucket_starts: &CudaView<'_, i32>,
        bucket_rows: &CudaView<'_, i32>,
        seq_len: usize,
        channels: usize,
    ) -> Result<(), CudaError> {
        let rows = bucket_rows.len();
        expect_len("dout", dout.len(), rows * channels)?;
        expect_len(
            "bucket starts",
            bucket_starts.len(),
            bucket_tokens.len() + 1,
        )?;
        if seq_len == 0 || rows % seq_len != 0 || dwpe.len() < seq_len * channels {
            return Err(CudaError::Shape(format!(
                "{rows} rows do not form a batch of T = {seq_len} within dwpe"
            )));
        }
        let batch = int("B", rows / seq_len)?;
        let (seq_len_i, channels_i) = (int("T", seq_len)?, int("C", channels)?);

        let wpe_spec = spec("encoder_backward_wpe")?;
        let f = self
            .modules
            .function(wpe_spec, wpe_spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(wpe_spec, Work::Elements((seq_len * channels) as u64))?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut *dwpe)
            .arg(dout)
            .arg(&batch)
            .arg(&seq_len_i)
            .arg(&channels_i);
        // SAFETY: dwpe holds T*C, dout B*T*C elements (checked).
        unsafe { b.launch(cfg) }?;

        if bucket_tokens.is_empty() {
            return Ok(());
        }
        let wte_spec = spec("encoder_backward_wte")?;
        let f = self
            .modules
            .function(wte_spec, wte_spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            wte_spec,
            Work::Groups {
                groups: bucket_tokens.len() as u64,
                cols: channels as u64,
            },
        )?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(dwte)
            .arg(dout)
            .arg(bucket_tokens)
            .arg(bucket_starts)
            .arg(bucket_rows)
            .arg(&channels_i);
        // SAFETY: the buckets come from `TokenBuckets::new` over tokens < V (caller's check),
        // so every row index is < N and every token row is inside dwte.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `layernorm_forward`: `out = LN(inp)`, saving mean and rstd (N).
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        mean: &mut CudaViewMut<'_, f32>,
        rstd: &mut CudaViewMut<'_, f32>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        bias: &CudaView<'_, T>,
        eps: f32,
    ) -> Result<(), CudaError> {
        let channels = weight.len();
        let rows = mean.len();
        expect_len("inp", inp.len(), rows * channels)?;
        expect_len("out", out.len(), rows * channels)?;
        expect_len("rstd", rstd.len(), rows)?;
        expect_len("bias", bias.len(), channels)?;
        let spec = spec("layernorm_forward")?;
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
            .arg(mean)
            .arg(rstd)
            .arg(inp)
            .arg(weight)
            .arg(bias)
            .arg(&rows)
            .arg(&channels)
            .arg(&eps);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `residual_layernorm_forward`: `residual = a + b`, `out = LN(residual)`.
    #[allow(clippy::too_many_arguments)]
    pub fn residual_layernorm_forward<T: Storage>(
        &self,
        residual: &mut CudaViewMut<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        mean: &mut CudaViewMut<'_, f32>,
        rstd: &mut CudaViewMut<'_, f32>,
        a: &CudaView<'_, T>,
        b_in: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        bias: &CudaView<'_, T>,
        eps: f32,
    ) -> Result<(), CudaError> {
        let channels = weight.len();
        let rows = mean.len();
        for (what, len) in [
            ("residual", residual.len()),
            ("out", out.len()),
            ("a", a.len()),
            ("b", b_in.len()),
        ] {
            expect_len(what, len, rows * channels)?;
        }
        expect_len("rstd", rstd.len(), rows)?;
        expect_len("bias", bias.len(), channels)?;
        let spec = spec("residual_layernorm_forward")?;
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
        b.arg(residual)
            .arg(out)
            .arg(mean)
            .arg(rstd)
            .arg(a)
            .arg(b_in)
            .arg(weight)
            .arg(bias);
        b.arg(&rows).arg(&channels).arg(&eps);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `layernorm_backward` then `add_partials` twice: `dinp +=`, `dweight +=`, `dbias +=`.
    /// `scratch` holds `ceil(N / 32) * 2 * C` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_backward<T: Storage>(
        &self,
        dinp: &mut CudaViewMut<'_, T>,
        dweight: &mut CudaViewMut<'_, T>,
        dbias: &mut CudaViewMut<'_, T>,
        scratch: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
        inp: &CudaView<'_, T>,
        weight: &CudaView<'_, T>,
        mean: &CudaView<'_, f32>,
        rstd: &CudaView<'_, f32>,
    ) -> Result<(), CudaError> {
        let channels = weight.len();
        let rows = mean.len();
        for (what, len) in [
            ("dinp", dinp.len()),
            ("dout", dout.len()),
            ("inp", inp.len()),
        ] {
            expect_len(what, len, rows * channels)?;
        }
        expect_len("rstd", rstd.len(), rows)?;
        expect_len("dweight", dweight.len(), channels)?;
        expect_len("dbias", dbias.len(), channels)?;
        let spec_bwd = spec("layernorm_backward")?;
        let work = Work::Rows {
            rows: rows as u64,
            cols: channels as u64,
        };
        let cfg = Self::config(spec_bwd, work)?;
        let chunks = cfg.grid_dim.0 as usize;
        expect_len("scratch", scratch.len(), chunks * 2 * channels)?;
        let f = self
            .modules
            .function(spec_bwd, spec_bwd.entry_point(T::DTYPE)?)?;
        let (rows_i, channels_i) = (int("N", rows)?, int("C", channels)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(dinp)
            .arg(&mut *scratch)
            .arg(dout)
            .arg(inp)
            .arg(weight)
            .arg(mean)
            .arg(rstd);
        b.arg(&rows_i).arg(&channels_i);
        // SAFETY: lengths checked above, scratch sized for the grid.
        unsafe { b.launch(cfg) }?;
        let scratch = scratch.as_view();
        let stride = long(2 * channels);
        self.add_partials(dweight, &scratch.slice(..), chunks, channels, stride)?;
        self.add_partials(dbias, &scratch.slice(channels..), chunks, channels, stride)
    }

    /// `add_partials`: `acc[c] += partials[k * stride + c]` for `k < chunks`.
    pub fn add_partials<T: Storage>(
        &self,
        acc: &mut CudaViewMut<'_, T>,
        partials: &CudaView<'_, f32>,
        chunks: usize,
        width: usize,
        stride: i64,
    ) -> Result<(), CudaError> {
        expect_len("acc", acc.len(), width)?;
        if chunks > 0 && partials.len() < (chunks - 1) * stride as usize + width {
            return Err(CudaError::Shape(
                "partials shorter than chunks x stride".to_string(),
            ));
        }
        let spec = spec("add_partials")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            spec,
            Work::Rows {
                rows: chunks as u64,
                cols: width as u64,
            },
        )?;
        let (chunks, width) = (int("chunks", chunks)?, int("width", width)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(acc)
            .arg(partials)
            .arg(&chunks)
            .arg(&width)
            .arg(&stride);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The bias gradient: `dbias += column sums of dout (N, OC)`; `scratch` holds
    /// `ceil(N / 64) * OC` f32.
    pub fn bias_backward<T: Storage>(
        &self,
        dbias: &mut CudaViewMut<'_, T>,
        scratch: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let width = dbias.len();
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
        let (rows_i, width_i) = (int("N", rows)?, int("OC", width)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(&mut *scratch).arg(dout).arg(&rows_i).arg(&width_i);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        self.add_partials(dbias, &scratch.as_view(), chunks, width, long(width))
    }

    /// `bias_gelu_forward`: `pre += bias` (per column), `out = gelu(pre)`.
    pub fn bias_gelu_forward<T: Storage>(
        &self,
        pre: &mut CudaViewMut<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        bias: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let width = bias.len();
        if width == 0 || pre.len() % width != 0 {
            return Err(CudaError::Shape(format!("pre is not (N, {width})")));
        }
        expect_len("out", out.len(), pre.len())?;
        let spec = spec("bias_gelu_forward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements(pre.len() as u64))?;
        let (rows, width) = (int("N", pre.len() / width)?, int("OC", width)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(pre).arg(out).arg(bias).arg(&rows).arg(&width);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `gelu_forward`: `out = gelu(inp)`.
    pub fn gelu_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        expect_len("out", out.len(), inp.len())?;
        let spec = spec("gelu_forward")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements(inp.len() as u64))?;
        let n = long(inp.len());
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(inp).arg(&n);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `gelu_backward_inplace`: `d *= gelu'(inp)`.
    pub fn gelu_backward_inplace<T: Storage>(
        &self,
        d: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        expect_len("d", d.len(), inp.len())?;
        let spec = spec("gelu_backward_inplace")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Elements(inp.len() as u64))?;
        let n = long(inp.len());
        let mut b = self.stream.launch_builder(&f);
        b.arg(d).arg(inp).arg(&n);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    fn attention_work(
        qkv_len: usize,
        batch: usize,
        seq_len: usize,
        n_head: usize,
        head_dim: usize,
    ) -> Result<Work, CudaError> {
        expect_len("qkv", qkv_len, batch * seq_len * 3 * n_head * head_dim)?;
        Ok(Work::Attention {
            batch: batch as u64,
            seq_len: seq_len as u64,
            heads: n_head as u64,
            head_dim: head_dim as u64,
        })
    }

    /// `attention_forward`: `out (B, T, C)` and `lse (B, NH, T)` from `qkv (B, T, 3C)`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        lse: &mut CudaViewMut<'_, f32>,
        qkv: &CudaView<'_, T>,
        batch: usize,
        seq_len: usize,
        n_head: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        let work = Self::attention_work(qkv.len(), batch, seq_len, n_head, head_dim)?;
        expect_len("out", out.len(), batch * seq_len * n_head * head_dim)?;
        expect_len("lse", lse.len(), batch * n_head * seq_len)?;
        let spec = spec("attention_forward")?;
        let f = self
            .modules
            .function(spec, spec.entry_point_for_head_dim(T::DTYPE, head_dim)?)?;
        let cfg = Self::config(spec, work)?;
        let scale = attention_scale(head_dim);
        let (seq_len, n_head) = (int("T", seq_len)?, int("NH", n_head)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(out)
            .arg(lse)
            .arg(qkv)
            .arg(&seq_len)
            .arg(&n_head)
            .arg(&scale);
        // SAFETY: lengths checked above; the entry point exists for this head size.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Attention backward: `delta` (B, NH, T) scratch, then dk/dv and dq into `dqkv (B, T, 3C)`
    /// (written, not accumulated).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward<T: Storage>(
        &self,
        dqkv: &mut CudaViewMut<'_, T>,
        delta: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
        out: &CudaView<'_, T>,
        qkv: &CudaView<'_, T>,
        lse: &CudaView<'_, f32>,
        dims: (usize, usize, usize, usize),
    ) -> Result<(), CudaError> {
        let (batch, seq_len, n_head, head_dim) = dims;
        let work = Self::attention_work(qkv.len(), batch, seq_len, n_head, head_dim)?;
        let c = n_head * head_dim;
        expect_len("dqkv", dqkv.len(), qkv.len())?;
        expect_len("dout", dout.len(), batch * seq_len * c)?;
        expect_len("out", out.len(), batch * seq_len * c)?;
        expect_len("lse", lse.len(), batch * n_head * seq_len)?;
        expect_len("delta", delta.len(), batch * n_head * seq_len)?;
        let scale = attention_scale(head_dim);
        let (b_i, t_i, nh_i, hs_i) = (
            int("B", batch)?,
            int("T", seq_len)?,
            int("NH", n_head)?,
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

        for name in ["attention_backward_dkdv", "attention_backward_dq"] {
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
                .arg(&scale);
            // SAFETY: lengths checked above; dk/dv and dq write disjoint columns of dqkv.
            unsafe { b.launch(cfg) }?;
        }
        Ok(())
    }

    /// `fused_classifier`: logits -> `dloss * (softmax - onehot)` in place, losses (N);
    /// `targets` holds -1 for rows without a target.
    pub fn fused_classifier<T: Storage>(
        &self,
        logits: &mut CudaViewMut<'_, T>,
        losses: &mut CudaViewMut<'_, f32>,
        targets: &CudaView<'_, i32>,
        dloss: f32,
    ) -> Result<(), CudaError> {
        let rows = targets.len();
        expect_len("losses", losses.len(), rows)?;
        if rows == 0 || logits.len() % rows != 0 {
            return Err(CudaError::Shape(format!("logits are not ({rows}, V)")));
        }
        let vocab = logits.len() / rows;
        let spec = spec("fused_classifier")?;
        let f = self.modules.function(spec, spec.entry_point(T::DTYPE)?)?;
        let cfg = Self::config(
            spec,
            Work::Rows {
                rows: rows as u64,
                cols: vocab as u64,
            },
        )?;
        let (rows, vocab) = (int("N", rows)?, int("V", vocab)?);
        let mut b = self.stream.launch_builder(&f);
        b.arg(logits)
            .arg(losses)
            .arg(targets)
            .arg(&dloss)
            .arg(&rows)
            .arg(&vocab);
        // SAFETY: lengths checked above; targets must be -1 or < V (caller's check).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `cast`: `out = inp` converted (f32 to and from bf16/f16).
    pub fn cast<From: Storage, To: Storage>(
        &self,
        out: &mut CudaViewMut<'_, To>,
        inp: &CudaView<'_, From>,
    ) -> Result<(), CudaError> {
        expect_len("out", out.len(), inp.len())?;
        let spec = spec("cast")?;
        let entry = format!("cast_{}_to_{}", From::DTYPE.suffix(), To::DTYPE.suffix());
        let f = self.modules.function(spec, &entry)?;
        let cfg = Self::config(spec, Work::Elements(inp.len() as u64))?;
        let n = long(inp.len());
        let mut b = self.stream.launch_builder(&f);
        b.arg(out).arg(inp).arg(&n);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `unscale_norm_partials` then `sum_partials`: `grads *= inv_scale`, `total[0]` = sum of
    /// squares (f64), `found_inf[0]` set to 1 on inf/NaN (the caller zeroes it first).
    /// `partials` holds 1024 f64.
    pub fn unscale_and_norm<T: Storage>(
        &self,
        grads: &mut CudaViewMut<'_, T>,
        inv_scale: f32,
        partials: &mut CudaViewMut<'_, f64>,
        total: &mut CudaViewMut<'_, f64>,
        found_inf: &mut CudaViewMut<'_, i32>,
    ) -> Result<(), CudaError> {
        let spec_partials = spec("unscale_norm_partials")?;
        let cfg = Self::config(spec_partials, Work::Elements(grads.len() as u64))?;
        let blocks = cfg.grid_dim.0 as usize;
        expect_len("partials", partials.len(), blocks)?;
        expect_len("total", total.len(), 1)?;
        expect_len("found_inf", found_inf.len(), 1)?;
        let f = self
            .modules
            .function(spec_partials, spec_partials.entry_point(T::DTYPE)?)?;
        let n = long(grads.len());
        let mut b = self.stream.launch_builder(&f);
        b.arg(grads)
            .arg(&n)
            .arg(&inv_scale)
            .arg(&mut *partials)
            .arg(found_inf);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        let spec_sum = spec("sum_partials")?;
        let f = self.modules.function(spec_sum, "sum_partials_f64")?;
        let cfg = Self::config(spec_sum, Work::Elements(blocks as u64))?;
        let count = int("blocks", blocks)?;
        let partials = partials.as_view();
        let mut b = self.stream.launch_builder(&f);
        b.arg(total).arg(&partials).arg(&count);
        // SAFETY: lengths checked above.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `adamw`: one step over `segments` (already on the device, `segment_count` of them);
    /// `params_out` receives the 16-bit copy (`None` for f32 training).
    #[allow(clippy::too_many_arguments)]
    pub fn adamw<G: Storage>(
        &self,
        master: &mut CudaViewMut<'_, f32>,
        params_out: Option<&mut CudaViewMut<'_, G>>,
        grads: &CudaView<'_, G>,
        exp_avg: &mut CudaViewMut<'_, f32>,
        exp_avg_sq: &mut CudaViewMut<'_, f32>,
        segments: &CudaView<'_, AdamSegment>,
        host_segments: &[AdamSegment],
        scalars: AdamScalars,
    ) -> Result<(), CudaError> {
        let n = master.len();
        for (what, len) in [
            ("grads", grads.len()),
            ("exp_avg", exp_avg.len()),
            ("exp_avg_sq", exp_avg_sq.len()),
        ] {
            expect_len(what, len, n)?;
        }
        expect_len("segments", segments.len(), host_segments.len())?;
        for segment in host_segments {
            if segment.offset < 0 || segment.len < 0 || (segment.offset + segment.len) as usize > n
            {
                return Err(CudaError::Shape(format!(
                    "segment {segment:?} outside {n} parameters"
                )));
            }
        }
        let spec = spec("adamw")?;
        let f = self.modules.function(spec, spec.entry_point(G::DTYPE)?)?;
        let cfg = Self::config(spec, Work::Segments(host_segments.len() as u64))?;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&f);
        b.arg(master);
        match params_out {
            Some(out) => {
                expect_len("params_out", out.len(), n)?;
                b.arg(out);
            }
            None => {
                b.arg(&null);
            }
        }
        b.arg(grads)
            .arg(exp_avg)
            .arg(exp_avg_sq)
            .arg(segments)
            .arg(&scalars);
        // SAFETY: lengths and segment bounds checked above (`host_segments` is the caller's
        // copy of `segments`); a null params_out is skipped by the kernel.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

/// `head_dim^-0.5`, rounded as the CPU attention rounds it.
pub fn attention_scale(head_dim: usize) -> f32 {
    (head_dim as f64).powf(-0.5) as f32
}
