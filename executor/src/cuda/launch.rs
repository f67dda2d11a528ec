//! Typed launches of the registered kernels. Each kernel shape is described once, as data, in
//! [`table`] (entry point, grid and block from the registry's rule, the argument list under
//! the `.cu` parameter names, the length each buffer must have); a wrapper here binds device
//! views to that description and [`Launcher`]'s one launch path checks every view against it
//! (element type and length: a kernel reading past a buffer is undefined behaviour, so a
//! wrong shape is an error before the launch) and launches on the given stream. The
//! semantics of each are those of the CPU function the registry names. The Llama family's
//! launches (RMSNorm, RoPE, SwiGLU, grouped-query attention) are in [`llama`].

use std::sync::Arc;

use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use dsplan_kernels::{Dtype, KernelSpec, kernel};

use super::adamw::{AdamScalars, AdamSegment};
use super::error::CudaError;
use super::modules::KernelModules;
use crate::cuda::element::Element;
use crate::train::AttentionKernel;

pub mod llama;
pub mod table;

use table::{Fit, Value};
pub use table::{GroupedAttention, Heads, KernelCall, Rotation, attention_scale};

/// An element type tensors are stored in on the GPU.
pub trait Storage: Bindable + ValidAsZeroBits + Copy + Send + Sync + 'static {
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

/// An element type a kernel argument can point to.
pub trait Bindable: DeviceRepr + 'static {
    /// Whether it is `element` when the model is stored in `model`.
    fn is(element: Element, model: Dtype) -> bool;
}

/// A stored type `dtype` is the model element when the model is stored in it, and f32 is
/// also the f32 element.
fn stored_is(dtype: Dtype, element: Element, model: Dtype) -> bool {
    match element {
        Element::Model => model == dtype,
        Element::F32 => dtype == Dtype::F32,
        _ => false,
    }
}

impl Bindable for f32 {
    fn is(element: Element, model: Dtype) -> bool {
        stored_is(Dtype::F32, element, model)
    }
}

impl Bindable for half::bf16 {
    fn is(element: Element, model: Dtype) -> bool {
        stored_is(Dtype::Bf16, element, model)
    }
}

impl Bindable for half::f16 {
    fn is(element: Element, model: Dtype) -> bool {
        stored_is(Dtype::F16, element, model)
    }
}

impl Bindable for f64 {
    fn is(element: Element, _: Dtype) -> bool {
        element == Element::F64
    }
}

impl Bindable for u32 {
    fn is(element: Element, _: Dtype) -> bool {
        element == Element::U32
    }
}

impl Bindable for i32 {
    fn is(element: Element, _: Dtype) -> bool {
        element == Element::I32
    }
}

impl Bindable for AdamSegment {
    fn is(element: Element, _: Dtype) -> bool {
        element == Element::AdamSegment
    }
}

/// A device buffer bound to an argument the kernel reads.
pub trait DeviceIn {
    /// Its length in elements.
    fn elements(&self) -> usize;
    /// Whether its elements are `element` when the model is stored in `model`.
    fn is(&self, element: Element, model: Dtype) -> bool;
    /// Pushes it onto a launch.
    fn push<'a>(&'a self, args: &mut LaunchArgs<'a>);
}

/// A device buffer bound to an argument the kernel writes.
pub trait DeviceOut {
    /// Its length in elements.
    fn elements(&self) -> usize;
    /// Whether its elements are `element` when the model is stored in `model`.
    fn is(&self, element: Element, model: Dtype) -> bool;
    /// Pushes it onto a launch.
    fn push<'a>(&'a mut self, args: &mut LaunchArgs<'a>);
}

impl<E: Bindable> DeviceIn for CudaView<'_, E> {
    fn elements(&self) -> usize {
        self.len()
    }
    fn is(&self, element: Element, model: Dtype) -> bool {
        E::is(element, model)
    }
    fn push<'a>(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(self);
    }
}

impl<E: Bindable> DeviceOut for CudaViewMut<'_, E> {
    fn elements(&self) -> usize {
        self.len()
    }
    fn is(&self, element: Element, model: Dtype) -> bool {
        E::is(element, model)
    }
    fn push<'a>(&'a mut self, args: &mut LaunchArgs<'a>) {
        args.arg(self);
    }
}

