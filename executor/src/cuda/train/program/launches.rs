//! [`Op::kernel_calls`]: the kernels each op launches, as the descriptions the launcher binds
//! the op's operands to ([`crate::cuda::launch::table`]), read off the op's fields in one
//! place; and [`Op::launches`], those and the library calls listed for the host: argument
//! types, `.cu` names and which arguments are written, grid and block from the registry's
//! rules.

use dsplan_kernels::{Dtype, LaunchDims, kernel};

use crate::tensor::Span;

use super::collectives::CommAction;
use super::{Op, ShapeError, divides};
use crate::cuda::element::Element;
use crate::cuda::error::CudaError;
use crate::cuda::launch::bind::{Bound, resolve};
use crate::cuda::launch::table::{
    self, Access, KernelCall, RopeShape, RunValue, Value, attention_entry,
};

/// A kernel argument's type, as the `.cu` signature declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    /// A pointer to elements of this type (`const` or not).
    Pointer(Element),
    /// `int`.
    Int,
    /// `long long`.
    Long,
    /// `float`.
    Float,
    /// `AdamScalars` by value.
    Scalars,
}

/// One kernel launch of an op.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The registry name (`cublasLt` for products, `memset` for zeroing).
    pub kernel: &'static str,
    /// The entry point launched (empty for library calls).
    pub entry_point: String,
    /// Argument types in order (empty for library calls).
    pub args: Vec<ArgType>,
    /// The arguments' `.cu` parameter names, in the same order.
    pub names: Vec<&'static str>,
    /// The names of the buffers the kernel writes (the `.cu` declares the others `const`).
    pub written: Vec<&'static str>,
    /// Grid and block from the registry's rule (`None` for library calls).
    pub dims: Option<LaunchDims>,
}

impl From<KernelCall> for Launch {
    fn from(call: KernelCall) -> Self {
        let arg = |value: Value| match value {
            Value::Buffer { element, .. } => ArgType::Pointer(element),
            Value::Int(_) => ArgType::Int,
            Value::Long(_) => ArgType::Long,
            Value::Float(_) | Value::Run(RunValue::Eps | RunValue::Dloss | RunValue::InvScale) => {
                ArgType::Float
            }
            Value::Run(RunValue::AdamScalars) => ArgType::Scalars,
        };
        let written = call.params.iter().filter(|p| {
            matches!(
                p.value,
                Value::Buffer {
                    access: Access::Write,
                    ..
                }
            )
        });
        Launch {
            kernel: call.kernel,
            args: call.params.iter().map(|p| arg(p.value)).collect(),
            names: call.params.iter().map(|p| p.name).collect(),
            written: written.map(|p| p.name).collect(),
            entry_point: call.entry_point,
            dims: Some(call.dims),
        }
    }
}

/// A kernel call with its buffer arguments bound ([`Op::bindings`]).
pub type BoundCall = (KernelCall, Vec<Option<Bound>>);

/// A library call (no kernel of ours).
fn library(name: &'static str) -> Launch {
    Launch {
        kernel: name,
        entry_point: String::new(),
        args: Vec::new(),
        names: Vec::new(),
        written: Vec::new(),
        dims: None,
    }
}

fn shape(e: CudaError) -> ShapeError {
    ShapeError(e.to_string())
}

/// The attention kernels a step launches (each instantiated per head size).
const ATTENTION_KERNELS: [&str; 3] = [
    "attention_forward",
    "attention_backward_dkdv",
    "attention_backward_dq",
];

/// The head sizes (`n_embd / n_head`) every attention kernel of the step has an entry point
/// for in `dtype`, read from the kernel registry.
pub fn attention_head_sizes(dtype: Dtype) -> Vec<usize> {
    let has = |name: &str, hs: usize| {
        kernel(name).is_some_and(|spec| {
            spec.entry_points
                .contains(&attention_entry(name, dtype, hs).as_str())
        })
    };
    let suffix = format!("_{}", dtype.suffix());
    kernel(ATTENTION_KERNELS[0])
        .map(|spec| spec.entry_points)
        .unwrap_or_default()
        .iter()
        .filter_map(|entry| {
            entry
                .strip_prefix("attention_forward_hs")?
                .strip_suffix(suffix.as_str())?
                .parse()
                .ok()
        })
        .filter(|&hs| ATTENTION_KERNELS.iter().all(|name| has(name, hs)))
        .collect()
}

