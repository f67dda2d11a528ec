//! [`Op::check`]: the launcher's shape rules applied to an op's spans, and the layout's
//! bounds, aliasing and region rules, before anything runs.

use super::{
    Access, COLUMN_PARTIAL_ROWS, NORM_BACKWARD_ROWS, Op, ShapeError, divides, expect,
    expect_strided,
};
use dsplan_planner::memory::cuda_layout::CudaRegion;

use crate::cuda::gemm::{Operand, Pass};
use crate::cuda::train::region::{NORM_BLOCKS, Region, RegionSizes, TensorRef};

impl Op {
    /// The launcher's shape rules on the op's spans, and the layout's bounds: every tensor
    /// inside its region, written tensors disjoint from every other tensor of the op.
    pub fn check(&self, layout: &impl RegionSizes) -> Result<(), ShapeError> {
        let tensors = self.tensors();
        for (tensor, _) in &tensors {
            if tensor.span.end() > layout.region_len(tensor.region) {
                return Err(ShapeError(format!(
                    "{tensor:?} lies outside its region of {} elements",
                    layout.region_len(tensor.region)
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

    /// The region each operand must live in, in [`Op::tensors`] order: fixed per op kind (a
    /// memset's tensor and the embedding's position table, a parameter or a zeroed work
    /// buffer, are read off the op), which is what lets the GPU executor pick each operand's
    /// allocation by kind.
    pub fn expected_regions(&self) -> Vec<Region> {
        use Region::{ExpAvg, ExpAvgSq, Grads as G, Master, Params as P};
        const A: Region = Region::Step(CudaRegion::Activations);
        const S: Region = Region::Step(CudaRegion::Stats);
        const SCRATCH: Region = Region::Step(CudaRegion::Scratch);
        const TOKENS: Region = Region::Step(CudaRegion::Tokens);
        const TARGETS: Region = Region::Step(CudaRegion::Targets);
        const BUCKETS: [Region; 3] = [
            Region::Step(CudaRegion::BucketTokens),
            Region::Step(CudaRegion::BucketStarts),
            Region::Step(CudaRegion::BucketRows),
        ];
        const NORM_PARTIALS: Region = Region::Step(CudaRegion::NormPartials);
        const NORM_TOTAL: Region = Region::Step(CudaRegion::NormTotal);
        const FOUND_INF: Region = Region::Step(CudaRegion::FoundInf);
        const SEGMENTS: Region = Region::Step(CudaRegion::Segments);
        let one_of = |t: &TensorRef, allowed: &[Region]| {
            if allowed.contains(&t.region) {
                t.region
            } else {
                allowed[0]
            }
        };
        match self {
            Op::Zero { tensor } => vec![one_of(tensor, &[G, A, FOUND_INF])],
            Op::Copy { .. } | Op::GeluForward { .. } | Op::GeluBackward { .. } => vec![A, A],
            Op::SwiGluForward { .. } => vec![A, A],
            Op::Embed { positions, .. } => vec![A, TOKENS, P, one_of(positions, &[P, A])],
            Op::EmbedBackward { dwpe, .. } => {
                let mut list = vec![G];
                list.extend(dwpe.map(|_| G));
                list.push(A);
                list.extend(BUCKETS);
                list
            }
            Op::LayerNormForward { .. } => vec![A, S, S, A, P, P],
            Op::ResidualLayerNormForward { .. } => vec![A, A, S, S, A, A, P, P],
            Op::LayerNormBackward { .. } => vec![A, G, G, SCRATCH, A, A, P, S, S],
            Op::RmsNormForward { .. } => vec![A, S, A, P],
            Op::RmsNormBackward { .. } => vec![A, G, SCRATCH, A, A, P, S],
            Op::Linear { product, bias, .. } => {
                let mut list = match product.pass {
                    Pass::Forward | Pass::BackwardInput => vec![A, A, P],
                    Pass::BackwardWeight => vec![G, A, A],
                };
                list.extend(bias.map(|_| P));
                list
            }
            Op::BiasBackward { dbiases, .. } => {
                let mut list = vec![G; dbiases.len()];
                list.extend([SCRATCH, A]);
                list
            }
            Op::SwiGluBackward { .. } => vec![A, A, A],
            Op::Rope { .. } => vec![A, S, S],
            Op::AttentionForward { .. } => vec![A, S, A],
            Op::AttentionBackward { .. } => vec![A, SCRATCH, A, A, A, S],
            Op::FusedClassifier { .. } => vec![A, S, TARGETS],
            Op::UnscaleNorm { .. } => vec![G, NORM_PARTIALS, NORM_TOTAL, FOUND_INF],
            Op::AdamW { params_out, .. } => match params_out {
                Some(_) => vec![Master, P, G, ExpAvg, ExpAvgSq, SEGMENTS],
                None => vec![P, G, ExpAvg, ExpAvgSq, SEGMENTS],
            },
            // A collective's operands are picked by region at run time.
            Op::Collective(comm) => comm.tensors().iter().map(|(t, _)| t.region).collect(),
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
            Op::Copy { dst, src } => expect("dst", dst, src.len()),
            Op::Embed {
                out,
                tokens,
                wte,
                positions,
                seq_len,
            } => {
                let rows = tokens.len();
                let c = divides("out", out.len(), rows)?;
                divides("wte", wte.len(), c)?;
                if *seq_len == 0 || rows % seq_len != 0 || positions.len() < seq_len * c {
                    return Err(ShapeError(format!(
                        "{rows} tokens do not form rows of T = {seq_len} within the position table"
                    )));
                }
                Ok(())
            }
            Op::EmbedBackward {
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
                match dwpe {
                    Some(dwpe)
                        if *seq_len == 0 || rows % seq_len != 0 || dwpe.len() < seq_len * c =>
                    {
                        Err(ShapeError(format!(
                            "{rows} rows do not form a batch of T = {seq_len} within dwpe"
                        )))
                    }
                    _ => Ok(()),
                }
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
                expect("scratch", scratch, n.div_ceil(NORM_BACKWARD_ROWS) * 2 * c)
            }
            Op::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => {
                let (c, n) = (weight.len(), rstd.len());
                expect("inp", inp, n * c)?;
                expect("out", out, n * c)
            }
            Op::RmsNormBackward {
                dinp,
                dweight,
                scratch,
                dout,
                inp,
                weight,
                rstd,
            } => {
                let (c, n) = (weight.len(), rstd.len());
                for (what, t) in [("dinp", dinp), ("dout", dout), ("inp", inp)] {
                    expect(what, t, n * c)?;
                }
                expect("dweight", dweight, c)?;
                expect("scratch", scratch, n.div_ceil(NORM_BACKWARD_ROWS) * c)
            }
            Op::Linear {
                product,
                out,
                first,
                second,
                bias,
            } => {
                let plan = product.plan();
                let [a, b, c] = plan.operands;
                let (first_shape, second_shape) = if plan.second_is_a { (b, a) } else { (a, b) };
                operand(out, c)?;
                operand(first, first_shape)?;
                operand(second, second_shape)?;
                match (bias, product.pass) {
                    (None, _) => Ok(()),
                    (Some(bias), Pass::Forward) => expect("bias", bias, product.dims.2),
                    (Some(_), _) => Err(ShapeError(format!(
                        "a {:?} product takes no bias",
                        product.pass
                    ))),
                }
            }
            Op::BiasBackward {
                dbiases,
                scratch,
                dout,
            } => {
                let width: usize = dbiases.iter().map(TensorRef::len).sum();
                let rows = divides("dout", dout.len(), width)?;
                expect(
                    "scratch",
                    scratch,
                    rows.div_ceil(COLUMN_PARTIAL_ROWS) * width,
                )
            }
            Op::GeluForward { out, inp } => expect("out", out, inp.len()),
            Op::GeluBackward { d, inp } => expect("d", d, inp.len()),
            Op::SwiGluForward {
                out,
                gate_up,
                inner,
            } => {
                let n = divides("gate_up", gate_up.len(), 2 * inner)?;
                expect("out", out, n * inner)
            }
            Op::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                inner,
            } => {
                let n = divides("gate_up", gate_up.len(), 2 * inner)?;
                expect("dgate_up", dgate_up, gate_up.len())?;
                expect("dout", dout, n * inner)
            }
            Op::Rope {
                rows,
                cos,
                sin,
                heads,
                width,
                seq_len,
                ..
            } => {
                expect("sin", sin, cos.len())?;
                let half = divides("cos", cos.len(), *seq_len)?;
                let n = divides("rows", rows.len(), *width)?;
                if heads * 2 * half > *width || !n.is_multiple_of(*seq_len) {
                    return Err(ShapeError(format!(
                        "{heads} heads of {} in rows of {width}, {n} rows of T = {seq_len}",
                        2 * half
                    )));
                }
                Ok(())
            }
            Op::AttentionForward {
                out,
                lse,
                qkv,
                attention,
            } => {
                let (qkv_len, out_len, stats) = attention_sizes(attention)?;
                expect("qkv", qkv, qkv_len)?;
                expect("out", out, out_len)?;
                expect("lse", lse, stats)
            }
            Op::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                attention,
            } => {
                let (qkv_len, out_len, stats) = attention_sizes(attention)?;
                expect("qkv", qkv, qkv_len)?;
                expect("dqkv", dqkv, qkv_len)?;
                expect("dout", dout, out_len)?;
                expect("out", out, out_len)?;
                expect("lse", lse, stats)?;
                expect("delta", delta, stats)
            }
            Op::FusedClassifier {
                logits,
                losses,
                targets,
                vocab,
                stride,
            } => {
                expect("losses", losses, targets.len())?;
                expect_strided("logits", logits, (targets.len(), *vocab, *stride))
            }
            Op::UnscaleNorm {
                partials,
                total,
                found_inf,
                ..
            } => {
                expect("partials", partials, NORM_BLOCKS)?;
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
            Op::Collective(comm) => comm.check_shapes(),
        }
    }
}

/// `tensor` spans exactly the product operand `shape`.
fn operand(tensor: &TensorRef, shape: Operand) -> Result<(), ShapeError> {
    expect_strided(shape.name, tensor, (shape.rows, shape.cols, shape.stride))
}

/// Elements of `qkv`, of `out` and of `lse` (or `delta`) of an attention call.
fn attention_sizes(attention: &super::Attention) -> Result<(usize, usize, usize), ShapeError> {
    let dims = &attention.dims;
    if dims.kv_heads == 0 || !dims.n_head.is_multiple_of(dims.kv_heads) {
        return Err(ShapeError(format!(
            "{} key/value heads do not divide {} query heads",
            dims.kv_heads, dims.n_head
        )));
    }
    let rows = dims.batch * dims.seq_len;
    Ok((
        rows * (dims.n_head + 2 * dims.kv_heads) * dims.head_dim,
        rows * dims.n_head * dims.head_dim,
        dims.batch * dims.n_head * dims.seq_len,
    ))
}
