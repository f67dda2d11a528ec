//! Model states: parameters, gradients, fp32 master weights, optimizer states and the fp32
//! gradients the optimizer step reads, placed on GPU, host or NVMe as the ZeRO stage and the
//! offload settings put them.
//!
//! Per rank, with `P` parameters, world size `N`, partition `p = ceil(P/N)`, model element size
//! `e`, gradient element size `g`, master element size `m` (4), `k` optimizer states of `o`
//! bytes (Adam: 2 of 4):
//!
//! | stage | parameters | gradients | master + states | fp32 gradients |
//! |---|---|---|---|---|
//! | 0 | `e·P` | `g·P` | `(m + k·o)·P` (bf16: `·p`, BF16_Optimizer) | `4·P` at the step (bf16: resident accumulation buffer) |
//! | 1 | `e·P` | `g·P` until the boundary | `(m + k·o)·p` | `4·p` at the step |
//! | 2 | `e·P` | `g·p` (`grads_in_partition`) | `(m + k·o)·p` | `4·p` at the step |
//! | 3 | `e·p` | `g·p` (flat partition buffer) | `(m + k·o)·p` | `4·min(sub_group, p)` at the step |
//!
//! The first three columns summed are the ZeRO paper's model states (arXiv 1910.02054 §3:
//! `(2 + 2 + 12)·Ψ` unpartitioned, `4Ψ + 12Ψ/N`, `2Ψ + 14Ψ/N`, `16Ψ/N`); the fp32 gradients
//! are what DeepSpeed's estimators add to reach their 18 bytes per parameter.
//!
//! Optimizer offload moves master, states and fp32 gradients to the host (stages 1-2: master
//! always pinned, states pageable, fp32 gradients pinned with `pin_memory`; with gradient
//! accumulation a pinned 16-bit accumulation buffer of `g·p` too) or, at stage 3, to NVMe;
//! ZeRO-3 also moves its 16-bit gradient partition to the host. A partial offload
//! (`ratio` < 1, stage 3) offloads the first `floor(ratio × G)` of the `G` sub-groups.
//! Parameter offload (stage 3) moves the 16-bit partition to the host, or to NVMe beyond
//! `max_in_cpu` elements. Deepspeed-facts §1.7, §4.1-4.7.
//!
//! [`model_state_rows`] is the function a compiled plan's buffer list replaces.

use crate::config::{OffloadDevice, ZeroStage};

use super::context::Context;
use super::rows::{Category, Device, Phase, PhaseBytes, Row, Term, ceil_div, saturate};
use super::setup::Precision;

/// Optimizer-state elements of one rank, split by where they live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptimizerSplit {
    /// Elements whose master, states and fp32 gradients stay on the GPU.
    pub gpu: u128,
    /// Elements offloaded to host memory.
    pub host: u128,
    /// Elements offloaded to NVMe.
    pub nvme: u128,
}

impl OptimizerSplit {
    /// All elements.
    pub fn total(&self) -> u128 {
        self.gpu + self.host + self.nvme
    }
}

/// Elements one rank's optimizer updates: the partition, or all parameters at stage 0
/// (except under bf16, whose BF16_Optimizer partitions master and states like ZeRO-1).
pub fn optimizer_elements(ctx: &Context<'_>) -> u128 {
    let setup = ctx.setup;
    if setup.zero.stage == ZeroStage::Disabled && setup.precision != Precision::Bf16 {
        ctx.params()
    } else {
        ctx.partition()
    }
}

/// Elements of the sub-groups a partial offload puts on the host: the first
/// `floor(ratio × G)` of `G = ceil(p / sub_group_size)` sub-groups (stage 3); everything
/// otherwise.
pub fn offloaded_elements(ctx: &Context<'_>, elements: u128) -> u128 {
    let zero = &ctx.setup.zero;
    let ratio = zero.offload_optimizer.ratio;
    if zero.stage != ZeroStage::Weights || ratio >= 1.0 {
        return elements;
    }
    let sub = u128::from(zero.sub_group_size).max(1);
    let groups = ceil_div(elements, sub);
    // ratio is in [0, 1); the product is below the group count.
    let offloaded_groups = (ratio.max(0.0) * groups as f64).floor() as u128;
    (offloaded_groups * sub).min(elements)
}

/// Where one rank's optimizer elements live.
pub fn optimizer_split(ctx: &Context<'_>) -> OptimizerSplit {
    let elements = optimizer_elements(ctx);
    let zero = &ctx.setup.zero;
    if !zero.optimizer_offloaded() {
        return OptimizerSplit {
            gpu: elements,
            host: 0,
            nvme: 0,
        };
    }
    let away = offloaded_elements(ctx, elements);
    let nvme =
        zero.stage == ZeroStage::Weights && zero.offload_optimizer.device == OffloadDevice::Nvme;
    OptimizerSplit {
        gpu: elements - away,
        host: if nvme { 0 } else { away },
        nvme: if nvme { away } else { 0 },
    }
}

