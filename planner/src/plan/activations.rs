//! Activation buffers: the sizes of [`crate::memory::activations`] placed in time.
//!
//! A transformer block is the run of fetch units with the same layer number. For each block:
//! what it stores for backward, from its first unit's forward to the end of its backward (its
//! first unit's backward), on the GPU, or in pinned host memory for full checkpointing with
//! `cpu_checkpointing`; what its backward recomputes, during its backward. The running layer's
//! working set (twice the largest intermediate) lives through forward and backward. The input
//! ends: token ids and labels for the whole micro-step, the embedding dropout mask around the
//! embedding, the final norm's input around the final norm, the head's input, the logits and
//! the saved log-softmax around the LM head, with the model-dtype logits and the loss's fp32
//! upcast at the head's forward only, and the NLL's and the log-softmax's gradients at its
//! backward. T5's last `decoder_layers` blocks carry a
//! cross-attention too. Each size is split by element type (model dtype, fp32, 1-byte masks).

use super::buffers::{BufferKind, BufferList, Lifetime, span};
use super::dtype::{Device, Dtype};
use super::model_graph::{ModelGraph, UnitKind};
use super::settings::{CheckpointPlacement, Checkpointing, Pinning, Settings};
use super::ticks::Ticks;
use crate::memory::{self, LayerBytes, TypedBytes};

/// Elements of `dtype` in `bytes` (saturating; the shape bounds keep them exact).
fn elements(bytes: u128, dtype: Dtype) -> u64 {
    u64::try_from(bytes / u128::from(dtype.bytes())).unwrap_or(u64::MAX)
}

/// Adds `bytes` as up to three buffers: model dtype, fp32, 1-byte masks (named `name()` and
/// a suffix, formatted only for the buffers added to a list that keeps names).
fn add_typed(
    list: &mut BufferList,
    name: impl Fn() -> String,
    kind: BufferKind,
    bytes: TypedBytes,
    model_dtype: Dtype,
    device: Device,
    lifetime: Lifetime,
) {
    let parts = [
        (bytes.model, model_dtype, ""),
        (bytes.fp32, Dtype::Fp32, " (fp32)"),
        (bytes.mask, Dtype::Uint8, " (dropout masks)"),
    ];
    for (part, dtype, suffix) in parts {
        list.add_named(
            || {
                let mut full = name();
                full.push_str(suffix);
                full
            },
            kind,
            dtype,
            elements(part, dtype),
            device,
            lifetime,
        );
        list.pinned(Pinning::Pinned);
    }
}

/// The transformer blocks: (layer number, first unit, last unit), in forward order.
fn blocks(model: &ModelGraph) -> Vec<(u64, usize, usize)> {
    let mut blocks: Vec<(u64, usize, usize)> = Vec::new();
    for (index, unit) in model.units.iter().enumerate() {
        if let Some(layer) = unit.layer {
            match blocks.last_mut() {
                Some((l, _, last)) if *l == layer => *last = index,
                _ => blocks.push((layer, index, index)),
            }
        }
    }
    blocks
}