/// Whether a model with head size `head_dim` has attention kernels in `dtype`.
pub fn check_head_size(head_dim: usize, dtype: Dtype) -> Result<(), ShapeError> {
    let sizes = attention_head_sizes(dtype);
    if sizes.contains(&head_dim) {
        return Ok(());
    }
    let list: Vec<String> = sizes.iter().map(usize::to_string).collect();
    Err(ShapeError(format!(
        "the model's head size (n_embd / n_head) is {head_dim}, and the CUDA attention \
         kernels exist for head sizes {} only; train this model with --device cpu",
        list.join(" and ")
    )))
}

impl Op {
    /// The kernels the op launches in order, for model dtype `dtype`, with `groups` token
    /// buckets live (the embedding's backward; at most one per row): empty for the ops that
    /// are library calls (a memset, a copy, a product) or communication. The shapes do not
    /// depend on `dtype`, the entry points do (whether one is compiled is
    /// [`KernelCall::compiled`]'s question).
    pub fn kernel_calls(&self, dtype: Dtype, groups: usize) -> Result<Vec<KernelCall>, ShapeError> {
        let one = |call: Result<KernelCall, CudaError>| call.map(|c| vec![c]).map_err(shape);
        let many = |calls: Result<Vec<KernelCall>, CudaError>| calls.map_err(shape);
        match self {
            Op::Zero { .. } | Op::Copy { .. } | Op::Linear { .. } | Op::Host(_) => Ok(Vec::new()),
            Op::Embed {
                out,
                tokens,
                seq_len,
                ..
            } => {
                let c = divides("out", out.len(), tokens.len())?;
                one(table::encoder_forward(dtype, tokens.len(), *seq_len, c))
            }
            Op::EmbedBackward {
                dwpe,
                dout,
                bucket_rows,
                seq_len,
                ..
            } => {
                let rows = bucket_rows.len();
                let c = divides("dout", dout.len(), rows)?;
                many(match dwpe {
                    Some(_) => table::encoder_backward(dtype, rows, groups, *seq_len, c),
                    None => table::embedding_backward(dtype, rows, groups, c),
                })
            }
            Op::LayerNormForward { mean, weight, .. } => {
                one(table::layernorm_forward(dtype, mean.len(), weight.len()))
            }
            Op::ResidualLayerNormForward { mean, weight, .. } => one(
                table::residual_layernorm_forward(dtype, mean.len(), weight.len()),
            ),
            Op::LayerNormBackward { mean, weight, .. } => {
                many(table::layernorm_backward(dtype, mean.len(), weight.len()))
            }
            Op::RmsNormForward { rstd, weight, .. } => {
                one(table::rmsnorm_forward(dtype, rstd.len(), weight.len()))
            }
            Op::RmsNormBackward { rstd, weight, .. } => {
                many(table::rmsnorm_backward(dtype, rstd.len(), weight.len()))
            }
            Op::BiasBackward { dbiases, dout, .. } => {
                let widths: Vec<usize> = dbiases.iter().map(|b| b.len()).collect();
                let rows = divides("dout", dout.len(), widths.iter().sum())?;
                many(table::bias_backward(dtype, rows, &widths))
            }
            Op::GeluForward { inp, .. } => one(table::gelu_forward(dtype, inp.len())),
            Op::GeluBackward { inp, .. } => one(table::gelu_backward(dtype, inp.len())),
            Op::SwiGluForward { out, inner, .. } => {
                let rows = divides("out", out.len(), *inner)?;
                one(table::swiglu_forward(dtype, rows, *inner))
            }
            Op::SwiGluBackward { dout, inner, .. } => {
                let rows = divides("dout", dout.len(), *inner)?;
                one(table::swiglu_backward(dtype, rows, *inner))
            }
            Op::Rope {
                rows,
                cos,
                heads,
                width,
                seq_len,
                rotation,
                ..
            } => {
                let shape = RopeShape {
                    len: rows.len(),
                    table: cos.len(),
                    width: *width,
                    heads: *heads,
                    seq_len: *seq_len,
                };
                one(table::rope(dtype, shape, *rotation))
            }
            Op::AttentionForward { attention: a, .. } => {
                one(table::attention_forward(dtype, a.dims, a.heads, a.kernel))
            }
            Op::AttentionBackward { attention: a, .. } => {
                many(table::attention_backward(dtype, a.dims, a.heads, a.kernel))
            }
            Op::FusedClassifier {
                targets,
                vocab,
                stride,
                ..
            } => one(table::fused_classifier(
                dtype,
                targets.len(),
                *vocab,
                *stride,
            )),
            Op::UnscaleNorm { grads, .. } => many(table::unscale_and_norm(dtype, grads.len())),
            Op::AdamW {
                master, segments, ..
            } => one(table::adamw(dtype, master.len(), segments.len())),
            Op::Collective(comm) => match &comm.action {
                CommAction::Accumulate { pieces } => pieces
                    .iter()
                    .map(|p| table::accumulate(dtype, p.src.len()).map_err(shape))
                    .collect(),
                _ => Ok(Vec::new()),
            },
        }
    }

