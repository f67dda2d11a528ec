//! Runs the ops of [`super::program`] on the GPU: [`DeviceBuffers`] holds one allocation per
//! [`Region`], and [`Executor::run`] turns each op into its [`Launcher`] or [`Gemm`] call on
//! views of those allocations. **Needs a GPU**; nothing here is reached without one.
//!
//! Several tensors of one op can live in one region (a LayerNorm's input and output in the
//! activations, its weight and bias gradients in the gradients); [`carve`] hands out disjoint
//! mutable views of one allocation in safe code. Which region each operand lives in is fixed
//! per op kind ([`Op::regions`], checked on the host for every op of the step).

use crate::cuda::gemm::GemmElement;
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut};
use std::sync::Arc;

use dsplan_planner::memory::cuda_layout::CudaRegion;

use super::program::Op;
use super::region::{Region, RegionSizes, TensorRef};
use crate::cuda::adamw::{AdamScalars, AdamSegment, Decay};
use crate::cuda::error::CudaError;
use crate::cuda::gemm::{Gemm, Pass};
use crate::cuda::launch::{Launcher, Storage};
use crate::tensor::Span;
use crate::tensor::TensorTable;

/// Every allocation of a step.
#[derive(Debug)]
pub struct DeviceBuffers<T: Storage> {
    /// Parameters.
    pub params: CudaSlice<T>,
    /// Gradients.
    pub grads: CudaSlice<T>,
    /// Activations.
    pub activations: CudaSlice<T>,
    /// fp32 master weights (one unused element in f32 training).
    pub master: CudaSlice<f32>,
    /// Adam's first moment.
    pub exp_avg: CudaSlice<f32>,
    /// Adam's second moment.
    pub exp_avg_sq: CudaSlice<f32>,
    /// f32 statistics and losses.
    pub stats: CudaSlice<f32>,
    /// f32 partial sums.
    pub scratch: CudaSlice<f32>,
    /// Token ids.
    pub tokens: CudaSlice<u32>,
    /// Targets.
    pub targets: CudaSlice<i32>,
    /// Distinct tokens.
    pub bucket_tokens: CudaSlice<u32>,
    /// Group starts.
    pub bucket_starts: CudaSlice<i32>,
    /// Rows by token.
    pub bucket_rows: CudaSlice<i32>,
    /// Norm partials.
    pub norm_partials: CudaSlice<f64>,
    /// Norm total.
    pub norm_total: CudaSlice<f64>,
    /// Overflow flag.
    pub found_inf: CudaSlice<i32>,
    /// Adam's segments.
    pub segments: CudaSlice<AdamSegment>,
    /// Stage 3's reduce-scatter staging.
    pub reduce_staging: CudaSlice<T>,
    /// The all-gather's packed input.
    pub gather_in: CudaSlice<T>,
    /// The all-gather's output.
    pub gather_out: CudaSlice<T>,
    /// The same segments on the host.
    pub host_segments: Vec<AdamSegment>,
}

fn zeros<U: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<CudaSlice<U>, CudaError> {
    // A zero-length allocation is refused by the driver; absent buffers hold one element.
    Ok(stream.alloc_zeros::<U>(len.max(1))?)
}

