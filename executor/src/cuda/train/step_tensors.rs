//! [`StepTensors`]: the tensors of a step every model family has (the embeddings, the final
//! norm, the logits and losses, the backward's residual gradient and work buffers, the batch),
//! read by name from the planner's list, and the ops they share (the `lm_head` and the
//! classifier). A family's recipe builds its ops over these and its own tensors.

use dsplan_kernels::Dtype;
use dsplan_planner::memory::cuda_layout::{self, CudaRegion};
use dsplan_planner::plan::cuda_world::CudaScheme;

use super::program::Op;
use super::region::{Region, Tables, TensorRef, to_usize};
use crate::cuda::element::strided_len;
use crate::cuda::gemm::{Accumulate, Pass, Product, WeightLayout};
use crate::model::{BatchShape, Recompute};

/// How a layer's back-to-back weights (q, k and v without biases; gate and up) are
/// multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// As one product over the fused weight (the flat parameters hold them side by side).
    Fused,
    /// Tensor by tensor: at ZeRO stage 3 (`W > 1`) each parameter is gathered into its own
    /// place of the plan's arena, and at stages 2-3 each gradient has its own place in the
    /// gradient arena, not next to the others.
    PerTensor,
}

impl Products {
    /// The products a rank under `scheme` can run.
    pub fn of(scheme: CudaScheme) -> Self {
        match scheme {
            // Each gradient has its own place in the gradient arena, and each gathered
            // parameter its own in the parameter arena.
            CudaScheme::PartitionedGradients | CudaScheme::Sharded => Products::PerTensor,
            CudaScheme::Replicated | CudaScheme::FlatPartition => Products::Fused,
        }
    }
}

/// The tensors every family's step has, and its shape.
#[derive(Debug, Clone)]
pub struct StepTensors {
    /// The micro-batch shape.
    pub shape: BatchShape,
    /// The model dtype.
    pub dtype: Dtype,
    /// What forward keeps of each layer.
    pub recompute: Recompute,
    /// How fused weights are multiplied on this rank.
    pub products: Products,
    /// The micro-batch's token ids `(B, T)`.
    pub tokens: TensorRef,
    /// Its targets `(B, T)`.
    pub targets: TensorRef,
    /// The embedding backward's token buckets: distinct tokens, group starts, rows by token.
    pub buckets: [TensorRef; 3],
    /// The embeddings `(B, T, C)`.
    pub encoded: TensorRef,
    /// The final norm's output `(B, T, C)`.
    pub lnf: TensorRef,
    /// Its rstd `(B, T)`, f32.
    pub lnf_rstd: TensorRef,
    /// Logits `(B, T, V)` with rows [`Self::logits_stride`] apart, in the planner's
    /// `(B, T, Vp)` tensor; dlogits after the classifier.
    pub logits: TensorRef,
    /// `Vp`: elements between the logits' rows ([`cuda_layout::padded_vocab`]).
    pub logits_stride: usize,
    /// `V`.
    pub vocab: usize,
    /// Per-position losses `(B, T)`, f32.
    pub losses: TensorRef,
    /// The residual stream's gradient `(B, T, C)`.
    pub dresidual: TensorRef,
    /// A `(B, T, C)` gradient work buffer.
    pub dbtc: TensorRef,
    /// Bias backward's partials `ceil(N/64) x` the widest biased product, f32 (empty without
    /// biases).
    pub bias_partials: TensorRef,
    /// Attention backward's `delta` `(B, NH, T)`, f32.
    pub attention_delta: TensorRef,
}

