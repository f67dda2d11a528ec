//! [`Op::launches`]: the kernels (and library calls) each op launches, with their argument
//! types and grid sizes from the registry's launch rules.

use dsplan_kernels::{Dtype, LaunchDims, Work, kernel};

use super::collectives::CommAction;
use super::{AttentionShape, Op, ShapeError, attention_work, divides};
use crate::cuda::train::buffers::Element;

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
    /// Grid and block from the registry's rule (`None` for library calls).
    pub dims: Option<LaunchDims>,
}

pub(super) fn launch(
    name: &'static str,
    entry_point: String,
    args: Vec<ArgType>,
    work: Work,
) -> Result<Launch, ShapeError> {
    let spec = kernel(name).ok_or_else(|| ShapeError(format!("no kernel `{name}`")))?;
    if !spec.entry_points.contains(&entry_point.as_str()) {
        return Err(ShapeError(format!(
            "{name}: no entry point `{entry_point}` is compiled"
        )));
    }
    let dims = spec
        .launch
        .dims(work)
        .map_err(|e| ShapeError(format!("{name}: {e}")))?;
    Ok(Launch {
        kernel: name,
        entry_point,
        args,
        dims: Some(dims),
    })
}

pub(super) fn library(name: &'static str) -> Launch {
    Launch {
        kernel: name,
        entry_point: String::new(),
        args: Vec::new(),
        dims: None,
    }
}

pub(super) fn entry(name: &str, dtype: Dtype) -> String {
    format!("{name}_{}", dtype.suffix())
}

pub(super) fn attention_entry(name: &str, dtype: Dtype, head_dim: usize) -> String {
    format!("{name}_hs{head_dim}_{}", dtype.suffix())
}

