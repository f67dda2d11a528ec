//! Binding a [`KernelCall`]'s buffer arguments to memory: [`resolve`] finds each argument's
//! operand by the name its [`super::table::Source`] gives (among an op's operands, or a kernel
//! check's buffers) and checks the elements it binds against the shape; an [`Allocation`]
//! hands out views of the spans a launch binds (disjoint where one is written, checked);
//! [`with_operands`] puts the two together into a launch's operands, which
//! [`super::Launcher::launch_bound`] launches. The device step and the kernel checks bind
//! through here, so a launch is described once and bound one way.

use cudarc::driver::{CudaSlice, CudaViewMut};

use super::table::{Extent, Fit, KernelCall, RunValue, Value};
use super::{Bindable, DeviceIn, DeviceOut, Operand};
use crate::cuda::adamw::AdamScalars;
use crate::cuda::element::{Access, Element};
use crate::cuda::error::CudaError;
use crate::tensor::Span;

/// A buffer argument bound: elements `span` of operand (or allocation) `at`, of `element`,
/// read or written by the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The operand's (or allocation's) index.
    pub at: usize,
    /// Its elements the argument binds.
    pub span: Span,
    /// The argument's element type.
    pub element: Element,
    /// Whether the kernel writes it.
    pub access: Access,
}

