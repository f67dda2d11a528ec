//! The buffer list of the `dsplan-cuda` backend ([`super::PlanBackend::DsplanCuda`]): exactly
//! the allocations of one rank of dsplan's CUDA training step, so that the device memory it
//! reports per category equals the plan's to the byte. The table below is one GPU; at world
//! sizes above 1 the model states are one rank's shares and the collectives' staging is added
//! ([`super::cuda_world`]).
//!
//! The device step allocates every buffer once, before the first step, and keeps it for the
//! run: every buffer here is [`Lifetime::Persistent`] on [`Device::Gpu`], and the plan's peak
//! is their sum. At world size 1 ZeRO stages 0-3 compute the same step, so the list is the same
//! for every stage: the buffers DeepSpeed adds per stage (fp32 gradient partitions, buckets,
//! gathered copies, reduce-scatter staging) have no job on one GPU. `Ψ` is the model's
//! parameter count, unpadded (the device keeps one flat buffer of the tensors back to back).
//!
//! | buffer | size | kind |
//! |---|---|---|
//! | parameters | `Ψ`, model dtype | parameters |
//! | gradients | `Ψ`, model dtype, accumulated over micro-steps | gradients |
//! | fp32 master weights | `Ψ` in `f32`, 16-bit models only | master weights |
//! | AdamW `exp_avg`, `exp_avg_sq` | `Ψ` in `f32` each | optimizer states |
//! | activations | [`crate::memory::cuda_layout`]'s activation region, model dtype (with full activation checkpointing, each block's output and one shared working set) | activation arena |
//! | f32 statistics and losses | its stats region, `f32` | activation arena |
//! | backward f32 scratch | its scratch region, `f32` | working activations |
//! | token ids, targets, embedding buckets | its token regions, `u32` / `i32` | input activations |
//! | gradient norm partials and total, overflow flag, AdamW segment table | its step regions, `f64` / `i32` / 24-byte entries ([`Dtype::Uint8`] bytes) | step scratch |
//!
//! Under offload the model states the host holds leave the table ([`super::cuda_offload`]:
//! the device's shares, and the host and NVMe buffers appended after the device's). The CUDA
//! executor trains GPT-2 or the Llama family (Llama, Qwen2, Mistral;
//! [`crate::memory::cuda_layout::llama_cuda_tensors`]) with AdamW: other families and what
//! [`super::cuda_world::check_cuda_world`] lists are plan errors ([`check_cuda_backend`]).

use super::buffers::{Buffer, BufferKind, BufferList, Lifetime};
use super::cpu_buffers::arena_recompute;
use super::cuda_offload::host::{HostInputs, host_buffers};
use super::cuda_world::{CudaScheme, CudaShares, check_cuda_world};
use super::dtype::{Device, Dtype};
use super::model_graph::ModelGraph;
use super::run_policy::RunPolicy;
use super::settings::Settings;
use crate::diagnostics::{Code, Diagnostic};
use crate::memory::cuda_layout::{
    CudaAttentionBias, CudaElement, CudaLayoutShape, CudaRegion, CudaTensor, LlamaCudaShape,
    gpt2_cuda_tensors, llama_cuda_tensors, region_elements,
};
use crate::model::{Bias, Family};

/// Adam's moments the fused AdamW keeps.
const ADAM_STATES: [&str; 2] = ["AdamW exp_avg", "AdamW exp_avg_sq"];

/// The device layout's dimensions for `model` under `settings`.
pub fn cuda_layout_shape(model: &ModelGraph, settings: &Settings) -> CudaLayoutShape {
    let arch = &model.architecture;
    CudaLayoutShape {
        layers: arch.layers,
        hidden: arch.hidden,
        heads: arch.heads,
        vocab: arch.vocab,
        batch: settings.batch.micro_batch,
        seq_len: settings.batch.sequence_length,
        param_tensors: model.tensors.len() as u64,
    }
}

/// The Llama-family dimensions of the device layout, `None` for a model of another family
/// (or a Llama with MLP biases, which the device step has no kernels for).
pub fn llama_cuda_shape(model: &ModelGraph, settings: &Settings) -> Option<LlamaCudaShape> {
    let arch = &model.architecture;
    let attention_bias = match arch.family {
        Family::Llama {
            attention_bias: Bias::Present,
            mlp_bias: Bias::Absent,
        } => CudaAttentionBias::QkvO,
        Family::Llama {
            attention_bias: Bias::Absent,
            mlp_bias: Bias::Absent,
        }
        | Family::Mistral => CudaAttentionBias::Absent,
        Family::Qwen2 => CudaAttentionBias::Qkv,
        _ => return None,
    };
    Some(LlamaCudaShape {
        base: cuda_layout_shape(model, settings),
        kv_heads: arch.kv_heads,
        head_dim: arch.head_dim,
        intermediate: arch.intermediate,
        attention_bias,
        recompute: arena_recompute(settings.checkpointing),
    })
}

/// The step's tensors besides the model states for `model`'s family.
fn step_tensors(model: &ModelGraph, settings: &Settings) -> Vec<CudaTensor> {
    match llama_cuda_shape(model, settings) {
        Some(shape) => llama_cuda_tensors(&shape),
        None => gpt2_cuda_tensors(
            &cuda_layout_shape(model, settings),
            arena_recompute(settings.checkpointing),
        ),
    }
}

