//! [`Op`]: one step of the device program, with its tensors as [`TensorRef`]s, as data.
//!
//! `forward.rs`, `backward.rs` and `step.rs` build the step as a list of ops; `execute.rs`
//! runs that same list on the GPU (each op is one [`crate::cuda::launch::Launcher`] or
//! [`crate::cuda::gemm::Gemm`] call, a memset, or a host transfer). On the host the list is
//! what tests read: [`Op::check`] applies the launcher's shape rules to the spans, and
//! [`Op::launches`] lists the kernels each op launches, with their argument types (checked
//! against the `.cu` signatures) and grid sizes from the registry's launch rules.

use std::fmt;

use dsplan_kernels::{Dtype, LaunchDims, Work, kernel};

use super::buffers::{DeviceLayout, Element, Region, TensorRef};

/// `(B, T, NH, hs)` of an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch.
    pub batch: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Heads.
    pub n_head: usize,
    /// Head size.
    pub head_dim: usize,
}

/// `(rows, in_features, out_features)` of a product.
pub type GemmDims = (usize, usize, usize);

/// One operation of the device step.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `tensor = 0` (a memset).
    Zero {
        /// The tensor.
        tensor: TensorRef,
    },
    /// `out = wte[tokens] + wpe[t]`.
    EncoderForward {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        tokens: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(maxT, C)`.
        wpe: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `dwpe += ...`, `dwte[token] += ...` (the token buckets are uploaded per micro-batch).
    EncoderBackward {
        /// `(V, C)`.
        dwte: TensorRef,
        /// `(maxT, C)`.
        dwpe: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// Distinct tokens (at most `N`; the live count is known per batch).
        bucket_tokens: TensorRef,
        /// Group starts (`groups + 1`).
        bucket_starts: TensorRef,
        /// `(N)`.
        bucket_rows: TensorRef,
        /// `T`.
        seq_len: usize,
    },
    /// `out = LN(inp)`, saving mean and rstd.
    LayerNormForward {
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(C)`.
        bias: TensorRef,
    },
    /// `residual = a + b`, `out = LN(residual)`.
    ResidualLayerNormForward {
        /// `(N, C)`.
        residual: TensorRef,
        /// `(N, C)`.
        out: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
        /// `(N, C)`.
        a: TensorRef,
        /// `(N, C)`.
        b: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(C)`.
        bias: TensorRef,
    },
    /// `dinp += LN'`, `dweight += ...`, `dbias += ...`.
    LayerNormBackward {
        /// `(N, C)`, accumulated.
        dinp: TensorRef,
        /// `(C)`.
        dweight: TensorRef,
        /// `(C)`.
        dbias: TensorRef,
        /// f32 partials.
        scratch: TensorRef,
        /// `(N, C)`.
        dout: TensorRef,
        /// `(N, C)`.
        inp: TensorRef,
        /// `(C)`.
        weight: TensorRef,
        /// `(N)`.
        mean: TensorRef,
        /// `(N)`.
        rstd: TensorRef,
    },
    /// `out = inp @ weight (+ bias)` (cuBLASLt).
    MatmulForward {
        /// `(N, OC)`.
        out: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(IC, OC)`.
        weight: TensorRef,
        /// `(OC)`.
        bias: Option<TensorRef>,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dinp = dout @ weight^T` (cuBLASLt, overwrites).
    MatmulBackwardInput {
        /// `(N, IC)`.
        dinp: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
        /// `(IC, OC)`.
        weight: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dweight += inp^T @ dout` (cuBLASLt, accumulates).
    MatmulBackwardWeight {
        /// `(IC, OC)`.
        dweight: TensorRef,
        /// `(N, IC)`.
        inp: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
        /// `(N, IC, OC)`.
        dims: GemmDims,
    },
    /// `dbias += column sums of dout`.
    BiasBackward {
        /// `(OC)`.
        dbias: TensorRef,
        /// f32 partials `ceil(N/64) x OC`.
        scratch: TensorRef,
        /// `(N, OC)`.
        dout: TensorRef,
    },
    /// `logits = lnf @ wte^T` (cuBLASLt).
    LogitsForward {
        /// `(N, V)`.
        logits: TensorRef,
        /// `(N, C)`.
        lnf: TensorRef,
        /// `(V, C)`.
        wte: TensorRef,
        /// `(N, C, V)`.
        dims: (usize, usize, usize),
    },
    /// `out = gelu(inp)`.
    GeluForward {
        /// Output.
        out: TensorRef,
        /// Input.
        inp: TensorRef,
    },
    /// `d *= gelu'(inp)`.
    GeluBackward {
        /// In place.
        d: TensorRef,
        /// The forward input.
        inp: TensorRef,
    },
    /// Causal attention forward.
    AttentionForward {
        /// `(B, T, C)`.
        out: TensorRef,
        /// `(B, NH, T)`.
        lse: TensorRef,
        /// `(B, T, 3C)`.
        qkv: TensorRef,
        /// Its shape.
        shape: AttentionShape,
    },
    /// Causal attention backward (written, not accumulated).
    AttentionBackward {
        /// `(B, T, 3C)`.
        dqkv: TensorRef,
        /// `(B, NH, T)` f32 scratch.
        delta: TensorRef,
        /// `(B, T, C)`.
        dout: TensorRef,
        /// `(B, T, C)`.
        out: TensorRef,
        /// `(B, T, 3C)`.
        qkv: TensorRef,
        /// `(B, NH, T)`.
        lse: TensorRef,
        /// Its shape.
        shape: AttentionShape,
    },
    /// Softmax cross-entropy: losses, and `dloss * (softmax - onehot)` in place of the logits
    /// (`dloss` is the step's, given at run time).
    FusedClassifier {
        /// `(N, V)`.
        logits: TensorRef,
        /// `(N)`.
        losses: TensorRef,
        /// `(N)`.
        targets: TensorRef,
    },
    /// `grads *= inv_scale`, sum of squares and inf/NaN flag (`inv_scale` at run time).
    UnscaleNorm {
        /// The flat gradients.
        grads: TensorRef,
        /// f64 partials.
        partials: TensorRef,
        /// f64 total.
        total: TensorRef,
        /// i32 flag.
        found_inf: TensorRef,
    },
    /// Fused AdamW over the segment table (scalars at run time).
    AdamW {
        /// fp32 weights the optimizer steps (the parameters themselves in f32 training).
        master: TensorRef,
        /// The 16-bit copy written in the same pass (`None` in f32 training).
        params_out: Option<TensorRef>,
        /// The gradients.
        grads: TensorRef,
        /// First moment.
        exp_avg: TensorRef,
        /// Second moment.
        exp_avg_sq: TensorRef,
        /// The segment table.
        segments: TensorRef,
    },
}

/// A shape rule an op breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

fn expect(what: &str, tensor: &TensorRef, len: usize) -> Result<(), ShapeError> {
    if tensor.len() == len {
        Ok(())
    } else {
        Err(ShapeError(format!(
            "{what} has {} elements, the shape needs {len}",
            tensor.len()
        )))
    }
}

fn divides(what: &str, whole: usize, part: usize) -> Result<usize, ShapeError> {
    if part == 0 || !whole.is_multiple_of(part) {
        return Err(ShapeError(format!(
            "{what}: {whole} elements are not rows of {part}"
        )));
    }
    Ok(whole / part)
}

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

fn launch(
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

fn library(name: &'static str) -> Launch {
    Launch {
        kernel: name,
        entry_point: String::new(),
        args: Vec::new(),
        dims: None,
    }
}

fn entry(name: &str, dtype: Dtype) -> String {
    format!("{name}_{}", dtype.suffix())
}

fn attention_entry(name: &str, dtype: Dtype, head_dim: usize) -> String {
    format!("{name}_hs{head_dim}_{}", dtype.suffix())
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
    /// Every tensor the op touches, with whether it writes it.
    pub fn tensors(&self) -> Vec<(TensorRef, Access)> {
        use Access::{Read, Write};
        match self {
            Op::Zero { tensor } => vec![(*tensor, Write)],
            Op::EncoderForward {
                out,
                tokens,
                wte,
                wpe,
                ..
            } => vec![(*out, Write), (*tokens, Read), (*wte, Read), (*wpe, Read)],
            Op::EncoderBackward {
                dwte,
                dwpe,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
                ..
            } => vec![
                (*dwte, Write),
                (*dwpe, Write),
                (*dout, Read),
                (*bucket_tokens, Read),
                (*bucket_starts, Read),
                (*bucket_rows, Read),
            ],
            Op::LayerNormForward {
                out,
                mean,
                rstd,
                inp,
                weight,
                bias,
            } => vec![
                (*out, Write),
                (*mean, Write),
                (*rstd, Write),
                (*inp, Read),
                (*weight, Read),
                (*bias, Read),
            ],
            Op::ResidualLayerNormForward {
                residual,
                out,
                mean,
                rstd,
                a,
                b,
                weight,
                bias,
            } => vec![
                (*residual, Write),
                (*out, Write),
                (*mean, Write),
                (*rstd, Write),
                (*a, Read),
                (*b, Read),
                (*weight, Read),
                (*bias, Read),
            ],
            Op::LayerNormBackward {
                dinp,
                dweight,
                dbias,
                scratch,
                dout,
                inp,
                weight,
                mean,
                rstd,
            } => vec![
                (*dinp, Write),
                (*dweight, Write),
                (*dbias, Write),
                (*scratch, Write),
                (*dout, Read),
                (*inp, Read),
                (*weight, Read),
                (*mean, Read),
                (*rstd, Read),
            ],
            Op::MatmulForward {
                out,
                inp,
                weight,
                bias,
                ..
            } => {
                let mut list = vec![(*out, Write), (*inp, Read), (*weight, Read)];
                list.extend(bias.map(|b| (b, Read)));
                list
            }
            Op::MatmulBackwardInput {
                dinp, dout, weight, ..
            } => vec![(*dinp, Write), (*dout, Read), (*weight, Read)],
            Op::MatmulBackwardWeight {
                dweight, inp, dout, ..
            } => vec![(*dweight, Write), (*inp, Read), (*dout, Read)],
            Op::BiasBackward {
                dbias,
                scratch,
                dout,
            } => vec![(*dbias, Write), (*scratch, Write), (*dout, Read)],
            Op::LogitsForward {
                logits, lnf, wte, ..
            } => vec![(*logits, Write), (*lnf, Read), (*wte, Read)],
            Op::GeluForward { out, inp } => vec![(*out, Write), (*inp, Read)],
            Op::GeluBackward { d, inp } => vec![(*d, Write), (*inp, Read)],
            Op::AttentionForward { out, lse, qkv, .. } => {
                vec![(*out, Write), (*lse, Write), (*qkv, Read)]
            }
            Op::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                ..
            } => vec![
                (*dqkv, Write),
                (*delta, Write),
                (*dout, Read),
                (*out, Read),
                (*qkv, Read),
                (*lse, Read),
            ],
            Op::FusedClassifier {
                logits,
                losses,
                targets,
            } => vec![(*logits, Write), (*losses, Write), (*targets, Read)],
            Op::UnscaleNorm {
                grads,
                partials,
                total,
                found_inf,
            } => vec![
                (*grads, Write),
                (*partials, Write),
                (*total, Write),
                (*found_inf, Write),
            ],
            Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg,
                exp_avg_sq,
                segments,
            } => {
                let mut list = vec![(*master, Write)];
                list.extend(params_out.map(|p| (p, Write)));
                list.extend([
                    (*grads, Read),
                    (*exp_avg, Write),
                    (*exp_avg_sq, Write),
                    (*segments, Read),
                ]);
                list
            }
        }
    }

    /// The launcher's shape rules on the op's spans, and the layout's bounds: every tensor
    /// inside its region, written tensors disjoint from every other tensor of the op.
    pub fn check(&self, layout: &DeviceLayout) -> Result<(), ShapeError> {
        let tensors = self.tensors();
        for (tensor, _) in &tensors {
            if tensor.span.end() > layout.len(tensor.region) {
                return Err(ShapeError(format!(
                    "{tensor:?} lies outside its region of {} elements",
                    layout.len(tensor.region)
                )));
            }
        }
        for (i, (a, a_access)) in tensors.iter().enumerate() {
            for (b, b_access) in &tensors[i + 1..] {
                let written = *a_access == Access::Write || *b_access == Access::Write;
                if written && a.overlaps(b) {
                    return Err(ShapeError(format!(
                        "{a:?} overlaps {b:?}, and one of them is written"
                    )));
                }
            }
        }
        self.regions_ok()?;
        self.check_shapes()
    }

    /// The region each operand must live in, in [`Op::tensors`] order: fixed per op kind,
    /// which is what lets the GPU executor pick each operand's allocation by kind.
    pub fn expected_regions(&self) -> Vec<Region> {
        use Region::{
            Activations as A, BucketRows, BucketStarts, BucketTokens, ExpAvg, ExpAvgSq, FoundInf,
            Grads as G, Master, NormPartials, NormTotal, Params as P, Scratch, Segments,
            Stats as S, Targets, Tokens,
        };
        match self {
            Op::Zero { tensor } => vec![match tensor.region {
                G | A | FoundInf => tensor.region,
                _ => G,
            }],
            Op::EncoderForward { .. } => vec![A, Tokens, P, P],
            Op::EncoderBackward { .. } => vec![G, G, A, BucketTokens, BucketStarts, BucketRows],
            Op::LayerNormForward { .. } => vec![A, S, S, A, P, P],
            Op::ResidualLayerNormForward { .. } => vec![A, A, S, S, A, A, P, P],
            Op::LayerNormBackward { .. } => vec![A, G, G, Scratch, A, A, P, S, S],
            Op::MatmulForward { bias, .. } => {
                let mut list = vec![A, A, P];
                list.extend(bias.map(|_| P));
                list
            }
            Op::MatmulBackwardInput { .. } => vec![A, A, P],
            Op::MatmulBackwardWeight { .. } => vec![G, A, A],
            Op::BiasBackward { .. } => vec![G, Scratch, A],
            Op::LogitsForward { .. } => vec![A, A, P],
            Op::GeluForward { .. } | Op::GeluBackward { .. } => vec![A, A],
            Op::AttentionForward { .. } => vec![A, S, A],
            Op::AttentionBackward { .. } => vec![A, Scratch, A, A, A, S],
            Op::FusedClassifier { .. } => vec![A, S, Targets],
            Op::UnscaleNorm { .. } => vec![G, NormPartials, NormTotal, FoundInf],
            Op::AdamW { params_out, .. } => match params_out {
                Some(_) => vec![Master, P, G, ExpAvg, ExpAvgSq, Segments],
                None => vec![P, G, ExpAvg, ExpAvgSq, Segments],
            },
        }
    }

    /// Whether every operand lives in its [`Op::expected_regions`] region.
    pub fn regions_ok(&self) -> Result<(), ShapeError> {
        let expected = self.expected_regions();
        let found: Vec<Region> = self.tensors().iter().map(|(t, _)| t.region).collect();
        if expected == found {
            Ok(())
        } else {
            Err(ShapeError(format!(
                "operands live in {found:?}, the executor expects {expected:?}"
            )))
        }
    }

    fn check_shapes(&self) -> Result<(), ShapeError> {
        match self {
            Op::Zero { .. } => Ok(()),
            Op::EncoderForward {
                out,
                tokens,
                wte,
                wpe,
                seq_len,
            } => {
                let rows = tokens.len();
                let c = divides("out", out.len(), rows)?;
                divides("wte", wte.len(), c)?;
                if *seq_len == 0 || rows % seq_len != 0 || wpe.len() < seq_len * c {
                    return Err(ShapeError(format!(
                        "{rows} tokens do not form rows of T = {seq_len} within wpe"
                    )));
                }
                Ok(())
            }
            Op::EncoderBackward {
                dwte,
                dwpe,
                dout,
                bucket_tokens,
                bucket_starts,
                bucket_rows,
                seq_len,
            } => {
                let rows = bucket_rows.len();
                let c = divides("dout", dout.len(), rows)?;
                expect("bucket starts", bucket_starts, bucket_tokens.len() + 1)?;
                divides("dwte", dwte.len(), c)?;
                if *seq_len == 0 || rows % seq_len != 0 || dwpe.len() < seq_len * c {
                    return Err(ShapeError(format!(
                        "{rows} rows do not form a batch of T = {seq_len} within dwpe"
                    )));
                }
                Ok(())
            }
            Op::LayerNormForward {
                out,
                mean,
                rstd,
                inp,
                weight,
                bias,
            } => {
                let (c, n) = (weight.len(), mean.len());
                expect("inp", inp, n * c)?;
                expect("out", out, n * c)?;
                expect("rstd", rstd, n)?;
                expect("bias", bias, c)
            }
            Op::ResidualLayerNormForward {
                residual,
                out,
                mean,
                rstd,
                a,
                b,
                weight,
                bias,
            } => {
                let (c, n) = (weight.len(), mean.len());
                for (what, t) in [("residual", residual), ("out", out), ("a", a), ("b", b)] {
                    expect(what, t, n * c)?;
                }
                expect("rstd", rstd, n)?;
                expect("bias", bias, c)
            }
            Op::LayerNormBackward {
                dinp,
                dweight,
                dbias,
                scratch,
                dout,
                inp,
                weight,
                mean,
                rstd,
            } => {
                let (c, n) = (weight.len(), mean.len());
                for (what, t) in [("dinp", dinp), ("dout", dout), ("inp", inp)] {
                    expect(what, t, n * c)?;
                }
                expect("rstd", rstd, n)?;
                expect("dweight", dweight, c)?;
                expect("dbias", dbias, c)?;
                expect("scratch", scratch, n.div_ceil(32) * 2 * c)
            }
            Op::MatmulForward {
                out,
                inp,
                weight,
                bias,
                dims: (n, ic, oc),
            } => {
                expect("out", out, n * oc)?;
                expect("inp", inp, n * ic)?;
                expect("weight", weight, ic * oc)?;
                bias.map_or(Ok(()), |b| expect("bias", &b, *oc))
            }
            Op::MatmulBackwardInput {
                dinp,
                dout,
                weight,
                dims: (n, ic, oc),
            } => {
                expect("dinp", dinp, n * ic)?;
                expect("dout", dout, n * oc)?;
                expect("weight", weight, ic * oc)
            }
            Op::MatmulBackwardWeight {
                dweight,
                inp,
                dout,
                dims: (n, ic, oc),
            } => {
                expect("dweight", dweight, ic * oc)?;
                expect("inp", inp, n * ic)?;
                expect("dout", dout, n * oc)
            }
            Op::BiasBackward {
                dbias,
                scratch,
                dout,
            } => {
                let rows = divides("dout", dout.len(), dbias.len())?;
                expect("scratch", scratch, rows.div_ceil(64) * dbias.len())
            }
            Op::LogitsForward {
                logits,
                lnf,
                wte,
                dims: (n, c, v),
            } => {
                expect("logits", logits, n * v)?;
                expect("lnf", lnf, n * c)?;
                expect("wte", wte, v * c)
            }
            Op::GeluForward { out, inp } => expect("out", out, inp.len()),
            Op::GeluBackward { d, inp } => expect("d", d, inp.len()),
            Op::AttentionForward {
                out,
                lse,
                qkv,
                shape,
            } => {
                let s = shape;
                let c = s.n_head * s.head_dim;
                expect("qkv", qkv, s.batch * s.seq_len * 3 * c)?;
                expect("out", out, s.batch * s.seq_len * c)?;
                expect("lse", lse, s.batch * s.n_head * s.seq_len)
            }
            Op::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                shape,
            } => {
                let s = shape;
                let c = s.n_head * s.head_dim;
                expect("qkv", qkv, s.batch * s.seq_len * 3 * c)?;
                expect("dqkv", dqkv, qkv.len())?;
                expect("dout", dout, s.batch * s.seq_len * c)?;
                expect("out", out, s.batch * s.seq_len * c)?;
                expect("lse", lse, s.batch * s.n_head * s.seq_len)?;
                expect("delta", delta, s.batch * s.n_head * s.seq_len)
            }
            Op::FusedClassifier {
                logits,
                losses,
                targets,
            } => {
                expect("losses", losses, targets.len())?;
                divides("logits", logits.len(), targets.len()).map(|_| ())
            }
            Op::UnscaleNorm {
                partials,
                total,
                found_inf,
                ..
            } => {
                expect("partials", partials, super::buffers::NORM_BLOCKS)?;
                expect("total", total, 1)?;
                expect("found_inf", found_inf, 1)
            }
            Op::AdamW {
                master,
                params_out,
                grads,
                exp_avg,
                exp_avg_sq,
                ..
            } => {
                let n = master.len();
                for (what, t) in [
                    ("grads", grads),
                    ("exp_avg", exp_avg),
                    ("exp_avg_sq", exp_avg_sq),
                ] {
                    expect(what, t, n)?;
                }
                params_out.map_or(Ok(()), |p| expect("params_out", &p, n))
            }
        }
    }

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
            Op::AttentionBackward { shape, .. } => {
                let backward_args = vec![
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(Model),
                    Pointer(F32),
                    Pointer(F32),
                    Int,
                    Int,
                    Float,
                ];
                vec![
                    launch(
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
                        rows(shape.batch * shape.n_head * shape.seq_len, shape.head_dim),
                    )?,
                    launch(
                        "attention_backward_dkdv",
                        attention_entry("attention_backward_dkdv", dtype, shape.head_dim),
                        backward_args.clone(),
                        attention_work(shape),
                    )?,
                    launch(
                        "attention_backward_dq",
                        attention_entry("attention_backward_dq", dtype, shape.head_dim),
                        backward_args,
                        attention_work(shape),
                    )?,
                ]
            }
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
                    elements(super::buffers::NORM_BLOCKS),
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
        })
    }
}

fn attention_work(shape: &AttentionShape) -> Work {
    Work::Attention {
        batch: shape.batch as u64,
        seq_len: shape.seq_len as u64,
        heads: shape.n_head as u64,
        head_dim: shape.head_dim as u64,
    }
}

/// Whether an op reads or writes a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only.
    Read,
    /// Written (or accumulated into).
    Write,
}
