//! The estimate's model-state, buffer and activation rows, read from a compiled plan's buffer
//! list and timeline: one row per term and device, its bytes in each phase those of its
//! buffers live at the moment that phase peaks.
//!
//! | estimate phase | moment of the plan |
//! |---|---|
//! | init | before the first step: the buffers allocated for the whole run |
//! | forward | the forward tick where the device peaks |
//! | backward | the backward or backward-epilogue tick where the device peaks |
//! | step | the optimizer-step or parameter-gather tick where the device peaks |
//!
//! So each phase's total of these rows is, byte for byte, the plan's peak of that phase
//! (host memory per node: the plan's per-rank bytes times the ranks of a node).

use crate::plan::{self, Buffer, BufferClass, BufferKind, Lifetime, Plan};

use super::context::Context;
use super::rows::{Category, Device, Phase, PhaseBytes, Pinning, Row, Term};

/// The plan's tick standing for each estimate phase on `device` (`None`: init, the run's
/// persistent buffers; or a phase the plan has no tick of).
pub fn phase_ticks(plan: &Plan, device: plan::Device) -> [Option<usize>; 4] {
    let mut ticks = [None; 4];
    let Some(timeline) = plan.timeline.device(device) else {
        return ticks;
    };
    let mut best: [Option<(u64, usize)>; 4] = [None; 4];
    for peak in &timeline.phases {
        let index = phase_index(estimate_phase(peak.phase));
        if best[index].is_none_or(|(bytes, _)| peak.bytes > bytes) {
            best[index] = Some((peak.bytes, peak.tick));
        }
    }
    for (slot, found) in ticks.iter_mut().zip(best) {
        *slot = found.map(|(_, tick)| tick);
    }
    ticks
}

/// The estimate phase a plan phase belongs to.
fn estimate_phase(phase: plan::Phase) -> Phase {
    match phase {
        plan::Phase::Forward => Phase::Forward,
        plan::Phase::Backward | plan::Phase::ReduceEpilogue => Phase::Backward,
        plan::Phase::OptimizerStep | plan::Phase::ParamGather => Phase::Step,
    }
}

fn phase_index(phase: Phase) -> usize {
    match phase {
        Phase::Init => 0,
        Phase::Forward => 1,
        Phase::Backward => 2,
        Phase::Step => 3,
    }
}

/// Bytes of `buffer` in each phase, given the device's phase ticks.
pub fn buffer_phase_bytes(buffer: &Buffer, ticks: &[Option<usize>; 4]) -> PhaseBytes {
    let mut bytes = PhaseBytes::default();
    for phase in Phase::ALL {
        let live = match (phase, ticks[phase_index(phase)]) {
            (Phase::Init, _) => buffer.lifetime == Lifetime::Persistent,
            (_, Some(tick)) => buffer.lifetime.live_at(tick),
            (_, None) => false,
        };
        if live {
            bytes.set(phase, buffer.bytes);
        }
    }
    bytes
}

/// The estimate's term for a plan buffer.
fn term(buffer: &Buffer) -> Term {
    match buffer.kind {
        BufferKind::Parameters => Term::Parameters,
        BufferKind::Gradients => Term::Gradients,
        BufferKind::Fp32Gradients => Term::Fp32Gradients,
        BufferKind::MasterWeights => Term::MasterParameters,
        BufferKind::OptimizerStates => Term::OptimizerStates,
        BufferKind::PersistentParameters => Term::PersistentParameters,
        BufferKind::GatheredParameters => Term::GatheredParameters,
        BufferKind::ModuleGradients => Term::ModuleGradients,
        BufferKind::GradientBuckets => Term::ReduceBucket,
        BufferKind::ReduceScatterStaging => Term::ReduceScatterStaging,
        BufferKind::StepScratch => Term::SubGroupCast,
        BufferKind::OffloadStaging if buffer.device == plan::Device::Gpu => Term::OffloadStagingGpu,
        BufferKind::OffloadStaging => Term::OffloadStagingCpu,
        BufferKind::ParamSwapBuffers => Term::ParamSwapBuffers,
        BufferKind::OptimizerSwapBuffers => Term::OptimizerSwapBuffers,
        BufferKind::InputActivations => Term::EmbeddingActivations,
        BufferKind::LayerActivations => Term::LayerActivations,
        BufferKind::WorkingActivations => Term::LayerWorkingSet,
        BufferKind::Logits => Term::Logits,
        BufferKind::LossBuffers => Term::LossBuffers,
        // Only `dsplan-cpu` plans list these; the estimate compiles DeepSpeed GPU plans.
        BufferKind::CollectiveStaging => Term::ReduceBucket,
        BufferKind::ActivationArena => Term::LayerActivations,
    }
}