/// Every buffer of the device step (see the [module documentation](self)); the model states
/// and the collectives' buffers are one rank's [`CudaShares`].
pub fn cuda_buffers(
    model: &ModelGraph,
    settings: &Settings,
    shares: &CudaShares,
    host: &HostInputs<'_>,
) -> Vec<Buffer> {
    let mut list = BufferList::new();
    let model_dtype = settings.dtypes.params;
    let run = Lifetime::Persistent;
    model_state_buffers(&mut list, model_dtype, shares);
    let mut gpu = |name: &str, kind: BufferKind, dtype: Dtype, numel: u64| {
        list.add(name, kind, dtype, numel, Device::Gpu, run);
    };
    let tensors = step_tensors(model, settings);
    for region in CudaRegion::ALL {
        let elements = region_elements(&tensors, region);
        let kind = match region {
            CudaRegion::Activations | CudaRegion::Stats => BufferKind::ActivationArena,
            CudaRegion::Scratch => BufferKind::WorkingActivations,
            r if r.is_step_scratch() => BufferKind::StepScratch,
            _ => BufferKind::InputActivations,
        };
        let (dtype, numel) = match region.element() {
            CudaElement::Model => (model_dtype, elements),
            CudaElement::F32 => (Dtype::Fp32, elements),
            CudaElement::F64 => (Dtype::Fp64, elements),
            CudaElement::U32 => (Dtype::Uint32, elements),
            CudaElement::I32 => (Dtype::Int32, elements),
            CudaElement::AdamSegment => (
                Dtype::Uint8,
                elements.saturating_mul(CudaElement::AdamSegment.bytes(0)),
            ),
        };
        gpu(region.as_str(), kind, dtype, numel);
    }
    host_buffers(&mut list, host);
    list.into_buffers()
}

/// The model states and the collectives' staging of one rank ([`CudaShares`]; at world size
/// 1: parameters, gradients, the fp32 master of a 16-bit model, AdamW's two moments).
fn model_state_buffers(list: &mut BufferList, model_dtype: Dtype, shares: &CudaShares) {
    let run = Lifetime::Persistent;
    let mut gpu = |name: &str, kind: BufferKind, dtype: Dtype, numel: u64| {
        if numel > 0 {
            list.add(name, kind, dtype, numel, Device::Gpu, run);
        }
    };
    let (params_name, params_kind) = match shares.scheme {
        CudaScheme::Sharded => (
            "stage-3 gathered-parameter arena",
            BufferKind::GatheredParameters,
        ),
        CudaScheme::Replicated | CudaScheme::FlatPartition | CudaScheme::PartitionedGradients => {
            ("parameters", BufferKind::Parameters)
        }
    };
    gpu(params_name, params_kind, model_dtype, shares.params);
    let grads_name = match shares.scheme {
        CudaScheme::PartitionedGradients | CudaScheme::Sharded if shares.grad_partition > 0 => {
            "gradient arena (gradients in flight)"
        }
        _ => "gradients",
    };
    gpu(grads_name, BufferKind::Gradients, model_dtype, shares.grads);
    gpu(
        "fp32 master weights",
        BufferKind::MasterWeights,
        Dtype::Fp32,
        shares.master,
    );
    for state in ADAM_STATES {
        gpu(
            state,
            BufferKind::OptimizerStates,
            Dtype::Fp32,
            shares.optimizer,
        );
    }
    gpu(
        "parameter shard",
        BufferKind::Parameters,
        model_dtype,
        shares.param_shard,
    );
    gpu(
        "gradient partition",
        BufferKind::Gradients,
        model_dtype,
        shares.grad_partition,
    );
    if shares.scheme == CudaScheme::Sharded {
        gpu(
            "reduce-scatter staging",
            BufferKind::ReduceScatterStaging,
            model_dtype,
            shares.bucket,
        );
    } else {
        gpu(
            "gradient bucket staging",
            BufferKind::GradientBuckets,
            model_dtype,
            shares.bucket,
        );
    }
    gpu(
        "all-gather input",
        BufferKind::CollectiveStaging,
        model_dtype,
        shares.gather,
    );
    gpu(
        "all-gather output",
        BufferKind::CollectiveStaging,
        model_dtype,
        shares.gather_out(),
    );
}

/// What the CUDA executor does not run: families other than GPT-2 and Llama, selective
/// recomputation, what [`check_cuda_world`] refuses at world sizes above 1 (offload settings:
/// [`super::cuda_offload::check`]). Each is an error naming it.
pub fn check_cuda_backend(
    model: &ModelGraph,
    settings: &Settings,
    run: &RunPolicy,
    found: &mut Vec<Diagnostic>,
) {
    check_cuda_world(model, settings, run, found);
    let mut refuse = |pointer: &str, what: String| {
        found.push(Diagnostic::error(
            Code::IncompatibleSettings,
            pointer,
            format!("the dsplan-cuda backend plans dsplan's CUDA executor, which does not run {what} yet"),
        ));
    };
    if model.architecture.family != Family::Gpt2 && llama_cuda_shape(model, settings).is_none() {
        refuse(
            "",
            format!(
                "`{}` (GPT-2 and the Llama family without MLP biases only)",
                model.architecture.family.model_type()
            ),
        );
    }
    if settings.checkpointing == crate::memory::Checkpointing::Selective {
        refuse(
            "/activation_checkpointing",
            "selective recomputation of the attention scores (it recomputes whole layers \
             (full activation checkpointing) or nothing)"
                .into(),
        );
    }
}
