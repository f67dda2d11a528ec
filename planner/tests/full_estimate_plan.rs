//! The full estimate and the plan are one source of truth: for configs across ZeRO stages 0-3,
//! with and without `overlap_comm`, with CPU and NVMe offload, the estimate's model-state,
//! buffer and activation rows of each phase are, byte for byte, the plan's buffers live at the
//! tick where that phase peaks (host rows: per rank times the ranks of a node), and its rows
//! hold what DeepSpeed allocates (flat buffer padded to 2N, IPG buckets doubled by
//! `overlap_comm` in stages 1-2, bf16 without ZeRO's whole master on every rank).

use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::plan_rows::phase_ticks;
use dsplan_planner::estimate::full::{
    AttentionKernel, Category, Checkpointing, Device, FullEstimate, Margins, Overrides, Phase, Row,
    Term, TrainingShape, compile_plan, estimate_reading, read_config,
};
use dsplan_planner::model::{LmHead, load, presets};
use dsplan_planner::plan::timeline::breakdown;
use dsplan_planner::plan::{self, BufferClass, Lifetime, Plan};
use serde_json::{Value, json};

const RANKS: u64 = 4;

fn configs() -> Vec<(&'static str, Value)> {
    let zero = |section: Value| {
        json!({
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 2,
            "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW"},
            "zero_optimization": section,
        })
    };
    vec![
        ("stage 0 bf16", zero(json!({"stage": 0}))),
        (
            "stage 0 fp16",
            json!({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
                   "zero_optimization": {"stage": 0}}),
        ),
        (
            "stage 1, overlap",
            zero(json!({"stage": 1, "overlap_comm": true, "reduce_bucket_size": 20_000_000})),
        ),
        (
            "stage 1, no overlap",
            zero(json!({"stage": 1, "overlap_comm": false, "reduce_bucket_size": 20_000_000})),
        ),
        (
            "stage 2, overlap",
            zero(json!({"stage": 2, "overlap_comm": true, "reduce_bucket_size": 20_000_000})),
        ),
        (
            "stage 2, no overlap, not contiguous",
            zero(json!({"stage": 2, "overlap_comm": false, "contiguous_gradients": false})),
        ),
        (
            "stage 2, cpu offload",
            zero(json!({"stage": 2, "overlap_comm": true,
                        "offload_optimizer": {"device": "cpu", "pin_memory": true}})),
        ),
        (
            "stage 3",
            zero(json!({"stage": 3, "reduce_bucket_size": 10_000_000,
                        "stage3_prefetch_bucket_size": 5_000_000})),
        ),
        (
            "stage 3, no overlap",
            zero(json!({"stage": 3, "overlap_comm": false})),
        ),
        (
            "stage 3, cpu offload of optimizer and parameters",
            zero(
                json!({"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": false},
                        "offload_param": {"device": "cpu"}}),
            ),
        ),
        (
            "stage 3, nvme offload, half the sub-groups",
            zero(json!({"stage": 3, "sub_group_size": 20_000_000,
                        "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme", "ratio": 0.5},
                        "offload_param": {"device": "nvme", "nvme_path": "/nvme"}})),
        ),
    ]
}

struct Case {
    name: &'static str,
    plan: Plan,
    estimate: FullEstimate,
}