    /// The most token buckets the op can see live: one per row of the embedding's backward.
    pub fn largest_groups(&self) -> usize {
        match self {
            Op::EmbedBackward { bucket_rows, .. } => bucket_rows.len(),
            _ => 0,
        }
    }

    /// [`Self::kernel_calls`], each with its buffer arguments bound to the step's allocations
    /// ([`resolve`] against [`Op::operands`]): `at` the operand's region's place in
    /// [`crate::cuda::train::Region::ALL`], the span where the argument's elements lie in it.
    /// The device executor launches exactly these.
    pub fn bindings(&self, dtype: Dtype, groups: usize) -> Result<Vec<BoundCall>, ShapeError> {
        let operands = self.operands();
        let named: Vec<(&'static str, usize)> =
            operands.iter().map(|o| (o.name, o.tensor.len())).collect();
        let at_region = |b: Bound| {
            let tensor = operands[b.at].tensor;
            Bound {
                at: tensor.region.index(),
                span: Span::new(tensor.span.offset + b.span.offset, b.span.len),
                ..b
            }
        };
        self.kernel_calls(dtype, groups)?
            .into_iter()
            .map(|call| {
                let slots = resolve(&call, &named).map_err(shape)?;
                let slots = slots.into_iter().map(|s| s.map(at_region)).collect();
                Ok((call, slots))
            })
            .collect()
    }

    /// The kernels the op launches in order, for model dtype `dtype` (the embedding's bucket
    /// count taken at its largest, one group per row), each compiled, and the library calls.
    pub fn launches(&self, dtype: Dtype) -> Result<Vec<Launch>, ShapeError> {
        let library = match self {
            Op::Zero { .. } => vec![library("memset")],
            Op::Copy { .. } => vec![library("memcpy")],
            Op::Host(host) => (0..host.library_calls())
                .map(|_| library("memcpy"))
                .collect(),
            Op::Linear { .. } => vec![library("cublasLt")],
            Op::Collective(comm) => match &comm.action {
                CommAction::Collective { .. } => vec![library("nccl")],
                CommAction::Copy { pieces } => pieces.iter().map(|_| library("memcpy")).collect(),
                CommAction::Zero { .. } => vec![library("memset")],
                _ => Vec::new(),
            },
            _ => Vec::new(),
        };
        let mut launches = library;
        for call in self.kernel_calls(dtype, self.largest_groups())? {
            call.compiled().map_err(shape)?;
            launches.push(Launch::from(call));
        }
        Ok(launches)
    }
}