impl StepTensors {
    /// The shared tensors of a step on `shape` in `dtype` of a model with vocabulary `vocab`,
    /// from the planner's `tables`.
    pub fn new(
        (shape, dtype, recompute): (BatchShape, Dtype, Recompute),
        vocab: usize,
        scheme: CudaScheme,
        tables: &Tables,
    ) -> Self {
        let act = |name: &str| tables.get(Region::Step(CudaRegion::Activations), name);
        let stat = |name: &str| tables.get(Region::Step(CudaRegion::Stats), name);
        let scratch = |name: &str| tables.get(Region::Step(CudaRegion::Scratch), name);
        let step = |region: CudaRegion| {
            let region = Region::Step(region);
            super::region::whole(region, tables.len(region))
        };
        let (logits, logits_stride) = logits_rows(act("logits"), shape.tokens(), vocab);
        Self {
            shape,
            dtype,
            recompute,
            products: Products::of(scheme),
            tokens: step(CudaRegion::Tokens),
            targets: step(CudaRegion::Targets),
            buckets: [
                step(CudaRegion::BucketTokens),
                step(CudaRegion::BucketStarts),
                step(CudaRegion::BucketRows),
            ],
            encoded: act("encoded"),
            lnf: act("lnf"),
            lnf_rstd: stat("lnf_rstd"),
            logits,
            logits_stride,
            vocab,
            losses: stat("losses"),
            dresidual: act("dresidual"),
            dbtc: act("dbtc"),
            bias_partials: scratch("bias_partials"),
            attention_delta: scratch("attention_delta"),
        }
    }

    /// The `lm_head` (an `nn.Linear` over `weight (V, C)`, GPT-2's tied to `wte`) from `lnf`
    /// into the logits, their rows `Vp` apart, then the classifier (losses, and dlogits in
    /// place).
    pub fn lm_head_forward(&self, weight: TensorRef) -> [Op; 2] {
        [
            Op::Linear {
                product: self.lm_head_product(Pass::Forward, Accumulate::Overwrite),
                out: self.logits,
                first: self.lnf,
                second: weight,
                bias: None,
            },
            Op::FusedClassifier {
                logits: self.logits,
                losses: self.losses,
                targets: self.targets,
                vocab: self.vocab,
                stride: self.logits_stride,
            },
        ]
    }

    /// The embedding's backward from `dresidual` by the token buckets: `dwte[token] +=`, and
    /// `dwpe[t] +=` where the family has a position table.
    pub fn embed_backward(&self, dwte: TensorRef, dwpe: Option<TensorRef>) -> Op {
        Op::EmbedBackward {
            dwte,
            dwpe,
            dout: self.dresidual,
            bucket_tokens: self.buckets[0],
            bucket_starts: self.buckets[1],
            bucket_rows: self.buckets[2],
            seq_len: self.shape.seq_len,
        }
    }

    /// The `lm_head`'s backward: `dlnf = dlogits @ W` into `dbtc`, `dW += dlogits^T @ lnf`.
    pub fn lm_head_backward(&self, weight: TensorRef, dweight: TensorRef) -> [Op; 2] {
        [
            Op::Linear {
                product: self.lm_head_product(Pass::BackwardInput, Accumulate::Overwrite),
                out: self.dbtc,
                first: self.logits,
                second: weight,
                bias: None,
            },
            Op::Linear {
                product: self.lm_head_product(Pass::BackwardWeight, Accumulate::Add),
                out: dweight,
                first: self.lnf,
                second: self.logits,
                bias: None,
            },
        ]
    }

    fn lm_head_product(&self, pass: Pass, accumulate: Accumulate) -> Product {
        let n = self.shape.tokens();
        Product {
            pass,
            weight: WeightLayout::OutIn,
            dims: (n, self.lnf.len() / n.max(1), self.vocab),
            stride: self.logits_stride,
            accumulate,
        }
    }
}

/// The `(N, V)` logits the products and the classifier use, rows `Vp` apart
/// ([`cuda_layout::padded_vocab`]), at the start of the planner's `(N, Vp)` tensor `whole`,
/// and `Vp`. The span ends at the last row's last real column; the padding is never touched.
fn logits_rows(whole: TensorRef, rows: usize, vocab: usize) -> (TensorRef, usize) {
    let stride = to_usize(cuda_layout::padded_vocab(vocab as u64));
    (whole.prefix(strided_len(rows, vocab, stride)), stride)
}