/// An attention backward's launches: `delta`, then the dk/dv and dq kernels named in
/// `kernels`, each over its number of head blocks per batch row (`shape.n_head` query
/// heads). The grouped-query entry points (`*_gqa`) take the key/value head count as one more
/// `int`.
pub(super) fn attention_backward_launches(
    dtype: Dtype,
    shape: &AttentionShape,
    kernels: [(&'static str, usize); 2],
) -> Result<Vec<Launch>, ShapeError> {
    use ArgType::{Float, Int, Pointer};
    use Element::{F32, Model};
    let grouped = kernels[0].0.ends_with("_gqa");
    let mut args = vec![
        Pointer(Model),
        Pointer(Model),
        Pointer(Model),
        Pointer(F32),
        Pointer(F32),
        Int,
        Int,
    ];
    if grouped {
        args.push(Int);
    }
    args.push(Float);
    let mut list = vec![launch(
        "attention_backward_preprocess",
        entry("attention_backward_preprocess", dtype),
        vec![
            Pointer(F32),
            Pointer(Model),
            Pointer(Model),
            Int,
            Int,
            Int,
            Int,
        ],
        Work::Rows {
            rows: (shape.batch * shape.n_head * shape.seq_len) as u64,
            cols: shape.head_dim as u64,
        },
    )?];
    for (name, heads) in kernels {
        list.push(launch(
            name,
            attention_entry(name, dtype, shape.head_dim),
            args.clone(),
            attention_work(&AttentionShape {
                n_head: heads,
                ..*shape
            }),
        )?);
    }
    Ok(list)
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
    /// The kernels the op launches in order, for model dtype `dtype` (the encoder's bucket
    /// count taken at its largest, one group per row).
    pub fn launches(&self, dtype: Dtype) -> Result<Vec<Launch>, ShapeError> {
        use ArgType::{Float, Int, Long, Pointer, Scalars};
        use Element::{F32, F64, I32, Model, U32};
        let rows = |rows: usize, cols: usize| Work::Rows {
            rows: rows as u64,
            cols: cols as u64,
        };
        let elements = |n: usize| Work::Elements(n as u64);
        let add_partials = |width: usize, chunks: usize| {
            launch(
                "add_partials",
                entry("add_partials", dtype),
                vec![Pointer(Model), Pointer(F32), Int, Int, Long],
                rows(chunks, width),
            )
        };
        Ok(match self {
            Op::Zero { .. } => vec![library("memset")],
            Op::EncoderForward {
                out, tokens, wpe, ..
            } => {
                let _ = wpe;
                vec![launch(
                    "encoder_forward",
                    entry("encoder_forward", dtype),
                    vec![
                        Pointer(Model),
                        Pointer(U32),
                        Pointer(Model),
                        Pointer(Model),
                        Int,
                        Int,
                        Int,
                    ],
                    elements(out.len().max(tokens.len())),
                )?]
            }
            Op::EncoderBackward {
                dout,
                bucket_rows,
                seq_len,
                ..
            } => {
                let c = divides("dout", dout.len(), bucket_rows.len())?;
                vec![
                    launch(
                        "encoder_backward_wpe",
                        entry("encoder_backward_wpe", dtype),
                        vec![Pointer(Model), Pointer(Model), Int, Int, Int],
                        elements(seq_len * c),
                    )?,
                    launch(
                        "encoder_backward_wte",
                        entry("encoder_backward_wte", dtype),
                        vec![
                            Pointer(Model),
                            Pointer(Model),
                            Pointer(U32),
                            Pointer(I32),
                            Pointer(I32),
                            Int,
                        ],
                        Work::Groups {
                            groups: bucket_rows.len() as u64,
                            cols: c as u64,
                        },
                    )?,
                ]
            }
            Op::LayerNormForward { mean, weight, .. } => vec![launch(
                "layernorm_forward",
                entry("layernorm_forward", dtype),
                vec![
                    Pointer(Model),
                    Pointer(F32),
                    Pointer(F32),
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(Model),
                    Int,
                    Int,
                    Float,
                ],
                rows(mean.len(), weight.len()),
            )?],
            Op::ResidualLayerNormForward { mean, weight, .. } => vec![launch(
                "residual_layernorm_forward",
                entry("residual_layernorm_forward", dtype),
                vec![
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(F32),
                    Pointer(F32),
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(Model),
                    Int,
                    Int,
                    Float,
                ],
                rows(mean.len(), weight.len()),
            )?],
            Op::LayerNormBackward { mean, weight, .. } => {
                let (n, c) = (mean.len(), weight.len());
                let chunks = n.div_ceil(32);
                vec![
                    launch(
                        "layernorm_backward",
                        entry("layernorm_backward", dtype),
                        vec![
                            Pointer(Model),
                            Pointer(F32),
                            Pointer(Model),
                            Pointer(Model),
                            Pointer(Model),
                            Pointer(F32),
                            Pointer(F32),
                            Int,
                            Int,
                        ],
                        rows(n, c),
                    )?,
                    add_partials(c, chunks)?,
                    add_partials(c, chunks)?,
                ]
            }
            Op::MatmulForward { .. }
            | Op::MatmulBackwardInput { .. }
            | Op::MatmulBackwardWeight { .. }
            | Op::LogitsForward { .. } => vec![library("cublasLt")],
            Op::BiasBackward { dbias, dout, .. } => {
                let width = dbias.len();
                let n = divides("dout", dout.len(), width)?;
                vec![
                    launch(
                        "column_partials",
                        entry("column_partials", dtype),
                        vec![Pointer(F32), Pointer(Model), Int, Int],
                        rows(n, width),
                    )?,
                    add_partials(width, n.div_ceil(64))?,
                ]
            }
            Op::GeluForward { inp, .. } => vec![launch(
                "gelu_forward",
                entry("gelu_forward", dtype),
                vec![Pointer(Model), Pointer(Model), Long],
                elements(inp.len()),
            )?],
            Op::GeluBackward { inp, .. } => vec![launch(
                "gelu_backward_inplace",
                entry("gelu_backward_inplace", dtype),
                vec![Pointer(Model), Pointer(Model), Long],
                elements(inp.len()),
            )?],
            Op::AttentionForward { shape, .. } => vec![launch(
                "attention_forward",
                attention_entry("attention_forward", dtype, shape.head_dim),
                vec![
                    Pointer(Model),
                    Pointer(F32),
                    Pointer(Model),
                    Int,
                    Int,
                    Float,
                ],
                attention_work(shape),
            )?],
            Op::AttentionBackward { shape, .. } => attention_backward_launches(
                dtype,
                shape,
                [
                    ("attention_backward_dkdv", shape.n_head),
                    ("attention_backward_dq", shape.n_head),
                ],
            )?,
            Op::FusedClassifier {
                logits, targets, ..
            } => vec![launch(
                "fused_classifier",
                entry("fused_classifier", dtype),
                vec![Pointer(Model), Pointer(F32), Pointer(I32), Float, Int, Int],
                rows(
                    targets.len(),
                    divides("logits", logits.len(), targets.len())?,
                ),
            )?],
            Op::UnscaleNorm { grads, .. } => vec![
                launch(
                    "unscale_norm_partials",
                    entry("unscale_norm_partials", dtype),
                    vec![Pointer(Model), Long, Float, Pointer(F64), Pointer(I32)],
                    elements(grads.len()),
                )?,
                launch(
                    "sum_partials",
                    "sum_partials_f64".to_string(),
                    vec![Pointer(F64), Pointer(F64), Int],
                    elements(crate::cuda::train::buffers::NORM_BLOCKS),
                )?,
            ],
            Op::AdamW { segments, .. } => vec![launch(
                "adamw",
                entry("adamw", dtype),
                vec![
                    Pointer(F32),
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(F32),
                    Pointer(F32),
                    Pointer(Element::AdamSegment),
                    Scalars,
                ],
                Work::Segments(segments.len() as u64),
            )?],
            Op::Llama(op) => op.launches(dtype)?,
            Op::Collective(comm) => match &comm.action {
                CommAction::Collective { .. } => vec![library("nccl")],
                CommAction::Copy { pieces } => pieces.iter().map(|_| library("memcpy")).collect(),
                CommAction::Zero { .. } => vec![library("memset")],
                CommAction::Sync | CommAction::Release { .. } | CommAction::Mark(_) => Vec::new(),
            },
        })
    }
}