/// The model-state rows.
pub fn model_state_rows(ctx: &Context<'_>) -> Vec<Row> {
    let mut rows = Vec::new();
    parameter_rows(ctx, &mut rows);
    gradient_rows(ctx, &mut rows);
    optimizer_rows(ctx, &mut rows);
    rows
}

fn states(
    ctx: &Context<'_>,
    term: Term,
    device: Device,
    per_rank: PhaseBytes,
    formula: String,
) -> Row {
    ctx.row(term, Category::ModelStates, device, per_rank, formula)
}

fn parameter_rows(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let setup = ctx.setup;
    let e = u128::from(setup.precision.element_bytes());
    let dtype = setup.precision.name();
    if setup.zero.stage != ZeroStage::Weights {
        rows.push(states(
            ctx,
            Term::Parameters,
            Device::Gpu,
            PhaseBytes::resident(saturate(e * ctx.params())),
            format!("{dtype} {e}·P, P = {}", ctx.params()),
        ));
        return;
    }
    let p = ctx.partition();
    let param = &setup.zero.offload_param;
    let formula = |place: &str, elements: u128| {
        format!("{dtype} {e}·{elements}{place} (partition ceil(P/N) = {p})")
    };
    match (setup.zero.params_offloaded(), param.device) {
        (true, OffloadDevice::Cpu) => rows.push(states(
            ctx,
            Term::Parameters,
            Device::host(param.pinning),
            PhaseBytes::resident(saturate(e * p)),
            formula(" in host memory", p),
        )),
        (true, OffloadDevice::Nvme) => {
            let in_cpu = p.min(u128::from(param.max_in_cpu));
            if in_cpu > 0 {
                rows.push(states(
                    ctx,
                    Term::Parameters,
                    Device::CpuPinned,
                    PhaseBytes::resident(saturate(e * in_cpu)),
                    formula(" kept in host memory (max_in_cpu)", in_cpu),
                ));
            }
            rows.push(states(
                ctx,
                Term::Parameters,
                Device::Nvme,
                PhaseBytes::resident(saturate(e * (p - in_cpu))),
                formula(" on NVMe", p - in_cpu),
            ));
        }
        _ => rows.push(states(
            ctx,
            Term::Parameters,
            Device::Gpu,
            PhaseBytes::resident(saturate(e * p)),
            formula("", p),
        )),
    }
}

fn gradient_rows(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let setup = ctx.setup;
    let g = u128::from(setup.grad_bytes);
    let accumulating = setup.gradient_accumulation_steps > 1;
    // Gradients exist from backward to the step; with accumulation they carry over forwards.
    let transient_phases: &[Phase] = if accumulating {
        &Phase::TRAINING
    } else {
        &[Phase::Backward, Phase::Step]
    };
    let stage_1_or_2 = matches!(
        setup.zero.stage,
        ZeroStage::OptimizerStates | ZeroStage::Gradients
    );
    if stage_1_or_2 && setup.zero.optimizer_offloaded() && accumulating {
        // accumulated_grads_in_cpu: pinned 16-bit buffers the micro-steps accumulate into.
        rows.push(states(
            ctx,
            Term::Gradients,
            Device::CpuPinned,
            PhaseBytes::during(&Phase::TRAINING, saturate(g * ctx.partition())),
            format!("{g}·p: host accumulation buffer between micro-steps (optimizer offload)"),
        ));
    }
    match setup.zero.stage {
        ZeroStage::Disabled | ZeroStage::OptimizerStates => rows.push(states(
            ctx,
            Term::Gradients,
            Device::Gpu,
            PhaseBytes::during(transient_phases, saturate(g * ctx.params())),
            format!("{g}·P: every gradient until the accumulation boundary"),
        )),
        ZeroStage::Gradients if !setup.zero.optimizer_offloaded() => rows.push(states(
            ctx,
            Term::Gradients,
            Device::Gpu,
            PhaseBytes::during(transient_phases, saturate(g * ctx.partition())),
            format!("{g}·p: this rank's gradient partition (grads_in_partition)"),
        )),
        ZeroStage::Gradients => {}
        ZeroStage::Weights => {
            let p = ctx.partition();
            let (device, place) = if setup.zero.optimizer_offloaded() {
                (
                    Device::host(setup.zero.offload_optimizer.pinning),
                    " in host memory (optimizer offload)",
                )
            } else {
                (Device::Gpu, "")
            };
            rows.push(states(
                ctx,
                Term::Gradients,
                device,
                PhaseBytes::resident(saturate(g * p)),
                format!("{g}·p: flat gradient-partition buffer{place}"),
            ));
        }
    }
}