impl<T: Storage> DeviceBuffers<T> {
    /// Allocates every region of `layout` (zeroed) and uploads the whole model `params` (f32,
    /// in `param_table`'s flat order) as this rank holds it ([`RegionSizes::initial_params`],
    /// [`RegionSizes::initial_master`], one AdamW segment per tensor of what it owns,
    /// [`RegionSizes::adam_segments`]): the master copy as given, the model-dtype copy rounded.
    pub fn new(
        stream: &Arc<CudaStream>,
        layout: &dyn RegionSizes,
        param_table: &TensorTable,
        params: &[f32],
    ) -> Result<Self, CudaError> {
        if params.len() != param_table.total_len() {
            return Err(CudaError::Shape(format!(
                "{} initial parameters for a model of {}",
                params.len(),
                param_table.total_len()
            )));
        }
        let initial = layout.initial_params(params);
        let rounded: Vec<T> = initial.iter().map(|&x| T::from_f32(x)).collect();
        let host_segments: Vec<AdamSegment> = layout
            .adam_segments(param_table)
            .into_iter()
            .map(|(offset, len)| AdamSegment::new(offset, len, Decay::Apply))
            .collect();
        let len = |r| layout.region_len(r);
        Ok(Self {
            params: stream.clone_htod(&rounded)?,
            grads: zeros(stream, len(Region::Grads))?,
            activations: zeros(stream, len(Region::Step(CudaRegion::Activations)))?,
            master: if layout.trains_master() {
                stream.clone_htod(&layout.initial_master(params))?
            } else {
                zeros(stream, 0)?
            },
            exp_avg: zeros(stream, len(Region::ExpAvg))?,
            exp_avg_sq: zeros(stream, len(Region::ExpAvgSq))?,
            stats: zeros(stream, len(Region::Step(CudaRegion::Stats)))?,
            scratch: zeros(stream, len(Region::Step(CudaRegion::Scratch)))?,
            tokens: zeros(stream, len(Region::Step(CudaRegion::Tokens)))?,
            targets: zeros(stream, len(Region::Step(CudaRegion::Targets)))?,
            bucket_tokens: zeros(stream, len(Region::Step(CudaRegion::BucketTokens)))?,
            bucket_starts: zeros(stream, len(Region::Step(CudaRegion::BucketStarts)))?,
            bucket_rows: zeros(stream, len(Region::Step(CudaRegion::BucketRows)))?,
            norm_partials: zeros(stream, len(Region::Step(CudaRegion::NormPartials)))?,
            norm_total: zeros(stream, len(Region::Step(CudaRegion::NormTotal)))?,
            found_inf: zeros(stream, len(Region::Step(CudaRegion::FoundInf)))?,
            segments: {
                // The table is allocated whole (one entry per parameter tensor, as planned);
                // a rank's partition may need fewer, the AdamW op reads their prefix.
                let mut table = host_segments.clone();
                table.resize(
                    len(Region::Step(CudaRegion::Segments)).max(table.len()),
                    AdamSegment::new(0, 0, Decay::Apply),
                );
                stream.clone_htod(&table)?
            },
            host_segments,
            reduce_staging: zeros(stream, len(Region::ReduceStaging))?,
            gather_in: zeros(stream, len(Region::GatherIn))?,
            gather_out: zeros(stream, len(Region::GatherOut))?,
        })
    }
}

/// The values an op needs at run time that the op list does not fix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunScalars {
    /// The classifier's `dloss` (loss multiplier / targets).
    pub dloss: f32,
    /// The norm pass's multiplier (`1 / S`).
    pub inv_scale: f32,
    /// AdamW's scalars (set at the boundary).
    pub adam: Option<AdamScalars>,
    /// Distinct tokens of the current micro-batch.
    pub bucket_groups: usize,
}

/// Disjoint mutable views of `slice` at `spans` (any order; checked), handed to `f` in the
/// order given.
pub fn carve<T, R, F>(slice: &mut CudaSlice<T>, spans: &[Span], f: F) -> Result<R, CudaError>
where
    F: for<'v> FnOnce(&mut [CudaViewMut<'v, T>]) -> Result<R, CudaError>,
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
    F: for<'v> FnOnce(&mut [CudaViewMut<'v, T>]) -> Result<R, CudaError>,
{
    let Some((&i, tail)) = order.split_first() else {
        let mut done = done;
        done.sort_by_key(|(i, _)| *i);
        let mut views: Vec<CudaViewMut<'_, T>> = done.into_iter().map(|(_, v)| v).collect();
        return f(&mut views);
    };
    let span = spans[i];
    let (mut upto, after) = rest.split_at_mut(span.end() - rest_start);
    let (_, piece) = upto.split_at_mut(span.offset - rest_start);
    let mut done = done;
    done.push((i, piece));
    split_next(after, span.end(), spans, tail, done, f)
}

fn range(t: &TensorRef) -> std::ops::Range<usize> {
    t.span.offset..t.span.end()
}

fn shape_error(op: &Op) -> CudaError {
    CudaError::Shape(format!("{op:?}: operands in unexpected regions"))
}

/// Runs ops on one stream.
#[derive(Debug)]
pub struct Executor<'m> {
    /// Kernel launches.
    pub launcher: Launcher<'m>,
    /// Products.
    pub gemm: Gemm,
    /// LayerNorm epsilon.
    pub eps: f32,
}

