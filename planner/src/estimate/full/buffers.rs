//! Buffers the model states need at run time: gradient reduction buckets, ZeRO-3's gathered
//! parameters, module gradients and persistent parameters, step temporaries, offload staging
//! and NVMe swap buffers (deepspeed-facts §1.7, §4.1-4.7). Per rank, model element size `e`,
//! gradient element size `g`:
//!
//! | term | stages | bytes | when |
//! |---|---|---|---|
//! | reduce bucket(s) | 0-2 | `e·reduce_bucket_size`, ×2 with `overlap_comm` and contiguous gradients (stages 1-2) | backward |
//! | reduce bucket | 3 | `g·reduce_bucket_size` (contiguous gradients) | always |
//! | reduce-scatter staging | 3 | `g·min(reduce_bucket_size, P)`: the interleaved, padded copy | backward |
//! | all-gather bucket | 1-2 | 0: `all_gather_into_tensor` writes into the flat parameter buffer | — |
//! | gathered parameters | 3 | `e·min(P, L + min(prefetch_bucket_size, max_live_parameters))` | forward, backward |
//! | module gradients | 3 | `g·L` (the running module's full gradients) | backward |
//! | persistent parameters | 3 | `e·(small tensors ≤ param_persistence_threshold)` | always |
//! | sub-group fp32 cast | 3 | `4·min(sub_group_size, p on GPU)` | step |
//! | offload staging | 1-2 + offload | `e·largest tensor` on GPU and pinned on the host | backward, step / always |
//! | parameter swap buffers | 3 + NVMe | `e·buffer_count·buffer_size`, pinned | always |
//! | optimizer swap buffers | 3 + NVMe | `4·buffer_count·min(sub_group_size, p)`, pinned | always |
//!
//! `L` is DeepSpeed's largest layer. [`buffer_rows`] is the function a compiled plan's buffer
//! list replaces.

use crate::config::{OffloadDevice, ZeroStage};

use super::context::Context;
use super::rows::{Category, Device, Phase, PhaseBytes, Row, Term, saturate};
use super::states::optimizer_split;

fn buffer(
    ctx: &Context<'_>,
    term: Term,
    device: Device,
    per_rank: PhaseBytes,
    formula: String,
) -> Row {
    ctx.row(term, Category::Buffers, device, per_rank, formula)
}

/// The buffer rows.
pub fn buffer_rows(ctx: &Context<'_>) -> Vec<Row> {
    let mut rows = Vec::new();
    match ctx.setup.zero.stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates | ZeroStage::Gradients => {
            partitioned_gradient_buffers(ctx, &mut rows);
        }
        ZeroStage::Weights => stage3_buffers(ctx, &mut rows),
    }
    swap_buffers(ctx, &mut rows);
    rows
}

fn partitioned_gradient_buffers(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let zero = &ctx.setup.zero;
    let e = u128::from(ctx.setup.precision.element_bytes());
    let bucket = u128::from(zero.reduce_bucket_size);
    let stage_1_or_2 = zero.stage != ZeroStage::Disabled;
    // Offload forces contiguous gradients in stages 1-2.
    let contiguous = zero.contiguous_gradients || zero.optimizer_offloaded();
    let double = stage_1_or_2 && contiguous && zero.overlap_comm;
    let copies = if double { 2 } else { 1 };
    rows.push(buffer(
        ctx,
        Term::ReduceBucket,
        Device::Gpu,
        PhaseBytes::during(&[Phase::Backward], saturate(copies * e * bucket)),
        format!(
            "{e}·reduce_bucket_size {bucket}{}",
            if double {
                " x 2 (overlap_comm double-buffers)"
            } else {
                ""
            }
        ),
    ));
    if stage_1_or_2 {
        rows.push(buffer(
            ctx,
            Term::AllGatherBucket,
            Device::Gpu,
            PhaseBytes::default(),
            format!(
                "0: allgather_bucket_size {} is used only without all_gather_into_tensor",
                zero.allgather_bucket_size
            ),
        ));
    }
    if stage_1_or_2 && zero.optimizer_offloaded() {
        let largest = u128::from(ctx.model.largest_tensor);
        rows.push(buffer(
            ctx,
            Term::OffloadStagingGpu,
            Device::Gpu,
            PhaseBytes::during(&[Phase::Backward, Phase::Step], saturate(e * largest)),
            format!("{e}·largest tensor {largest}"),
        ));
        rows.push(buffer(
            ctx,
            Term::OffloadStagingCpu,
            Device::CpuPinned,
            PhaseBytes::resident(saturate(e * largest)),
            format!("{e}·largest tensor {largest}"),
        ));
    }
}