fn optimizer_rows(ctx: &Context<'_>, rows: &mut Vec<Row>) {
    let setup = ctx.setup;
    let zero = &setup.zero;
    let split = optimizer_split(ctx);
    let no_master = zero.stage == ZeroStage::Disabled && setup.precision == Precision::Fp32;
    let m = if no_master {
        0
    } else {
        u128::from(setup.master_bytes)
    };
    let k = u128::from(setup.optimizer.states_per_param);
    let o = u128::from(setup.optimizer.state_bytes);
    let optimizer = setup.optimizer.name.as_str();
    let offload_pinning = zero.offload_optimizer.pinning;
    let stage_1_or_2 = matches!(
        zero.stage,
        ZeroStage::OptimizerStates | ZeroStage::Gradients
    );
    // Stage 1-2 offload pins the master always; stage 3 when pin_memory.
    let master_host = if stage_1_or_2 {
        Device::CpuPinned
    } else {
        Device::host(offload_pinning)
    };
    // DeepSpeedCPUAdam creates its states with zeros_like on the host: pageable.
    let places = [
        (split.gpu, Device::Gpu, Device::Gpu),
        (split.host, master_host, Device::CpuPageable),
        (split.nvme, Device::Nvme, Device::Nvme),
    ];
    for (elements, master_device, state_device) in places {
        if elements == 0 {
            continue;
        }
        if m > 0 {
            rows.push(states(
                ctx,
                Term::MasterParameters,
                master_device,
                PhaseBytes::resident(saturate(m * elements)),
                format!("{m}·{elements}"),
            ));
        }
        if k > 0 {
            rows.push(states(
                ctx,
                Term::OptimizerStates,
                state_device,
                PhaseBytes::resident(saturate(k * o * elements)),
                format!("{optimizer}: {k} states x {o} bytes x {elements}"),
            ));
        }
    }
    fp32_gradient_rows(ctx, split, rows);
}

fn fp32_gradient_rows(ctx: &Context<'_>, split: OptimizerSplit, rows: &mut Vec<Row>) {
    let setup = ctx.setup;
    let zero = &setup.zero;
    let f = u128::from(setup.optimizer_grad_bytes);
    let step = [Phase::Step];
    match zero.stage {
        ZeroStage::Disabled => {
            if setup.precision == Precision::Fp32 {
                return;
            }
            let (phases, what): (&[Phase], &str) = if setup.precision == Precision::Bf16 {
                (&Phase::ALL, "BF16_Optimizer's fp32 accumulation buffer")
            } else {
                (&step, "flat fp32 gradients built for the step")
            };
            rows.push(states(
                ctx,
                Term::Fp32Gradients,
                Device::Gpu,
                PhaseBytes::during(phases, saturate(f * ctx.params())),
                format!("{f}·P: {what}"),
            ));
        }
        ZeroStage::OptimizerStates | ZeroStage::Gradients => {
            if split.gpu > 0 {
                rows.push(states(
                    ctx,
                    Term::Fp32Gradients,
                    Device::Gpu,
                    PhaseBytes::during(&step, saturate(f * split.gpu)),
                    format!(
                        "{f}·p: the flat fp32 gradient partition, flattened and cast at the step"
                    ),
                ));
            }
            if split.host > 0 {
                rows.push(states(
                    ctx,
                    Term::Fp32Gradients,
                    Device::host(zero.offload_optimizer.pinning),
                    PhaseBytes::resident(saturate(f * split.host)),
                    format!("{f}·p: host fp32 gradient buffer (optimizer offload)"),
                ));
            }
        }
        ZeroStage::Weights => {
            if split.gpu > 0 {
                let largest_group = split.gpu.min(u128::from(zero.sub_group_size).max(1));
                rows.push(states(
                    ctx,
                    Term::Fp32Gradients,
                    Device::Gpu,
                    PhaseBytes::during(&step, saturate(f * largest_group)),
                    format!("{f}·min(sub_group_size, p on GPU) = {f}·{largest_group}: fp32 gradients of the largest sub-group"),
                ));
            }
            if split.host > 0 {
                rows.push(states(
                    ctx,
                    Term::Fp32Gradients,
                    Device::host(zero.offload_optimizer.pinning),
                    PhaseBytes::resident(saturate(f * split.host)),
                    format!(
                        "{f}·{}: fp32 gradients of the offloaded sub-groups",
                        split.host
                    ),
                ));
            }
            if split.nvme > 0 {
                rows.push(states(
                    ctx,
                    Term::Fp32Gradients,
                    Device::Nvme,
                    PhaseBytes::resident(saturate(f * split.nvme)),
                    format!(
                        "{f}·{}: fp32 gradients swapped with their sub-groups",
                        split.nvme
                    ),
                ));
            }
        }
    }
}

/// The sum of parameters, gradients, master weights and optimizer states in `phase` on
/// `device` (the ZeRO paper's "model states"; fp32 gradients excluded).
pub fn paper_model_states(rows: &[Row], device: Device, phase: Phase) -> u64 {
    rows.iter()
        .filter(|row| row.device == device)
        .filter(|row| {
            matches!(
                row.term,
                Term::Parameters | Term::Gradients | Term::MasterParameters | Term::OptimizerStates
            )
        })
        .map(|row| row.bytes.get(phase))
        .fold(0, u64::saturating_add)
}
