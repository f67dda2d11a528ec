//! [`Op::check`]: the launcher's shape rules applied to an op's spans, and the layout's
//! bounds and aliasing rules, before anything runs.

use super::{Access, Op, ShapeError, divides, expect, expect_strided};
use dsplan_planner::memory::cuda_layout::CudaRegion;

use crate::cuda::train::buffers::{Region, RegionSizes};

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

    /// The region each operand must live in, in [`Op::tensors`] order: fixed per op kind,
    /// which is what lets the GPU executor pick each operand's allocation by kind.
    pub fn expected_regions(&self) -> Vec<Region> {
        use Region::{ExpAvg, ExpAvgSq, Grads as G, Master, Params as P};
        const A: Region = Region::Step(CudaRegion::Activations);
        const S: Region = Region::Step(CudaRegion::Stats);
        const SCRATCH: Region = Region::Step(CudaRegion::Scratch);
        const TOKENS: Region = Region::Step(CudaRegion::Tokens);
        const TARGETS: Region = Region::Step(CudaRegion::Targets);
        const BUCKET_TOKENS: Region = Region::Step(CudaRegion::BucketTokens);
        const BUCKET_STARTS: Region = Region::Step(CudaRegion::BucketStarts);
        const BUCKET_ROWS: Region = Region::Step(CudaRegion::BucketRows);
        const NORM_PARTIALS: Region = Region::Step(CudaRegion::NormPartials);
        const NORM_TOTAL: Region = Region::Step(CudaRegion::NormTotal);
        const FOUND_INF: Region = Region::Step(CudaRegion::FoundInf);
        const SEGMENTS: Region = Region::Step(CudaRegion::Segments);
        match self {
            Op::Zero { tensor } => vec![match tensor.region {
                G | A | FOUND_INF => tensor.region,
                _ => G,
            }],
            Op::EncoderForward { .. } => vec![A, TOKENS, P, P],
            Op::EncoderBackward { .. } => vec![G, G, A, BUCKET_TOKENS, BUCKET_STARTS, BUCKET_ROWS],
            Op::LayerNormForward { .. } => vec![A, S, S, A, P, P],
            Op::ResidualLayerNormForward { .. } => vec![A, A, S, S, A, A, P, P],
            Op::LayerNormBackward { .. } => vec![A, G, G, SCRATCH, A, A, P, S, S],
            Op::MatmulForward { bias, .. } => {
                let mut list = vec![A, A, P];
                list.extend(bias.map(|_| P));
                list
            }
            Op::MatmulBackwardInput { .. } => vec![A, A, P],
            Op::MatmulBackwardWeight { .. } => vec![G, A, A],
            Op::BiasBackward { .. } => vec![G, SCRATCH, A],
            Op::LogitsForward { .. } | Op::LogitsBackwardInput { .. } => vec![A, A, P],
            Op::LogitsBackwardWeight { .. } => vec![G, A, A],
            Op::GeluForward { .. } | Op::GeluBackward { .. } => vec![A, A],
            Op::AttentionForward { .. } => vec![A, S, A],
            Op::AttentionBackward { .. } => vec![A, SCRATCH, A, A, A, S],
            Op::FusedClassifier { .. } => vec![A, S, TARGETS],
            Op::UnscaleNorm { .. } => vec![G, NORM_PARTIALS, NORM_TOTAL, FOUND_INF],
            Op::AdamW { params_out, .. } => match params_out {
                Some(_) => vec![Master, P, G, ExpAvg, ExpAvgSq, SEGMENTS],
                None => vec![P, G, ExpAvg, ExpAvgSq, SEGMENTS],
            },
            Op::Llama(op) => op.expected_regions(),
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
                logits: dlogits,
                lnf,
                wte,
                dims: (n, c, v),
                stride,
            }
            | Op::LogitsBackwardInput {
                dlnf: lnf,
                dlogits,
                wte,
                dims: (n, c, v),
                stride,
            }
            | Op::LogitsBackwardWeight {
                dwte: wte,
                lnf,
                dlogits,
                dims: (n, c, v),
                stride,
            } => {
                expect_strided("logits", dlogits, (*n, *v, *stride))?;
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
                expect(
                    "partials",
                    partials,
                    crate::cuda::train::buffers::NORM_BLOCKS,
                )?;
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
            Op::Llama(op) => op.check_shapes(),
            Op::Collective(comm) => comm.check_shapes(),
        }
    }
}
