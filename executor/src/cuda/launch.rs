//! Typed launches of the registered kernels. Each kernel shape is described once, as data, in
//! [`table`] (entry point, grid and block from the registry's rule, the argument list under
//! the `.cu` parameter names, the length each buffer must have and the operand it binds);
//! [`bind`] resolves those arguments against named operands and hands out views of the
//! memory they live in, and [`Launcher`]'s one launch path checks every view against the
//! description (element type and length: a kernel reading past a buffer is undefined
//! behaviour, so a wrong shape is an error before the launch) and launches on the given
//! stream. The semantics of each kernel are those of the CPU function the registry names.

use std::sync::Arc;

use cudarc::driver::{
    CudaStream, CudaView, CudaViewMut, DeviceRepr, LaunchArgs, LaunchConfig, PushKernelArg,
    ValidAsZeroBits,
};
use dsplan_kernels::{Dtype, KernelSpec, kernel};

use super::adamw::{AdamScalars, AdamSegment};
use super::error::CudaError;
use super::modules::KernelModules;
use crate::cuda::element::{Access, Element};

pub mod bind;
pub mod table;

use bind::{Allocation, Bound, RunValues};
use table::{Fit, RunValue, Value};
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

/// What an element type binds as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binds {
    /// A storage type: the model element when the model is stored in this dtype (f32 is also
    /// the f32 element).
    Stored(Dtype),
    /// This one element alone.
    Only(Element),
}

/// An element type a kernel argument can point to.
pub trait Bindable: DeviceRepr + 'static {
    /// What it binds as.
    const BINDS: Binds;

    /// Whether it is `element` when the model is stored in `model`.
    fn is(element: Element, model: Dtype) -> bool {
        match (Self::BINDS, element) {
            (Binds::Stored(dtype), Element::Model) => model == dtype,
            (Binds::Stored(dtype), Element::F32) => dtype == Dtype::F32,
            (Binds::Stored(_), _) => false,
            (Binds::Only(only), _) => element == only,
        }
    }
}

impl Bindable for f32 {
    const BINDS: Binds = Binds::Stored(Dtype::F32);
}

impl Bindable for half::bf16 {
    const BINDS: Binds = Binds::Stored(Dtype::Bf16);
}

impl Bindable for half::f16 {
    const BINDS: Binds = Binds::Stored(Dtype::F16);
}

impl Bindable for f64 {
    const BINDS: Binds = Binds::Only(Element::F64);
}

impl Bindable for u32 {
    const BINDS: Binds = Binds::Only(Element::U32);
}

impl Bindable for i32 {
    const BINDS: Binds = Binds::Only(Element::I32);
}

impl Bindable for AdamSegment {
    const BINDS: Binds = Binds::Only(Element::AdamSegment);
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

impl Operand<'_> {
    /// A buffer's access, its length, and whether its elements are `element` for a model
    /// stored in `model` (`None` for a null or a value).
    fn buffer(&self, element: Element, model: Dtype) -> Option<(Access, usize, bool)> {
        match self {
            Operand::In(view) => Some((Access::Read, view.elements(), view.is(element, model))),
            Operand::Out(view) => Some((Access::Write, view.elements(), view.is(element, model))),
            _ => None,
        }
    }
}

/// Checks `operands` against `call`'s slots for a model stored in `model`: one operand per
/// slot, each buffer of the slot's element type and length, read where the kernel reads it
/// and written where it writes it, a null only where the kernel skips the pointer, a run-time
/// value where one is due.
pub fn check_operands(
    call: &KernelCall,
    model: Dtype,
    operands: &[Operand<'_>],
) -> Result<(), CudaError> {
    let mut given = operands.iter();
    for param in &call.params {
        let operand = match param.value {
            Value::Int(_) | Value::Long(_) | Value::Float(_) => continue,
            Value::Buffer { .. } | Value::Run(_) => given.next(),
        };
        let bad = |what: String| {
            CudaError::Shape(format!("{}: `{}` {what}", call.entry_point, param.name))
        };
        if let (
            Value::Buffer {
                element,
                fit,
                access,
                ..
            },
            Some(operand),
        ) = (param.value, operand)
            && let Some((bound, len, typed)) = operand.buffer(element, model)
            && bound == access
        {
            check_buffer(len, typed, element, fit).map_err(bad)?;
            continue;
        }
        match (param.value, operand) {
            (_, None) => return Err(bad("is not bound".to_string())),
            (
                Value::Buffer {
                    fit: Fit::ExactOrNull(_),
                    ..
                },
                Some(Operand::Null),
            )
            | (Value::Run(RunValue::AdamScalars), Some(Operand::Scalars(_))) => {}
            (Value::Run(value), Some(Operand::Float(_))) if value != RunValue::AdamScalars => {}
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
    pub fn launch(
        &self,
        call: &KernelCall,
        model: Dtype,
        operands: &mut [Operand<'_>],
    ) -> Result<(), CudaError> {
        call.compiled()?;
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
                Value::Buffer { .. } | Value::Run(_) => match slots.next() {
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
        // (token ids, bucket rows, targets, Adam segments) are the binding caller's check,
        // noted there; the entry point takes exactly these arguments in this order (the
        // descriptions are held against the `.cu` signatures on the host).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Launches `call` with each buffer argument bound as `slots` says (one per buffer
    /// argument, in order: a span of `allocations[at]`, or a null pointer), its run-time
    /// values from `run` ([`bind::with_operands`]), checked and launched by [`Self::launch`].
    pub fn launch_bound(
        &self,
        call: &KernelCall,
        model: Dtype,
        slots: &[Option<Bound>],
        allocations: &mut [&mut dyn Allocation],
        run: &RunValues,
    ) -> Result<(), CudaError> {
        bind::with_operands(call, slots, allocations, run, &mut |operands| {
            self.launch(call, model, operands)
        })
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