fn cases() -> Vec<Case> {
    let preset = presets::lookup("gpt2").expect("preset");
    let model = load::from_preset(preset, LmHead::Include).expect("counts");
    let hardware = Topology::new(RANKS, 1).expect("valid");
    configs()
        .into_iter()
        .map(|(name, document)| {
            let reading = read_config(&document, hardware, Some(768), &Overrides::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let shape = TrainingShape {
                seq_len: 512,
                micro_batch: reading.micro_batch,
                checkpointing: Checkpointing::Selective,
                checkpoint_placement: reading.checkpoint_placement,
                attention: AttentionKernel::Eager,
            };
            let estimate =
                estimate_reading(&model, hardware, &reading, &shape, &Margins::default())
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            let plan = compile_plan(&model, hardware, &reading.setup, &shape, &reading.config)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            Case {
                name,
                plan,
                estimate,
            }
        })
        .collect()
}

fn phase_index(phase: Phase) -> usize {
    Phase::ALL
        .iter()
        .position(|&p| p == phase)
        .expect("a phase")
}

/// The plan's bytes on `device` at the tick standing for `phase`, by class.
fn plan_bytes(plan: &Plan, device: plan::Device, phase: Phase, class: BufferClass) -> u64 {
    let on_device = plan.buffers.iter().filter(|b| b.device == device);
    match phase_ticks(plan, device)[phase_index(phase)] {
        None if phase == Phase::Init => on_device
            .filter(|b| b.lifetime == Lifetime::Persistent && b.kind.class() == class)
            .map(|b| b.bytes)
            .sum(),
        None => 0,
        Some(tick) => breakdown(&plan.buffers, device, tick)
            .iter()
            .filter(|part| part.kind.class() == class)
            .map(|part| part.bytes)
            .sum(),
    }
}

fn estimate_bytes(
    rows: &[Row],
    keep: impl Fn(Device) -> bool,
    phase: Phase,
    category: Category,
) -> u64 {
    rows.iter()
        .filter(|row| keep(row.device) && row.category == category)
        .map(|row| row.bytes.get(phase))
        .sum()
}

fn term_bytes(estimate: &FullEstimate, term: Term, phase: Phase) -> u64 {
    estimate
        .rows
        .iter()
        .filter(|row| row.term == term && row.device == Device::Gpu)
        .map(|row| row.bytes.get(phase))
        .sum()
}

#[test]
fn every_phase_of_the_estimate_is_the_plans_peak_composition() {
    for case in cases() {
        let (plan, rows) = (&case.plan, &case.estimate.rows);
        for phase in Phase::ALL {
            for (class, category) in [
                (BufferClass::ModelStates, Category::ModelStates),
                (BufferClass::Buffers, Category::Buffers),
                (BufferClass::Activations, Category::Activations),
            ] {
                let gpu = plan_bytes(plan, plan::Device::Gpu, phase, class);
                let host = plan_bytes(plan, plan::Device::Cpu, phase, class);
                let nvme = plan_bytes(plan, plan::Device::Nvme, phase, class);
                let what = format!("{}: {category:?} in {phase:?}", case.name);
                assert_eq!(
                    estimate_bytes(rows, |d| d == Device::Gpu, phase, category),
                    gpu,
                    "GPU {what}"
                );
                assert_eq!(
                    estimate_bytes(rows, Device::is_cpu, phase, category),
                    host * RANKS,
                    "host {what}"
                );
                assert_eq!(
                    estimate_bytes(rows, |d| d == Device::Nvme, phase, category),
                    nvme * RANKS,
                    "NVMe {what}"
                );
            }
        }
        // Without the margins, the estimate's GPU peak is the plan's.
        let planned_peak = Phase::ALL
            .iter()
            .map(|&phase| {
                rows.iter()
                    .filter(|r| r.device == Device::Gpu && r.category != Category::Overhead)
                    .map(|r| r.bytes.get(phase))
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(0);
        assert_eq!(
            planned_peak,
            plan.timeline.peak_bytes(plan::Device::Gpu),
            "{}",
            case.name
        );
    }
}

#[test]
fn the_rows_hold_what_deepspeed_allocates() {
    let params: u64 = 124_439_808;
    for case in cases() {
        let estimate = &case.estimate;
        let stage = case.plan.settings.stage.number();
        let e = 2;
        let bucket = case.plan.settings.reduce_bucket_size;
        let ipg = term_bytes(estimate, Term::ReduceBucket, Phase::Backward);
        match (stage, case.name) {
            (0, _) => {
                // One flattened all-reduce bucket of the whole model (under 5e8 elements), live
                // in the backward epilogue only.
                let flattened: u64 = case
                    .plan
                    .buffers
                    .iter()
                    .filter(|b| b.kind == dsplan_planner::plan::BufferKind::GradientBuckets)
                    .map(|b| b.bytes)
                    .sum();
                assert_eq!(flattened, e * params, "{}", case.name);
            }
            (1 | 2, name) => {
                // Allocated at the first gradient hook, after the loss's backward: not live at
                // the head's backward tick (where the fp32 loss buffers are), live from the
                // next tick to the epilogue; in the backward row when its peak is past the head.
                let ipg_buffers: Vec<_> = case
                    .plan
                    .buffers
                    .iter()
                    .filter(|b| b.name.starts_with("IPG bucket"))
                    .collect();
                let count = if name.contains("not contiguous") {
                    0
                } else if name.contains("no overlap") {
                    1
                } else {
                    2 // overlap_comm doubles
                };
                assert_eq!(ipg_buffers.len(), count, "{name}");
                assert!(
                    ipg == 0 || ipg == count as u64 * e * bucket,
                    "{name}: {ipg}"
                );
                let ticks = &case.plan.ticks;
                for buffer in ipg_buffers {
                    assert_eq!(buffer.bytes, e * bucket, "{name}");
                    assert!(!buffer.lifetime.live_at(ticks.first_backward()), "{name}");
                    assert!(buffer.lifetime.live_at(ticks.first_gradient()), "{name}");
                    assert!(buffer.lifetime.live_at(ticks.epilogue()), "{name}");
                }
            }
            (_, name) => assert_eq!(ipg, e * bucket, "{name}: stage 3 has one IPG buffer"),
        }
        if stage == 3 {
            assert_eq!(
                term_bytes(estimate, Term::ReduceBucket, Phase::Init),
                e * bucket,
                "{}: allocated at initialisation",
                case.name
            );
            assert!(term_bytes(estimate, Term::GatheredParameters, Phase::Forward) > 0);
        }
        let padded = params.div_ceil(2 * RANKS) * 2 * RANKS;
        if stage == 1 || stage == 2 {
            assert_eq!(
                term_bytes(estimate, Term::Parameters, Phase::Init),
                e * padded,
                "{}: the flat buffer is padded to 2N",
                case.name
            );
        }
        if case.name == "stage 0 bf16" {
            // `FP16_Optimizer` over bf16 (DeepSpeed 0.19.8's `DDP_BFLOAT16`): the fp32 master
            // whole on every rank; no persistent fp32 gradients (it accumulates in bf16): fp32
            // gradients of the whole model for the step only.
            assert_eq!(
                term_bytes(estimate, Term::MasterParameters, Phase::Init),
                4 * params
            );
            assert_eq!(term_bytes(estimate, Term::Fp32Gradients, Phase::Init), 0);
            assert_eq!(
                term_bytes(estimate, Term::Fp32Gradients, Phase::Backward),
                0
            );
            assert_eq!(
                term_bytes(estimate, Term::Fp32Gradients, Phase::Step),
                4 * params
            );
        }
        if stage > 0 && !case.name.contains("offload") {
            // Optimizer states appear at the first step, not at initialisation.
            assert_eq!(
                term_bytes(estimate, Term::OptimizerStates, Phase::Init),
                0,
                "{}",
                case.name
            );
            assert!(term_bytes(estimate, Term::OptimizerStates, Phase::Step) > 0);
        }
    }
}
