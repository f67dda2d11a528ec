//! [`Op::launches`]: the kernels (and library calls) each op launches, read from the same
//! descriptions the launcher binds its views to ([`crate::cuda::launch::table`]): argument
//! types and `.cu` names in order, grid and block from the registry's rules.

use dsplan_kernels::{Dtype, LaunchDims, kernel};

use super::collectives::CommAction;
use super::{Op, ShapeError, divides};
use crate::cuda::element::Element;
use crate::cuda::error::CudaError;
use crate::cuda::launch::table::{self, KernelCall, RopeShape, Value, attention_entry};

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
    /// Grid and block from the registry's rule (`None` for library calls).
    pub dims: Option<LaunchDims>,
}

impl From<KernelCall> for Launch {
    fn from(call: KernelCall) -> Self {
        let arg = |value: Value| match value {
            Value::Buffer { element, .. } => ArgType::Pointer(element),
            Value::Int(_) => ArgType::Int,
            Value::Long(_) => ArgType::Long,
            Value::Float(_) | Value::RunFloat => ArgType::Float,
            Value::RunScalars => ArgType::Scalars,
        };
        Launch {
            kernel: call.kernel,
            args: call.params.iter().map(|p| arg(p.value)).collect(),
            names: call.params.iter().map(|p| p.name).collect(),
            entry_point: call.entry_point,
            dims: Some(call.dims),
        }
    }
}

/// A library call (no kernel of ours).
fn library(name: &'static str) -> Launch {
    Launch {
        kernel: name,
        entry_point: String::new(),
        args: Vec::new(),
        names: Vec::new(),
        dims: None,
    }
}

/// The launches of `calls`, a description's error as the op's shape error.
fn described(calls: Result<Vec<KernelCall>, CudaError>) -> Result<Vec<Launch>, ShapeError> {
    match calls {
        Ok(calls) => Ok(calls.into_iter().map(Launch::from).collect()),
        Err(e) => Err(ShapeError(e.to_string())),
    }
}

/// One launch.
fn one(call: Result<KernelCall, CudaError>) -> Result<Vec<Launch>, ShapeError> {
    described(call.map(|c| vec![c]))
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
    /// The kernels the op launches in order, for model dtype `dtype` (the embedding's bucket
    /// count taken at its largest, one group per row).
    pub fn launches(&self, dtype: Dtype) -> Result<Vec<Launch>, ShapeError> {
        match self {
            Op::Zero { .. } => Ok(vec![library("memset")]),
            Op::Copy { .. } => Ok(vec![library("memcpy")]),
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
                described(match dwpe {
                    Some(_) => table::encoder_backward(dtype, rows, rows, *seq_len, c),
                    None => table::embedding_backward(dtype, rows, rows, c),
                })
            }
            Op::LayerNormForward { mean, weight, .. } => {
                one(table::layernorm_forward(dtype, mean.len(), weight.len()))
            }
            Op::ResidualLayerNormForward { mean, weight, .. } => one(
                table::residual_layernorm_forward(dtype, mean.len(), weight.len()),
            ),
            Op::LayerNormBackward { mean, weight, .. } => {
                described(table::layernorm_backward(dtype, mean.len(), weight.len()))
            }
            Op::RmsNormForward { rstd, weight, .. } => {
                one(table::rmsnorm_forward(dtype, rstd.len(), weight.len()))
            }
            Op::RmsNormBackward { rstd, weight, .. } => {
                described(table::rmsnorm_backward(dtype, rstd.len(), weight.len()))
            }
            Op::Linear { .. } => Ok(vec![library("cublasLt")]),
            Op::BiasBackward { dbiases, dout, .. } => {
                let widths: Vec<usize> = dbiases.iter().map(|b| b.len()).collect();
                let rows = divides("dout", dout.len(), widths.iter().sum())?;
                described(table::bias_backward(dtype, rows, &widths))
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
                described(table::attention_backward(dtype, a.dims, a.heads, a.kernel))
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
            Op::UnscaleNorm { grads, .. } => described(table::unscale_and_norm(dtype, grads.len())),
            Op::AdamW {
                master, segments, ..
            } => one(table::adamw(dtype, master.len(), segments.len())),
            Op::Collective(comm) => Ok(match &comm.action {
                CommAction::Collective { .. } => vec![library("nccl")],
                CommAction::Copy { pieces } => pieces.iter().map(|_| library("memcpy")).collect(),
                CommAction::Accumulate { pieces } => {
                    return described(
                        pieces
                            .iter()
                            .map(|p| table::accumulate(dtype, p.src.len()))
                            .collect(),
                    );
                }
                CommAction::Zero { .. } => vec![library("memset")],
                CommAction::Sync | CommAction::Release { .. } | CommAction::Mark(_) => Vec::new(),
            }),
        }
    }
}