fn stage3_buffers(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let zero = &ctx.setup.zero;
    let e = u128::from(ctx.setup.precision.element_bytes());
    let g = u128::from(ctx.setup.grad_bytes);
    let params = ctx.params();
    let bucket = u128::from(zero.reduce_bucket_size);
    if zero.contiguous_gradients {
        rows.push(buffer(
            ctx,
            Term::ReduceBucket,
            Device::Gpu,
            PhaseBytes::resident(saturate(g * bucket)),
            format!("{g}·reduce_bucket_size {bucket} (contiguous gradients)"),
        ));
    }
    let staged = bucket.min(params);
    rows.push(buffer(
        ctx,
        Term::ReduceScatterStaging,
        Device::Gpu,
        PhaseBytes::during(&[Phase::Backward], saturate(g * staged)),
        format!("{g}·min(reduce_bucket_size, P) = {g}·{staged}"),
    ));

    let largest = u128::from(ctx.model.largest_layer);
    let window = u128::from(zero.prefetch_bucket_size.min(zero.max_live_parameters));
    let gathered = (largest + window).min(params);
    rows.push(buffer(
        ctx,
        Term::GatheredParameters,
        Device::Gpu,
        PhaseBytes::during(&[Phase::Forward, Phase::Backward], saturate(e * gathered)),
        format!(
            "{e}·min(P, largest layer {largest} + min(prefetch_bucket_size {}, max_live_parameters {}))",
            zero.prefetch_bucket_size, zero.max_live_parameters
        ),
    ));
    rows.push(buffer(
        ctx,
        Term::ModuleGradients,
        Device::Gpu,
        PhaseBytes::during(&[Phase::Backward], saturate(g * largest)),
        format!("{g}·largest layer {largest}"),
    ));

    // zero.Init applies model_persistence_threshold / N (deepspeed-facts §4.6).
    let limit = zero
        .model_persistence_threshold
        .map(|limit| match ctx.setup.zero_init {
            crate::estimate::ZeroInit::Enabled => limit / ctx.hardware.total_gpus(),
            crate::estimate::ZeroInit::Disabled => limit,
        });
    let persistent = u128::from(
        ctx.model
            .persistent_params(zero.param_persistence_threshold, limit),
    );
    rows.push(buffer(
        ctx,
        Term::PersistentParameters,
        Device::Gpu,
        PhaseBytes::resident(saturate(e * persistent)),
        format!(
            "{e}·{persistent} elements in tensors of <= {} elements, kept whole",
            zero.param_persistence_threshold
        ),
    ));

    let split = optimizer_split(ctx);
    if split.gpu > 0 {
        let group = split.gpu.min(u128::from(zero.sub_group_size).max(1));
        rows.push(buffer(
            ctx,
            Term::SubGroupCast,
            Device::Gpu,
            PhaseBytes::during(&[Phase::Step], saturate(4 * group)),
            format!("4·min(sub_group_size, p on GPU) = 4·{group}"),
        ));
    }
}

fn swap_buffers(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let zero = &ctx.setup.zero;
    if zero.stage != ZeroStage::Weights {
        return;
    }
    let e = u128::from(ctx.setup.precision.element_bytes());
    if zero.params_offloaded() && zero.offload_param.device == OffloadDevice::Nvme {
        let count = u128::from(zero.offload_param.buffer_count);
        let size = u128::from(zero.offload_param.buffer_size);
        rows.push(buffer(
            ctx,
            Term::ParamSwapBuffers,
            Device::CpuPinned,
            PhaseBytes::resident(saturate(e * count * size)),
            format!("{e}·buffer_count {count} x buffer_size {size}"),
        ));
    }
    let split = optimizer_split(ctx);
    if split.nvme > 0 {
        let count = u128::from(zero.offload_optimizer.buffer_count);
        let group = split.nvme.min(u128::from(zero.sub_group_size).max(1));
        rows.push(buffer(
            ctx,
            Term::OptimizerSwapBuffers,
            Device::CpuPinned,
            PhaseBytes::resident(saturate(4 * count * group)),
            format!("4·buffer_count {count} x largest sub-group {group}"),
        ));
    }
}