/// What a wrapper binds to one of a [`KernelCall`]'s slots (its buffers and run-time values),
/// in the call's order.
pub enum Operand<'b> {
    /// A buffer read.
    In(&'b dyn DeviceIn),
    /// A buffer written.
    Out(&'b mut dyn DeviceOut),
    /// A null pointer (an argument the kernel skips).
    Null,
    /// A run-time `float`.
    Float(f32),
    /// Adam's scalars.
    Scalars(AdamScalars),
}

impl std::fmt::Debug for Operand<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operand::In(v) => write!(f, "In({} elements)", v.elements()),
            Operand::Out(v) => write!(f, "Out({} elements)", v.elements()),
            Operand::Null => f.write_str("Null"),
            Operand::Float(x) => write!(f, "Float({x})"),
            Operand::Scalars(s) => write!(f, "Scalars({s:?})"),
        }
    }
}

/// A view read.
pub fn read<'b, E: Bindable>(view: &'b CudaView<'_, E>) -> Operand<'b> {
    Operand::In(view)
}

/// A view written.
pub fn write<'b, E: Bindable>(view: &'b mut CudaViewMut<'_, E>) -> Operand<'b> {
    Operand::Out(view)
}

/// Checks `operands` against `call`'s slots for a model stored in `model`: one operand per
/// slot, each buffer of the slot's element type and length, a null only where the kernel
/// skips the pointer, a run-time value where one is due.
pub fn check_operands(
    call: &KernelCall,
    model: Dtype,
    operands: &[Operand<'_>],
) -> Result<(), CudaError> {
    let mut given = operands.iter();
    for param in &call.params {
        let operand = match param.value {
            Value::Int(_) | Value::Long(_) | Value::Float(_) => continue,
            Value::Buffer { .. } | Value::RunFloat | Value::RunScalars => given.next(),
        };
        let bad = |what: String| {
            CudaError::Shape(format!("{}: `{}` {what}", call.entry_point, param.name))
        };
        match (param.value, operand) {
            (_, None) => return Err(bad("is not bound".to_string())),
            (Value::Buffer { element, fit }, Some(Operand::In(view))) => {
                check_buffer(view.elements(), view.is(element, model), element, fit).map_err(bad)?
            }
            (Value::Buffer { element, fit }, Some(Operand::Out(view))) => {
                check_buffer(view.elements(), view.is(element, model), element, fit).map_err(bad)?
            }
            (
                Value::Buffer {
                    fit: Fit::ExactOrNull(_),
                    ..
                },
                Some(Operand::Null),
            )
            | (Value::RunFloat, Some(Operand::Float(_)))
            | (Value::RunScalars, Some(Operand::Scalars(_))) => {}
            (value, Some(other)) => {
                return Err(bad(format!("is {value:?}, bound to {other:?}")));
            }
        }
    }
    match given.count() {
        0 => Ok(()),
        extra => Err(CudaError::Shape(format!(
            "{}: {extra} operands more than its arguments",
            call.entry_point
        ))),
    }
}

fn check_buffer(len: usize, typed: bool, element: Element, fit: Fit) -> Result<(), String> {
    if !typed {
        return Err(format!("is bound to a buffer that is not {element:?}"));
    }
    if !fit.accepts(len) {
        return Err(format!("has {len} elements, the shape needs {fit:?}"));
    }
    Ok(())
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

impl<'m> Launcher<'m> {
    /// A launcher on `stream` (which must belong to the modules' context).
    pub fn new(modules: &'m KernelModules, stream: Arc<CudaStream>) -> Self {
        Self { modules, stream }
    }

    /// A launcher of the same kernels on `stream` (the communication stream's accumulations).
    pub fn on(&self, stream: Arc<CudaStream>) -> Self {
        Self {
            modules: self.modules,
            stream,
        }
    }

    /// The stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The one launch path: checks `operands` against `call` ([`check_operands`]), then
    /// launches `call`'s entry point with its grid, block and shared memory, pushing its
    /// arguments in order (shape values from the call, the rest from `operands`).
    fn run(
        &self,
        call: &KernelCall,
        model: Dtype,
        operands: &mut [Operand<'_>],
    ) -> Result<(), CudaError> {
        check_operands(call, model, operands)?;
        let f = self
            .modules
            .function(spec(call.kernel)?, &call.entry_point)?;
        let cfg = LaunchConfig {
            grid_dim: call.dims.grid,
            block_dim: call.dims.block,
            shared_mem_bytes: call.shared_mem_bytes,
        };
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(&f);
        let mut slots = operands.iter_mut();
        for param in &call.params {
            match &param.value {
                Value::Int(v) => {
                    b.arg(v);
                }
                Value::Long(v) => {
                    b.arg(v);
                }
                Value::Float(v) => {
                    b.arg(v);
                }
                Value::Buffer { .. } | Value::RunFloat | Value::RunScalars => match slots.next() {
                    Some(Operand::In(view)) => view.push(&mut b),
                    Some(Operand::Out(view)) => view.push(&mut b),
                    Some(Operand::Null) => {
                        b.arg(&null);
                    }
                    Some(Operand::Float(x)) => {
                        b.arg(&*x);
                    }
                    Some(Operand::Scalars(s)) => {
                        b.arg(&*s);
                    }
                    None => {
                        return Err(CudaError::Shape(format!(
                            "{}: `{}` is not bound",
                            call.entry_point, param.name
                        )));
                    }
                },
            }
        }
        // SAFETY: every buffer is of the element type and length the kernel's indexing needs
        // for this shape (checked against the description above); the data-dependent indices
        // (token ids, bucket rows, targets, Adam segments) are each wrapper's caller's check,
        // noted there; the entry point takes exactly these arguments in this order (the
        // descriptions are held against the `.cu` signatures on the host).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// `encoder_forward`: `out (N, C) = wte[tokens] + wpe[t]`. Token ids must be < V (the
    /// caller's check, as for the CPU encoder).
    pub fn encoder_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        tokens: &CudaView<'_, u32>,
        wte: &CudaView<'_, T>,
        wpe: &CudaView<'_, T>,
        seq_len: usize,
        channels: usize,
    ) -> Result<(), CudaError> {
        let call = table::encoder_forward(T::DTYPE, tokens.len(), seq_len, channels)?;
        self.run(
            &call,
            T::DTYPE,
            &mut [write(out), read(tokens), read(wte), read(wpe)],
        )
    }

    /// `encoder_backward_wpe` then `encoder_backward_wte` (with host-built token buckets already
    /// on the device): `dwpe[t] += ...`, `dwte[token] += ...`. The buckets come from
    /// `TokenBuckets::new` over tokens < V (the caller's check), so every row index is < N and
    /// every token row is inside dwte.
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
        let calls = table::encoder_backward(
            T::DTYPE,
            bucket_rows.len(),
            bucket_tokens.len(),
            seq_len,
            channels,
        )?;
        let mut calls = calls.iter();
        if let Some(wpe) = calls.next() {
            self.run(wpe, T::DTYPE, &mut [write(dwpe), read(dout)])?;
        }
        if let Some(wte) = calls.next() {
            self.run(
                wte,
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
        let call = table::layernorm_forward(T::DTYPE, mean.len(), weight.len())?;
        self.run(
            &call,
            T::DTYPE,
            &mut [
                write(out),
                write(mean),
                write(rstd),
                read(inp),
                read(weight),
                read(bias),
                Operand::Float(eps),
            ],
        )
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
        let call = table::residual_layernorm_forward(T::DTYPE, mean.len(), weight.len())?;
        self.run(
            &call,
            T::DTYPE,
            &mut [
                write(residual),
                write(out),
                write(mean),
                write(rstd),
                read(a),
                read(b_in),
                read(weight),
                read(bias),
                Operand::Float(eps),
            ],
        )
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
        let calls = table::layernorm_backward(T::DTYPE, mean.len(), channels)?;
        let [backward, sum_weight, sum_bias] = calls.as_slice() else {
            return Err(CudaError::Shape(
                "layernorm_backward is three launches".into(),
            ));
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
                read(mean),
                read(rstd),
            ],
        )?;
        let scratch = scratch.as_view();
        let (weight_sums, bias_sums) = (scratch.slice(..), scratch.slice(channels..));
        self.run(
            sum_weight,
            T::DTYPE,
            &mut [write(dweight), read(&weight_sums)],
        )?;
        self.run(sum_bias, T::DTYPE, &mut [write(dbias), read(&bias_sums)])
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
        let stride = usize::try_from(stride)
            .map_err(|_| CudaError::Shape(format!("a negative stride {stride}")))?;
        let call = table::add_partials(T::DTYPE, chunks, width, stride)?;
        self.run(&call, T::DTYPE, &mut [write(acc), read(partials)])
    }

    /// Bias gradients from one `(N, W)` output gradient: `column_partials` over all `W`
    /// columns, then each bias adds its columns (`dbiases[i]` the columns after
    /// `dbiases[..i]`'s). `scratch` holds `ceil(N / 64) * W` f32.
    pub fn split_bias_backward<T: Storage>(
        &self,
        dbiases: &mut [CudaViewMut<'_, T>],
        scratch: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let widths: Vec<usize> = dbiases.iter().map(|b| b.len()).collect();
        let width: usize = widths.iter().sum();
        let rows = table::rows_of("dout", dout.len(), width)?;
        let calls = table::bias_backward(T::DTYPE, rows, &widths)?;
        let Some((partials, sums)) = calls.split_first() else {
            return Err(CudaError::Shape("no column_partials launch".into()));
        };
        self.run(partials, T::DTYPE, &mut [write(scratch), read(dout)])?;
        let mut column = 0;
        for (dbias, sum) in dbiases.iter_mut().zip(sums) {
            let cols = dbias.len();
            let partials = scratch.slice(column..);
            self.run(sum, T::DTYPE, &mut [write(dbias), read(&partials)])?;
            column += cols;
        }
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
        self.split_bias_backward(std::slice::from_mut(dbias), scratch, dout)
    }

    /// `bias_gelu_forward`: `pre += bias` (per column), `out = gelu(pre)`.
    pub fn bias_gelu_forward<T: Storage>(
        &self,
        pre: &mut CudaViewMut<'_, T>,
        out: &mut CudaViewMut<'_, T>,
        bias: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let rows = table::rows_of("pre", pre.len(), bias.len())?;
        let call = table::bias_gelu_forward(T::DTYPE, rows, bias.len())?;
        self.run(&call, T::DTYPE, &mut [write(pre), write(out), read(bias)])
    }

    /// `accumulate`: `dst += src` (equal lengths).
    pub fn accumulate<T: Storage>(
        &self,
        dst: &mut CudaViewMut<'_, T>,
        src: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        if dst.len() != src.len() {
            return Err(CudaError::Shape(format!(
                "accumulate: {} elements into {}",
                src.len(),
                dst.len()
            )));
        }
        let call = table::accumulate(T::DTYPE, src.len())?;
        self.run(&call, T::DTYPE, &mut [write(dst), read(src)])
    }

    /// `gelu_forward`: `out = gelu(inp)`.
    pub fn gelu_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let call = table::gelu_forward(T::DTYPE, inp.len())?;
        self.run(&call, T::DTYPE, &mut [write(out), read(inp)])
    }

    /// `gelu_backward_inplace`: `d *= gelu'(inp)`.
    pub fn gelu_backward_inplace<T: Storage>(
        &self,
        d: &mut CudaViewMut<'_, T>,
        inp: &CudaView<'_, T>,
    ) -> Result<(), CudaError> {
        let call = table::gelu_backward(T::DTYPE, inp.len())?;
        self.run(&call, T::DTYPE, &mut [write(d), read(inp)])
    }

    /// `attention_forward` (or `attention_forward_gqa`; the `attention_tc_*` kernels for
    /// [`AttentionKernel::TensorCore`], bf16/f16 only): `out (B, T, NH hs)` and
    /// `lse (B, NH, T)` from `qkv (B, T, (NH + 2 KV) hs)`.
    pub fn attention_forward<T: Storage>(
        &self,
        out: &mut CudaViewMut<'_, T>,
        lse: &mut CudaViewMut<'_, f32>,
        qkv: &CudaView<'_, T>,
        dims: GroupedAttention,
        (heads, kernel): (Heads, AttentionKernel),
    ) -> Result<(), CudaError> {
        let call = table::attention_forward(T::DTYPE, dims, heads, kernel)?;
        self.run(&call, T::DTYPE, &mut [write(out), write(lse), read(qkv)])
    }

    /// Attention backward: `delta (B, NH, T)` scratch, then dk/dv (one block per key/value
    /// head, a group's query heads summed in order) and dq into `dqkv (B, T, (NH + 2 KV) hs)`
    /// (written, not accumulated; dk/dv and dq write disjoint columns), by `kernel`'s kernels.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_backward<T: Storage>(
        &self,
        dqkv: &mut CudaViewMut<'_, T>,
        delta: &mut CudaViewMut<'_, f32>,
        dout: &CudaView<'_, T>,
        out: &CudaView<'_, T>,
        qkv: &CudaView<'_, T>,
        lse: &CudaView<'_, f32>,
        dims: GroupedAttention,
        (heads, kernel): (Heads, AttentionKernel),
    ) -> Result<(), CudaError> {
        let calls = table::attention_backward(T::DTYPE, dims, heads, kernel)?;
        let [preprocess, dkdv, dq] = calls.as_slice() else {
            return Err(CudaError::Shape(
                "attention backward is three launches".into(),
            ));
        };
        self.run(
            preprocess,
            T::DTYPE,
            &mut [write(delta), read(dout), read(out)],
        )?;
        let delta = delta.as_view();
        for call in [dkdv, dq] {
            self.run(
                call,
                T::DTYPE,
                &mut [write(dqkv), read(dout), read(qkv), read(lse), read(&delta)],
            )?;
        }
        Ok(())
    }

    /// `fused_classifier`: logits `(N, vocab)` with rows `stride` elements apart (the
    /// device's padded rows, [`dsplan_planner::memory::cuda_layout::padded_vocab`]) ->
    /// `dloss * (softmax - onehot)` in place, losses (N); `targets` holds -1 for rows without
    /// a target, and the others must be < V (the caller's check). The padding is not touched.
    pub fn fused_classifier<T: Storage>(
        &self,
        logits: &mut CudaViewMut<'_, T>,
        losses: &mut CudaViewMut<'_, f32>,
        targets: &CudaView<'_, i32>,
        dloss: f32,
        (vocab, stride): (usize, usize),
    ) -> Result<(), CudaError> {
        let rows = targets.len();
        let call = table::fused_classifier(T::DTYPE, rows, vocab, stride)?;
        self.run(
            &call,
            T::DTYPE,
            &mut [
                write(logits),
                write(losses),
                read(targets),
                Operand::Float(dloss),
            ],
        )
    }

    /// `cast`: `out = inp` converted (f32 to and from bf16/f16).
    pub fn cast<From: Storage, To: Storage>(
        &self,
        out: &mut CudaViewMut<'_, To>,
        inp: &CudaView<'_, From>,
    ) -> Result<(), CudaError> {
        let call = table::cast(From::DTYPE, To::DTYPE, inp.len())?;
        let model = if From::DTYPE == Dtype::F32 {
            To::DTYPE
        } else {
            From::DTYPE
        };
        self.run(&call, model, &mut [write(out), read(inp)])
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
        let calls = table::unscale_and_norm(T::DTYPE, grads.len())?;
        let [unscale, sum] = calls.as_slice() else {
            return Err(CudaError::Shape("the norm is two launches".into()));
        };
        self.run(
            unscale,
            T::DTYPE,
            &mut [
                write(grads),
                Operand::Float(inv_scale),
                write(partials),
                write(found_inf),
            ],
        )?;
        let partials = partials.as_view();
        self.run(sum, T::DTYPE, &mut [write(total), read(&partials)])
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
        if segments.len() != host_segments.len() {
            return Err(CudaError::Shape(format!(
                "{} segments on the device, {} on the host",
                segments.len(),
                host_segments.len()
            )));
        }
        // The kernel indexes by the segments: each must lie inside the buffers.
        for segment in host_segments {
            if segment.offset < 0 || segment.len < 0 || (segment.offset + segment.len) as usize > n
            {
                return Err(CudaError::Shape(format!(
                    "segment {segment:?} outside {n} parameters"
                )));
            }
        }
        let call = table::adamw(G::DTYPE, n, host_segments.len())?;
        let params_out = match params_out {
            Some(view) => write(view),
            None => Operand::Null,
        };
        self.run(
            &call,
            G::DTYPE,
            &mut [
                write(master),
                params_out,
                read(grads),
                write(exp_avg),
                write(exp_avg_sq),
                read(segments),
                Operand::Scalars(scalars),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for a device view: a length and the element it holds.
    struct Fake(usize, Element);

    impl DeviceIn for Fake {
        fn elements(&self) -> usize {
            self.0
        }
        fn is(&self, element: Element, _: Dtype) -> bool {
            element == self.1
        }
        fn push<'a>(&'a self, _: &mut LaunchArgs<'a>) {}
    }

    impl DeviceOut for Fake {
        fn elements(&self) -> usize {
            self.0
        }
        fn is(&self, element: Element, _: Dtype) -> bool {
            element == self.1
        }
        fn push<'a>(&'a mut self, _: &mut LaunchArgs<'a>) {}
    }

    fn layernorm(rows: usize, c: usize) -> (KernelCall, [Fake; 3], [Fake; 3]) {
        let call = table::layernorm_forward(Dtype::Bf16, rows, c).expect("described");
        let model = Element::Model;
        (
            call,
            [
                Fake(rows * c, model),
                Fake(rows, Element::F32),
                Fake(rows, Element::F32),
            ],
            [Fake(rows * c, model), Fake(c, model), Fake(c, model)],
        )
    }

    fn check<'a>(
        call: &KernelCall,
        outs: &'a mut [Fake; 3],
        ins: &'a [Fake; 3],
        eps: Operand<'a>,
    ) -> Result<(), CudaError> {
        let [o, m, r] = outs;
        let [i, w, b] = ins;
        check_operands(
            call,
            Dtype::Bf16,
            &[
                Operand::Out(o),
                Operand::Out(m),
                Operand::Out(r),
                Operand::In(i),
                Operand::In(w),
                Operand::In(b),
                eps,
            ],
        )
    }

    /// Views of the described element types and lengths bind; a view one element short, of
    /// another element type, a missing run-time value or a null where the kernel needs the
    /// pointer is refused before any launch, naming the `.cu` parameter.
    #[test]
    fn operands_are_checked_against_the_description() {
        let (call, mut outs, ins) = layernorm(6, 8);
        check(&call, &mut outs, &ins, Operand::Float(1e-5)).expect("binds");

        let (call, mut outs, _) = layernorm(6, 8);
        let short = [
            Fake(48, Element::Model),
            Fake(8, Element::Model),
            Fake(7, Element::Model),
        ];
        let message = check(&call, &mut outs, &short, Operand::Float(1e-5))
            .expect_err("short bias")
            .to_string();
        assert!(message.contains("`bias` has 7 elements"), "{message}");

        let (call, mut outs, _) = layernorm(6, 8);
        let wrong = [
            Fake(48, Element::F32),
            Fake(8, Element::Model),
            Fake(8, Element::Model),
        ];
        let message = check(&call, &mut outs, &wrong, Operand::Float(1e-5))
            .expect_err("f32 input")
            .to_string();
        assert!(
            message.contains("`inp`") && message.contains("not Model"),
            "{message}"
        );

        let (call, mut outs, ins) = layernorm(6, 8);
        let message = check(&call, &mut outs, &ins, Operand::Null)
            .expect_err("no eps")
            .to_string();
        assert!(message.contains("`eps`"), "{message}");

        // adamw's params_out may be null (f32 training); its grads may not.
        let adam = table::adamw(Dtype::F32, 10, 1).expect("described");
        let (g, seg) = (Fake(10, Element::Model), Fake(1, Element::AdamSegment));
        let scalars = AdamScalars::new(&crate::optim::AdamConfig::default(), 1, 1e-3, 1.0);
        let adam_with = |grads: Option<&Fake>| {
            let mut outs = [
                Fake(10, Element::F32),
                Fake(10, Element::F32),
                Fake(10, Element::F32),
            ];
            let [m, ea, eas] = &mut outs;
            check_operands(
                &adam,
                Dtype::F32,
                &[
                    Operand::Out(m),
                    Operand::Null,
                    grads.map_or(Operand::Null, |g| Operand::In(g)),
                    Operand::Out(ea),
                    Operand::Out(eas),
                    Operand::In(&seg),
                    Operand::Scalars(scalars),
                ],
            )
        };
        adam_with(Some(&g)).expect("null params_out");
        assert!(adam_with(None).is_err(), "null grads");

        // One operand too many.
        let gelu = table::gelu_forward(Dtype::F16, 4).expect("described");
        let (mut out, inp, extra) = (
            Fake(4, Element::Model),
            Fake(4, Element::Model),
            Fake(4, Element::Model),
        );
        let result = check_operands(
            &gelu,
            Dtype::F16,
            &[
                Operand::Out(&mut out),
                Operand::In(&inp),
                Operand::In(&extra),
            ],
        );
        assert!(result.is_err());
    }

    /// The real element types: a bf16 view is the model element only in bf16 training, an
    /// f32 view is f32 always and the model element in f32 training.
    #[test]
    fn element_types_resolve_against_the_model_dtype() {
        assert!(half::bf16::is(Element::Model, Dtype::Bf16));
        assert!(!half::bf16::is(Element::Model, Dtype::F16));
        assert!(!half::bf16::is(Element::F32, Dtype::Bf16));
        assert!(f32::is(Element::F32, Dtype::Bf16));
        assert!(f32::is(Element::Model, Dtype::F32));
        assert!(!f32::is(Element::Model, Dtype::F16));
        assert!(f64::is(Element::F64, Dtype::F32) && !f64::is(Element::F32, Dtype::F32));
        assert!(u32::is(Element::U32, Dtype::Bf16) && !i32::is(Element::U32, Dtype::Bf16));
        assert!(AdamSegment::is(Element::AdamSegment, Dtype::F16));
    }
}