impl Executor<'_> {
    /// Runs `op` on `bufs`.
    pub fn run<T: GemmElement>(
        &self,
        op: &Op,
        bufs: &mut DeviceBuffers<T>,
        scalars: &RunScalars,
    ) -> Result<(), CudaError> {
        if op.regions_ok().is_err() {
            return Err(shape_error(op));
        }
        let l = &self.launcher;
        let eps = self.eps;
        let stream = l.stream().clone();
        let wrong = || shape_error(op);
        let DeviceBuffers {
            params,
            grads,
            activations,
            stats,
            scratch,
            tokens,
            targets,
            bucket_tokens,
            bucket_starts,
            bucket_rows,
            norm_partials,
            norm_total,
            found_inf,
            ..
        } = bufs;
        match op {
            Op::Zero { tensor } => {
                let r = range(tensor);
                match tensor.region {
                    Region::Grads => stream.memset_zeros(&mut grads.slice_mut(r))?,
                    Region::Step(CudaRegion::Activations) => {
                        stream.memset_zeros(&mut activations.slice_mut(r))?
                    }
                    Region::Step(CudaRegion::FoundInf) => {
                        stream.memset_zeros(&mut found_inf.slice_mut(r))?
                    }
                    _ => return Err(wrong()),
                }
                Ok(())
            }
            Op::Copy { dst, src } => carve(activations, &[dst.span, src.span], |a| {
                let [dst_v, src_v] = a else {
                    return Err(wrong());
                };
                stream.memcpy_dtod(&src_v.as_view(), dst_v)?;
                Ok(())
            }),
            Op::Embed {
                out,
                tokens: t,
                wte,
                positions,
                seq_len,
            } => {
                let c = self_channels(out, t)?;
                let tokens_v = tokens.slice(range(t));
                let wte_v = params.slice(range(wte));
                match positions.region {
                    // A zeroed work buffer in the activations, beside the output.
                    Region::Step(CudaRegion::Activations) => {
                        carve(activations, &[out.span, positions.span], |a| {
                            let [out_v, positions_v] = a else {
                                return Err(wrong());
                            };
                            let positions_v = positions_v.as_view();
                            l.encoder_forward(out_v, &tokens_v, &wte_v, &positions_v, *seq_len, c)
                        })
                    }
                    _ => l.encoder_forward(
                        &mut activations.slice_mut(range(out)),
                        &tokens_v,
                        &wte_v,
                        &params.slice(range(positions)),
                        *seq_len,
                        c,
                    ),
                }
            }
            Op::EmbedBackward {
                dwte,
                dwpe,
                dout,
                seq_len,
                bucket_rows: rows,
                ..
            } => {
                let groups = scalars.bucket_groups;
                let dout_v = activations.slice(range(dout));
                let buckets = (
                    bucket_tokens.slice(0..groups),
                    bucket_starts.slice(0..groups + 1),
                    bucket_rows.slice(range(rows)),
                );
                match dwpe {
                    Some(dwpe) => carve(grads, &[dwte.span, dwpe.span], |v| {
                        let [dwte_v, dwpe_v] = v else {
                            return Err(wrong());
                        };
                        l.encoder_backward(
                            dwte_v,
                            dwpe_v,
                            &dout_v,
                            &buckets.0,
                            &buckets.1,
                            &buckets.2,
                            *seq_len,
                            self_channels(dout, rows)?,
                        )
                    }),
                    None => l.embedding_backward(
                        &mut grads.slice_mut(range(dwte)),
                        &dout_v,
                        &buckets.0,
                        &buckets.1,
                        &buckets.2,
                    ),
                }
            }
            Op::LayerNormForward {
                out,
                mean,
                rstd,
                inp,
                weight,
                bias,
            } => carve(activations, &[out.span, inp.span], |a| {
                let [out_v, inp_v] = a else {
                    return Err(wrong());
                };
                carve(stats, &[mean.span, rstd.span], |s| {
                    let [mean_v, rstd_v] = s else {
                        return Err(wrong());
                    };
                    l.layernorm_forward(
                        out_v,
                        mean_v,
                        rstd_v,
                        &inp_v.as_view(),
                        &params.slice(range(weight)),
                        &params.slice(range(bias)),
                        eps,
                    )
                })
            }),
            Op::ResidualLayerNormForward {
                residual,
                out,
                mean,
                rstd,
                a,
                b,
                weight,
                bias,
            } => carve(
                activations,
                &[residual.span, out.span, a.span, b.span],
                |v| {
                    let [res_v, out_v, a_v, b_v] = v else {
                        return Err(wrong());
                    };
                    carve(stats, &[mean.span, rstd.span], |s| {
                        let [mean_v, rstd_v] = s else {
                            return Err(wrong());
                        };
                        l.residual_layernorm_forward(
                            res_v,
                            out_v,
                            mean_v,
                            rstd_v,
                            &a_v.as_view(),
                            &b_v.as_view(),
                            &params.slice(range(weight)),
                            &params.slice(range(bias)),
                            eps,
                        )
                    })
                },
            ),
            Op::LayerNormBackward {
                dinp,
                dweight,
                dbias,
                scratch: partials,
                dout,
                inp,
                weight,
                mean,
                rstd,
            } => carve(activations, &[dinp.span, dout.span, inp.span], |a| {
                let [dinp_v, dout_v, inp_v] = a else {
                    return Err(wrong());
                };
                carve(grads, &[dweight.span, dbias.span], |gv| {
                    let [dw_v, db_v] = gv else {
                        return Err(wrong());
                    };
                    l.layernorm_backward(
                        dinp_v,
                        dw_v,
                        db_v,
                        &mut scratch.slice_mut(range(partials)),
                        &dout_v.as_view(),
                        &inp_v.as_view(),
                        &params.slice(range(weight)),
                        &stats.slice(range(mean)),
                        &stats.slice(range(rstd)),
                    )
                })
            }),
            Op::RmsNormForward {
                out,
                rstd,
                inp,
                weight,
            } => carve(activations, &[out.span, inp.span], |a| {
                let [out_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.rmsnorm_forward(
                    out_v,
                    &mut stats.slice_mut(range(rstd)),
                    &inp_v.as_view(),
                    &params.slice(range(weight)),
                    eps,
                )
            }),
            Op::RmsNormBackward {
                dinp,
                dweight,
                scratch: partials,
                dout,
                inp,
                weight,
                rstd,
            } => carve(activations, &[dinp.span, dout.span, inp.span], |a| {
                let [dinp_v, dout_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.rmsnorm_backward(
                    dinp_v,
                    &mut grads.slice_mut(range(dweight)),
                    &mut scratch.slice_mut(range(partials)),
                    &dout_v.as_view(),
                    &inp_v.as_view(),
                    &params.slice(range(weight)),
                    &stats.slice(range(rstd)),
                )
            }),
            Op::Linear {
                product,
                out,
                first,
                second,
                bias,
            } => match product.pass {
                // Into the activations, from an activation and a parameter (and its bias).
                Pass::Forward | Pass::BackwardInput => {
                    carve(activations, &[out.span, first.span], |a| {
                        let [out_v, first_v] = a else {
                            return Err(wrong());
                        };
                        let bias_v = bias.map(|b| params.slice(range(&b)));
                        self.gemm.run(
                            *product,
                            out_v,
                            &first_v.as_view(),
                            &params.slice(range(second)),
                            bias_v.as_ref(),
                        )
                    })
                }
                // Into a gradient, from two activations.
                Pass::BackwardWeight => self.gemm.run(
                    *product,
                    &mut grads.slice_mut(range(out)),
                    &activations.slice(range(first)),
                    &activations.slice(range(second)),
                    None,
                ),
            },
            Op::BiasBackward {
                dbiases,
                scratch: partials,
                dout,
            } => {
                let spans: Vec<Span> = dbiases.iter().map(|b| b.span).collect();
                carve(grads, &spans, |views| {
                    l.split_bias_backward(
                        views,
                        &mut scratch.slice_mut(range(partials)),
                        &activations.slice(range(dout)),
                    )
                })
            }
            Op::GeluForward { out, inp } => carve(activations, &[out.span, inp.span], |a| {
                let [out_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.gelu_forward(out_v, &inp_v.as_view())
            }),
            Op::GeluBackward { d, inp } => carve(activations, &[d.span, inp.span], |a| {
                let [d_v, inp_v] = a else {
                    return Err(wrong());
                };
                l.gelu_backward_inplace(d_v, &inp_v.as_view())
            }),
            Op::SwiGluForward {
                out,
                gate_up,
                inner,
            } => carve(activations, &[out.span, gate_up.span], |a| {
                let [out_v, gate_up_v] = a else {
                    return Err(wrong());
                };
                l.swiglu_forward(out_v, &gate_up_v.as_view(), *inner)
            }),
            Op::SwiGluBackward {
                dgate_up,
                dout,
                gate_up,
                inner,
            } => carve(
                activations,
                &[dgate_up.span, dout.span, gate_up.span],
                |a| {
                    let [dgate_up_v, dout_v, gate_up_v] = a else {
                        return Err(wrong());
                    };
                    l.swiglu_backward(dgate_up_v, &dout_v.as_view(), &gate_up_v.as_view(), *inner)
                },
            ),
            Op::Rope {
                rows,
                cos,
                sin,
                heads,
                width,
                seq_len,
                rotation,
            } => l.rope(
                &mut activations.slice_mut(range(rows)),
                &stats.slice(range(cos)),
                &stats.slice(range(sin)),
                (*width, *heads, *seq_len),
                *rotation,
            ),
            Op::AttentionForward {
                out,
                lse,
                qkv,
                attention,
            } => carve(activations, &[out.span, qkv.span], |a| {
                let [out_v, qkv_v] = a else {
                    return Err(wrong());
                };
                l.attention_forward(
                    out_v,
                    &mut stats.slice_mut(range(lse)),
                    &qkv_v.as_view(),
                    attention.dims,
                    (attention.heads, attention.kernel),
                )
            }),
            Op::AttentionBackward {
                dqkv,
                delta,
                dout,
                out,
                qkv,
                lse,
                attention,
            } => carve(
                activations,
                &[dqkv.span, dout.span, out.span, qkv.span],
                |a| {
                    let [dqkv_v, dout_v, out_v, qkv_v] = a else {
                        return Err(wrong());
                    };
                    l.attention_backward(
                        dqkv_v,
                        &mut scratch.slice_mut(range(delta)),
                        &dout_v.as_view(),
                        &out_v.as_view(),
                        &qkv_v.as_view(),
                        &stats.slice(range(lse)),
                        attention.dims,
                        (attention.heads, attention.kernel),
                    )
                },
            ),
            Op::FusedClassifier {
                logits,
                losses,
                targets: t,
                vocab,
                stride,
            } => l.fused_classifier(
                &mut activations.slice_mut(range(logits)),
                &mut stats.slice_mut(range(losses)),
                &targets.slice(range(t)),
                scalars.dloss,
                (*vocab, *stride),
            ),
            Op::UnscaleNorm {
                grads: gr,
                partials,
                total,
                found_inf: flag,
            } => l.unscale_and_norm(
                &mut grads.slice_mut(range(gr)),
                scalars.inv_scale,
                &mut norm_partials.slice_mut(range(partials)),
                &mut norm_total.slice_mut(range(total)),
                &mut found_inf.slice_mut(range(flag)),
            ),
            Op::AdamW { .. } => self.adamw(op, bufs, scalars),
            Op::Collective(_) => Err(CudaError::Shape(format!(
                "{op:?}: communication runs through the device collectives, not the compute \
                 executor"
            ))),
        }
    }

    /// The fused AdamW over the segment table.
    fn adamw<T: GemmElement>(
        &self,
        op: &Op,
        bufs: &mut DeviceBuffers<T>,
        scalars: &RunScalars,
    ) -> Result<(), CudaError> {
        let Op::AdamW {
            master: m,
            params_out,
            grads: gr,
            exp_avg: ea,
            exp_avg_sq: eas,
            segments: seg,
        } = op
        else {
            return Err(shape_error(op));
        };
        let l = &self.launcher;
        let adam = scalars
            .adam
            .ok_or_else(|| CudaError::Shape("AdamW ran without its scalars".to_string()))?;
        let DeviceBuffers {
            params,
            grads,
            master,
            exp_avg,
            exp_avg_sq,
            segments,
            host_segments,
            ..
        } = bufs;
        let grads_v = grads.slice(range(gr));
        let mut ea_v = exp_avg.slice_mut(range(ea));
        let mut eas_v = exp_avg_sq.slice_mut(range(eas));
        let seg_v = segments.slice(range(seg));
        match params_out {
            Some(p) => l.adamw(
                &mut master.slice_mut(range(m)),
                Some(&mut params.slice_mut(range(p))),
                &grads_v,
                &mut ea_v,
                &mut eas_v,
                &seg_v,
                host_segments,
                adam,
            ),
            None => {
                // f32 training: the parameters are the master weights.
                if T::DTYPE != dsplan_kernels::Dtype::F32 {
                    return Err(CudaError::Shape(
                        "AdamW without a master copy needs f32 parameters".to_string(),
                    ));
                }
                let mut params_view = params.slice_mut(range(m));
                // SAFETY: T is f32 (checked above): the same bytes, the same type.
                let mut as_f32 = unsafe { params_view.transmute_mut::<f32>(m.len()) }
                    .ok_or_else(|| CudaError::Shape("parameter view too short".into()))?;
                l.adamw::<T>(
                    &mut as_f32,
                    None,
                    &grads_v,
                    &mut ea_v,
                    &mut eas_v,
                    &seg_v,
                    host_segments,
                    adam,
                )
            }
        }
    }
}

/// Columns of `(rows, C)` `tensor` with `rows = index.len()`.
fn self_channels(tensor: &TensorRef, index: &TensorRef) -> Result<usize, CudaError> {
    if index.is_empty() || !tensor.len().is_multiple_of(index.len()) {
        return Err(CudaError::Shape(format!(
            "{} elements are not {} rows",
            tensor.len(),
            index.len()
        )));
    }
    Ok(tensor.len() / index.len())
}