/// Every activation buffer of one micro-step.
pub fn activation_buffers(
    model: &ModelGraph,
    settings: &Settings,
    ticks: &Ticks,
    list: &mut BufferList,
) {
    let units = ticks.units;
    if units == 0 {
        return;
    }
    let dims = memory::layer_dims(&model.architecture);
    let shape = settings.training_shape();
    let precision = settings.precision;
    let dtype = settings.dtypes.params;
    let forward = |unit: usize| ticks.trace(unit);
    let backward = |unit: usize| ticks.trace(2 * units - 1 - unit);
    let whole_step = span(forward(0), backward(0));

    let blocks = blocks(model);
    let plain = memory::layer_bytes(&shape, precision, &dims, shape.attention);
    let cross = plain.plus(memory::cross_attention_bytes(&shape, precision, &dims));
    let checkpoint = memory::checkpoint_bytes(&shape, precision, &dims);
    let crossed = usize::try_from(dims.cross_attention_layers).unwrap_or(usize::MAX);
    let first_cross = blocks.len().saturating_sub(crossed);
    let on_host = settings.checkpointing == Checkpointing::Full
        && settings.checkpoint_placement == CheckpointPlacement::Cpu;
    let stored_device = if on_host { Device::Cpu } else { Device::Gpu };
    for (index, &(layer, first, last)) in blocks.iter().enumerate() {
        let bytes: LayerBytes = if index >= first_cross { cross } else { plain };
        let stored_name = || match settings.checkpointing {
            Checkpointing::Full => format!("block {layer} checkpoint (input)"),
            _ => format!("block {layer} stored activations"),
        };
        add_typed(
            list,
            stored_name,
            BufferKind::LayerActivations,
            bytes.stored(settings.checkpointing, checkpoint),
            dtype,
            stored_device,
            span(forward(first), backward(first)),
        );
        add_typed(
            list,
            || format!("block {layer} recomputed activations"),
            BufferKind::WorkingActivations,
            bytes.recomputed(settings.checkpointing),
            dtype,
            Device::Gpu,
            span(backward(last), backward(first)),
        );
    }
    list.add(
        "layer working set (2 x largest intermediate)",
        BufferKind::WorkingActivations,
        dtype,
        elements(
            2 * memory::largest_intermediate(&shape, precision, &dims),
            dtype,
        ),
        Device::Gpu,
        whole_step,
    );

    let first_block = blocks.first().map_or(units, |&(_, first, _)| first);
    let last_block = blocks.last().map_or(0, |&(_, _, last)| last);
    let head = model
        .units
        .iter()
        .position(|u| u.kind == UnitKind::LmHead)
        .unwrap_or(units - 1);
    let embedding = model.units[..first_block.min(units)]
        .iter()
        .rposition(|u| u.kind == UnitKind::Embedding)
        .unwrap_or(0);
    let final_norm = model
        .units
        .iter()
        .enumerate()
        .skip(last_block)
        .filter(|(_, u)| u.kind == UnitKind::Norm && u.layer.is_none())
        .map(|(index, _)| index)
        .next_back()
        .unwrap_or(head);
    let ends = memory::input_ends(&shape, precision, &dims);
    list.add(
        "token ids and labels",
        BufferKind::InputActivations,
        Dtype::Int64,
        elements(ends.ids_and_labels, Dtype::Int64),
        Device::Gpu,
        whole_step,
    );
    list.add(
        "embedding dropout mask",
        BufferKind::InputActivations,
        Dtype::Uint8,
        elements(ends.embedding_mask, Dtype::Uint8),
        Device::Gpu,
        span(forward(embedding), backward(embedding)),
    );
    add_typed(
        list,
        || "final norm input".to_owned(),
        BufferKind::InputActivations,
        ends.final_norm_input,
        dtype,
        Device::Gpu,
        span(forward(final_norm), backward(final_norm)),
    );
    list.add(
        "LM head input",
        BufferKind::InputActivations,
        dtype,
        elements(ends.head_input, dtype),
        Device::Gpu,
        span(forward(head), backward(head)),
    );

    let loss = memory::loss_bytes(&shape, precision, &dims);
    list.add(
        "logits",
        BufferKind::Logits,
        dtype,
        elements(loss.logits, dtype),
        Device::Gpu,
        span(forward(head), forward(head)),
    );
    list.add(
        "fp32 logits (loss upcast)",
        BufferKind::LossBuffers,
        Dtype::Fp32,
        elements(loss.upcast, Dtype::Fp32),
        Device::Gpu,
        span(forward(head), forward(head)),
    );
    list.add(
        "log-softmax output",
        BufferKind::LossBuffers,
        Dtype::Fp32,
        elements(loss.log_softmax, Dtype::Fp32),
        Device::Gpu,
        span(forward(head), backward(head)),
    );
    list.add(
        "NLL gradient (into the log-softmax)",
        BufferKind::LossBuffers,
        Dtype::Fp32,
        elements(loss.log_softmax_output_grad, Dtype::Fp32),
        Device::Gpu,
        span(backward(head), backward(head)),
    );
    list.add(
        "log-softmax gradient",
        BufferKind::LossBuffers,
        Dtype::Fp32,
        elements(loss.log_softmax_grad, Dtype::Fp32),
        Device::Gpu,
        span(backward(head), backward(head)),
    );
}