/// Every buffer argument of `call`, in order, bound to one of `operands` (each a name and a
/// length): the operand its source names, from the source's offset to its end (or for exactly
/// the fit's length), checked against the fit; `None` where an argument the kernel may skip
/// (a null pointer) has no operand.
pub fn resolve(
    call: &KernelCall,
    operands: &[(&'static str, usize)],
) -> Result<Vec<Option<Bound>>, CudaError> {
    let buffers = call.params.iter().filter_map(|p| match p.value {
        Value::Buffer {
            element,
            access,
            fit,
            source,
        } => Some((p.name, element, access, fit, source)),
        _ => None,
    });
    buffers
        .map(|(name, element, access, fit, source)| {
            let bad = |what: String| {
                CudaError::Shape(format!(
                    "{}: `{name}` (operand `{}`) {what}",
                    call.entry_point, source.operand
                ))
            };
            let found = operands
                .iter()
                .enumerate()
                .filter(|(_, (operand, _))| *operand == source.operand)
                .nth(source.item);
            let Some((at, &(_, len))) = found else {
                return match fit {
                    Fit::ExactOrNull(_) => Ok(None),
                    _ => Err(bad("is not among the operands".to_string())),
                };
            };
            let rest = len
                .checked_sub(source.offset)
                .ok_or_else(|| bad(format!("has {len} elements, bound from {}", source.offset)))?;
            let bound = match source.extent {
                Extent::Rest => rest,
                Extent::Fit => fit.len(),
            };
            if bound > rest || !fit.accepts(bound) {
                return Err(bad(format!(
                    "has {rest} elements from {}, the shape needs {fit:?}",
                    source.offset
                )));
            }
            Ok(Some(Bound {
                at,
                span: Span::new(source.offset, bound),
                element,
                access,
            }))
        })
        .collect()
}

/// One argument's piece of an allocation: the argument's index, its span, read or written.
pub type Piece = (usize, Span, Access);

/// A view bound to one argument.
pub enum View<'a> {
    /// Read by the kernel.
    Read(Box<dyn DeviceIn + 'a>),
    /// Written by the kernel.
    Write(Box<dyn DeviceOut + 'a>),
}

/// What [`Allocation::views`] calls with every view bound so far.
pub type WithViews<'t> = dyn FnMut(Vec<(usize, View<'_>)>) -> Result<(), CudaError> + 't;

/// One device allocation a launch binds views of.
pub trait Allocation {
    /// Calls `then` with `bound` and views of `pieces` (each an argument's index, its span of
    /// this allocation, and whether the kernel writes it). Where any piece is written, every
    /// piece is a disjoint view (overlap is an error); a piece past the end is an error.
    fn views(
        &mut self,
        pieces: &[Piece],
        bound: Vec<(usize, View<'_>)>,
        then: &mut WithViews<'_>,
    ) -> Result<(), CudaError>;
}

impl<E: Bindable> Allocation for CudaSlice<E> {
    fn views(
        &mut self,
        pieces: &[Piece],
        bound: Vec<(usize, View<'_>)>,
        then: &mut WithViews<'_>,
    ) -> Result<(), CudaError> {
        let len = self.len();
        if let Some((_, span, _)) = pieces.iter().find(|(_, span, _)| span.end() > len) {
            return Err(CudaError::Shape(format!(
                "an operand ends at {}, past its buffer of {len}",
                span.end()
            )));
        }
        let mut all: Vec<(usize, View<'_>)> = bound;
        if pieces.iter().all(|(_, _, access)| *access == Access::Read) {
            for &(i, span, _) in pieces {
                all.push((i, View::Read(Box::new(self.slice(span.offset..span.end())))));
            }
            return then(all);
        }
        let spans: Vec<Span> = pieces.iter().map(|&(_, span, _)| span).collect();
        carve(self, &spans, |views| {
            let mut all: Vec<(usize, View<'_>)> = all;
            for (&(i, _, access), view) in pieces.iter().zip(views) {
                all.push((
                    i,
                    match access {
                        Access::Write => View::Write(Box::new(view)),
                        Access::Read => View::Read(Box::new(view.into_view())),
                    },
                ));
            }
            then(all)
        })
    }
}

/// Disjoint mutable views of `slice` at `spans` (any order; checked), handed to `f` in the
/// order given.
pub fn carve<T, R, F>(slice: &mut CudaSlice<T>, spans: &[Span], f: F) -> Result<R, CudaError>
where
    F: for<'v> FnOnce(Vec<CudaViewMut<'v, T>>) -> Result<R, CudaError>,
{
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| spans[i].offset);
    let mut end = 0;
    for &i in &order {
        if spans[i].offset < end {
            return Err(CudaError::Shape(format!(
                "operands overlap at element {}",
                spans[i].offset
            )));
        }
        end = spans[i].end();
    }
    if end > slice.len() {
        return Err(CudaError::Shape(format!(
            "an operand ends at {end}, past its buffer of {}",
            slice.len()
        )));
    }
    split_next(slice.as_view_mut(), 0, spans, &order, Vec::new(), f)
}

fn split_next<'a, T, R, F>(
    mut rest: CudaViewMut<'a, T>,
    rest_start: usize,
    spans: &[Span],
    order: &[usize],
    done: Vec<(usize, CudaViewMut<'a, T>)>,
    f: F,
) -> Result<R, CudaError>
where
    F: for<'v> FnOnce(Vec<CudaViewMut<'v, T>>) -> Result<R, CudaError>,
{
    let Some((&i, tail)) = order.split_first() else {
        let mut done = done;
        done.sort_by_key(|(i, _)| *i);
        return f(done.into_iter().map(|(_, v)| v).collect());
    };
    let span = spans[i];
    let (mut upto, after) = rest.split_at_mut(span.end() - rest_start);
    let (_, piece) = upto.split_at_mut(span.offset - rest_start);
    // A new binding: the views so far shortened to the pieces' lifetime.
    let mut done = done;
    done.push((i, piece));
    split_next(after, span.end(), spans, tail, done, f)
}

/// The run-time values a launch may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunValues {
    /// The normalisation epsilon.
    pub eps: f32,
    /// The classifier's loss multiplier.
    pub dloss: f32,
    /// The norm pass's `1 / loss scale`.
    pub inv_scale: f32,
    /// Adam's scalars (set at the boundary).
    pub adam: Option<AdamScalars>,
}

/// Calls `then` with `call`'s operands: each buffer argument a view of the allocation
/// `slots` binds it to (in order, one per buffer argument; `None`: a null pointer), each
/// run-time value from `run`.
pub fn with_operands(
    call: &KernelCall,
    slots: &[Option<Bound>],
    allocations: &mut [&mut dyn Allocation],
    run: &RunValues,
    then: &mut dyn FnMut(&mut [Operand<'_>]) -> Result<(), CudaError>,
) -> Result<(), CudaError> {
    if let Some(b) = slots.iter().flatten().find(|b| b.at >= allocations.len()) {
        return Err(CudaError::Shape(format!(
            "{}: a binding of allocation {} of {}",
            call.entry_point,
            b.at,
            allocations.len()
        )));
    }
    let mut used: Vec<_> = allocations
        .iter_mut()
        .enumerate()
        .filter_map(|(at, allocation)| {
            let pieces: Vec<Piece> = slots
                .iter()
                .enumerate()
                .filter_map(|(i, b)| b.filter(|b| b.at == at).map(|b| (i, b.span, b.access)))
                .collect();
            (!pieces.is_empty()).then_some((allocation, pieces))
        })
        .collect();
    nest(&mut used, Vec::new(), &mut |mut views| {
        views.sort_by_key(|(i, _)| *i);
        let mut views = views.iter_mut().peekable();
        let mut operands = Vec::new();
        let mut slot = 0;
        for param in &call.params {
            operands.push(match param.value {
                Value::Buffer { .. } => {
                    slot += 1;
                    match views.next_if(|(i, _)| *i == slot - 1) {
                        Some((_, View::Read(view))) => Operand::In(&**view),
                        Some((_, View::Write(view))) => Operand::Out(&mut **view),
                        None => Operand::Null,
                    }
                }
                Value::Run(RunValue::AdamScalars) => {
                    Operand::Scalars(run.adam.ok_or_else(|| {
                        CudaError::Shape(format!("{}: no Adam scalars", call.entry_point))
                    })?)
                }
                Value::Run(RunValue::Eps) => Operand::Float(run.eps),
                Value::Run(RunValue::Dloss) => Operand::Float(run.dloss),
                Value::Run(RunValue::InvScale) => Operand::Float(run.inv_scale),
                Value::Int(_) | Value::Long(_) | Value::Float(_) => continue,
            });
        }
        then(&mut operands)
    })
}

/// The views of every allocation of `work` (each with the pieces bound in it) added to
/// `bound`, one allocation after the other, then `then`.
fn nest(
    work: &mut [(&mut &mut dyn Allocation, Vec<Piece>)],
    bound: Vec<(usize, View<'_>)>,
    then: &mut WithViews<'_>,
) -> Result<(), CudaError> {
    match work.split_first_mut() {
        None => then(bound),
        Some(((allocation, pieces), rest)) => {
            allocation.views(pieces, bound, &mut |views| nest(rest, views, then))
        }
    }
}