fn category(kind: BufferKind) -> Category {
    match kind.class() {
        BufferClass::ModelStates => Category::ModelStates,
        BufferClass::Buffers => Category::Buffers,
        BufferClass::Activations => Category::Activations,
    }
}

/// The estimate's device for a plan buffer.
fn device(buffer: &Buffer) -> Device {
    match buffer.device {
        plan::Device::Gpu => Device::Gpu,
        plan::Device::Nvme => Device::Nvme,
        plan::Device::Cpu => Device::host(buffer.pinning.unwrap_or(Pinning::Pageable)),
    }
}

/// One row being summed.
struct Group {
    term: Term,
    category: Category,
    device: Device,
    bytes: PhaseBytes,
    buffers: Vec<usize>,
}

/// The rows of every buffer of `plan`, one per term and device, in term order.
pub fn plan_rows(plan: &Plan, ctx: &Context<'_>) -> Vec<Row> {
    let ticks_of = |device: plan::Device| phase_ticks(plan, device);
    let device_ticks = [
        ticks_of(plan::Device::Gpu),
        ticks_of(plan::Device::Cpu),
        ticks_of(plan::Device::Nvme),
    ];
    let mut groups: Vec<Group> = Vec::new();
    for (index, buffer) in plan.buffers.iter().enumerate() {
        let ticks = match buffer.device {
            plan::Device::Gpu => &device_ticks[0],
            plan::Device::Cpu => &device_ticks[1],
            plan::Device::Nvme => &device_ticks[2],
        };
        let bytes = buffer_phase_bytes(buffer, ticks);
        let (term, device) = (term(buffer), device(buffer));
        match groups
            .iter_mut()
            .find(|g| g.term == term && g.device == device)
        {
            Some(group) => {
                group.bytes = group.bytes.plus(bytes);
                group.buffers.push(index);
            }
            None => groups.push(Group {
                term,
                category: category(buffer.kind),
                device,
                bytes,
                buffers: vec![index],
            }),
        }
    }
    groups.sort_by_key(|g| (g.term, g.device));
    groups
        .into_iter()
        .map(|group| {
            let formula = formula(plan, &group.buffers);
            ctx.row(
                group.term,
                group.category,
                group.device,
                group.bytes,
                formula,
            )
        })
        .collect()
}

/// How many buffers, of what, and the first names.
fn formula(plan: &Plan, indices: &[usize]) -> String {
    const NAMED: usize = 3;
    let buffers: Vec<&Buffer> = indices.iter().map(|&i| &plan.buffers[i]).collect();
    let elements: u64 = buffers.iter().map(|b| b.numel).sum();
    let mut dtypes: Vec<&str> = buffers.iter().map(|b| b.dtype.as_str()).collect();
    dtypes.sort_unstable();
    dtypes.dedup();
    let dtype = if dtypes.len() == 1 {
        dtypes[0].to_owned()
    } else {
        "mixed".to_owned()
    };
    let names: Vec<&str> = buffers
        .iter()
        .take(NAMED)
        .map(|b| b.name.as_str())
        .collect();
    let more = buffers.len().saturating_sub(NAMED);
    let tail = if more > 0 {
        format!(", ... ({more} more)")
    } else {
        String::new()
    };
    if buffers.len() == 1 {
        format!("{}: {elements} x {dtype}", names.join(""))
    } else {
        format!(
            "{} plan buffers, {elements} x {dtype} in all: {}{tail}",
            buffers.len(),
            names.join(", ")
        )
    }
}
