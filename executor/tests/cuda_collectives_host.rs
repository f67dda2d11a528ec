//! The CUDA step of one rank among `W > 1`, checked on the host (no GPU): its device buffers
//! equal the `dsplan-cuda` plan's to the byte, and its collectives (kind, bytes, stream,
//! position in the step) are the plan's op graph's, at W = 2, 4 and 8 and ZeRO stages 1-3.
//! A plan field changed (the bucket size) changes the sequence. Prints the collectives per
//! step with `--nocapture`.

use dsplan_executor::cuda::train::program::{CollectiveRecord, CommStream, Purpose};
use dsplan_executor::cuda::train::{DeviceLayout, StepProgram, world_program};
use dsplan_executor::metrics::{Category, PlanMemory};
use dsplan_executor::model::{BatchShape, Gpt2Config, Recompute};
use dsplan_executor::train::{TrainSettings, compile_cuda_plan};
use dsplan_kernels::Dtype;
use dsplan_planner::plan::graph::OpKind;
use dsplan_planner::plan::{Collective, Plan, Stream};
use serde_json::json;

#[path = "support/models.rs"]
mod models;
use models::{gpt2, small_head_64};

const WORLDS: [usize; 3] = [2, 4, 8];

fn config(stage: u8, dtype: Dtype, grad_accum: u64) -> serde_json::Value {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage},
    });
    match dtype {
        Dtype::Bf16 => config["bf16"] = json!({"enabled": true}),
        Dtype::F16 => config["fp16"] = json!({"enabled": true}),
        Dtype::F32 | Dtype::F64 => {}
    }
    config
}

fn plan_for(config: &serde_json::Value, model: Gpt2Config, seq_len: usize, world: usize) -> Plan {
    let settings = TrainSettings::from_config(config, world).expect("settings");
    compile_cuda_plan(&settings, &model.into(), seq_len, world).expect("plan")
}

fn rank_layout(
    plan: &Plan,
    model: Gpt2Config,
    seq_len: usize,
    dtype: Dtype,
    rank: usize,
) -> DeviceLayout {
    DeviceLayout::for_plan_rank(
        model,
        BatchShape { batch: 2, seq_len },
        dtype,
        Recompute::Nothing,
        plan,
        rank,
    )
    .expect("the plan's layout")
}

/// Every rank's device buffers, per category and in total, equal the plan's to the byte:
/// gpt2 124M in bf16 and the head-size-64 model in bf16 and fp32, W = 2, 4, 8, stages 0-3.
#[test]
fn every_ranks_buffers_equal_the_plan_to_the_byte() {
    let cases = [
        (gpt2(), 1024, Dtype::Bf16),
        (small_head_64(), 64, Dtype::Bf16),
        (small_head_64(), 64, Dtype::F32),
    ];
    for (model, seq_len, dtype) in cases {
        for world in WORLDS {
            for stage in 0..=3u8 {
                let plan = plan_for(&config(stage, dtype, 1), model, seq_len, world);
                let predicted = PlanMemory::of(&plan);
                for rank in [0, world - 1] {
                    let layout = rank_layout(&plan, model, seq_len, dtype, rank);
                    let ours = layout.bytes_by_category();
                    for category in Category::ALL {
                        assert_eq!(
                            ours.get(category),
                            predicted.peak.get(category),
                            "C={} {dtype} W={world} stage {stage} rank {rank} {category:?}",
                            model.n_embd
                        );
                    }
                    assert_eq!(
                        ours.total(),
                        predicted.peak_total,
                        "W={world} stage {stage}"
                    );
                }
                if world == 8 && model.n_embd == 768 {
                    eprintln!(
                        "gpt2 {dtype} W={world} stage {stage}: {:.1} MB per rank",
                        predicted.peak_total as f64 / 1e6
                    );
                }
            }
        }
    }
}

/// bf16 without ZeRO is DeepSpeed's `FP16_Optimizer` over bf16: every rank holds the whole
/// fp32 master and both Adam states, as under fp16, and no parameter gather follows the step.
#[test]
fn bf16_without_zero_on_several_gpus_keeps_the_states_whole() {
    let model = small_head_64();
    let whole = |dtype| {
        let settings = TrainSettings::from_config(&config(0, dtype, 1), 2).expect("settings");
        let plan = compile_cuda_plan(&settings, &model.into(), 64, 2).expect("planned");
        assert!(
            plan.buckets.param_gather.is_none(),
            "no gather after the step"
        );
        PlanMemory::of(&plan).peak
    };
    let (bf16, fp16) = (whole(Dtype::Bf16), whole(Dtype::F16));
    for category in [Category::Master, Category::Optimizer] {
        assert_eq!(bf16.get(category), fp16.get(category), "{category:?}");
        assert!(bf16.get(category) > 0, "{category:?}");
    }
}

/// The plan's collectives in issue order: kind, bytes, stream (the plan's gradient-reduce and
/// parameter-gather streams are the device's communication stream), and position (forward,
/// backward and optimizer ops issued before it).
fn planned_sequence(plan: &Plan) -> Vec<(Collective, u64, CommStream, usize)> {
    let graph = plan.graph.as_ref().expect("the op graph");
    let mut position = 0;
    let mut sequence = Vec::new();
    for op in &graph.ops {
        match op.kind {
            OpKind::Forward | OpKind::Backward | OpKind::OptimizerStep => position += 1,
            OpKind::Communication { collective } => {
                let stream = match op.stream {
                    Stream::Compute => CommStream::Compute,
                    Stream::GradReduce | Stream::ParamGather => CommStream::Comm,
                    other => panic!("a collective on {other:?}"),
                };
                sequence.push((collective, op.bytes, stream, position));
            }
            OpKind::Copy | OpKind::Swap => {}
        }
    }
    sequence
}

/// The program's collectives that carry out a plan item (not the two step scalars).
fn program_sequence(
    program: &StepProgram,
    layout: &DeviceLayout,
    grad_accum: usize,
) -> Vec<CollectiveRecord> {
    dsplan_executor::cuda::train::program::collective_sequence(
        program.ops(grad_accum),
        layout.dtype(),
    )
    .into_iter()
    .filter(|r| r.purpose != Purpose::StepScalars)
    .collect()
}

fn comparable(records: &[CollectiveRecord]) -> Vec<(Collective, u64, CommStream, usize)> {
    records
        .iter()
        .map(|r| (r.kind, r.bytes, r.stream, r.position))
        .collect()
}

fn counts(records: &[CollectiveRecord]) -> String {
    let count = |kind: Collective| records.iter().filter(|r| r.kind == kind).count();
    let bytes: u64 = records.iter().map(|r| r.bytes).sum();
    format!(
        "{} all-reduce, {} reduce-scatter, {} all-gather; {:.1} MB",
        count(Collective::AllReduce),
        count(Collective::ReduceScatter),
        count(Collective::AllGather),
        bytes as f64 / 1e6
    )
}

/// DeepSpeed's defaults, and a busier plan: 2e7-element buckets reduced on the
/// communication stream (`overlap_comm`), stage 3 prefetching 5e6 elements at a time under a
/// 3e7 live limit.
fn variants() -> [(&'static str, serde_json::Value); 2] {
    [
        ("defaults", json!({})),
        (
            "busy",
            json!({
                "reduce_bucket_size": 20_000_000,
                "overlap_comm": true,
                "stage3_prefetch_bucket_size": 5_000_000,
                "stage3_max_live_parameters": 30_000_000,
            }),
        ),
    ]
}

/// gpt2 124M bf16, W = 2, 4, 8, stages 1-3 (two micro-steps at stages 1-2, one at stage 3),
/// DeepSpeed's defaults and a busier plan: every rank's program passes the shape rules and
/// its collectives are the plan's, in order.
#[test]
fn the_cuda_steps_collectives_are_the_plans() {
    let model = gpt2();
    let seq_len = 64;
    eprintln!(
        "| plan | W | stage | collectives per step (program = plan) | ops per step |\n|---|---|---|---|---|"
    );
    for (name, zero) in variants() {
        for world in WORLDS {
            for stage in 1..=3u8 {
                let grad_accum = if stage == 3 { 1 } else { 2 };
                let mut cfg = config(stage, Dtype::Bf16, grad_accum as u64);
                if let (Some(target), Some(extra)) =
                    (cfg["zero_optimization"].as_object_mut(), zero.as_object())
                {
                    target.extend(extra.clone());
                }
                let plan = plan_for(&cfg, model, seq_len, world);
                let expected = planned_sequence(&plan);
                assert!(
                    !expected.is_empty(),
                    "W={world} stage {stage}: the plan communicates"
                );
                for rank in [0, world - 1] {
                    let layout = rank_layout(&plan, model, seq_len, Dtype::Bf16, rank);
                    let program = world_program(&layout, &plan).expect("program");
                    program
                        .check(&layout)
                        .unwrap_or_else(|e| panic!("W={world} stage {stage} rank {rank}: {e}"));
                    let ours = program_sequence(&program, &layout, grad_accum);
                    let ours_cmp = comparable(&ours);
                    if let Some(at) = ours_cmp.iter().zip(&expected).position(|(a, b)| a != b) {
                        panic!(
                            "W={world} stage {stage} rank {rank}: collective {at} is {:?}, the plan's {:?}",
                            ours[at], expected[at]
                        );
                    }
                    assert_eq!(ours_cmp.len(), expected.len(), "W={world} stage {stage}");
                    if rank == 0 {
                        eprintln!(
                            "| {name} | {world} | {stage} | {} | {} |",
                            counts(&ours),
                            program.ops(grad_accum).count()
                        );
                    }
                }
            }
        }
    }
}

/// The bucket size is the plan's: a smaller `reduce_bucket_size` gives more, smaller
/// reductions, in the program as in the plan.
#[test]
fn a_smaller_bucket_changes_the_programs_collectives() {
    let model = small_head_64();
    for stage in [2u8, 3] {
        let mut sequences = Vec::new();
        for bucket in [500_000_000u64, 50_000] {
            let mut cfg = config(stage, Dtype::Bf16, 1);
            cfg["zero_optimization"]["reduce_bucket_size"] = json!(bucket);
            let plan = plan_for(&cfg, model, 64, 4);
            let layout = rank_layout(&plan, model, 64, Dtype::Bf16, 1);
            let program = world_program(&layout, &plan).expect("program");
            let ours = program_sequence(&program, &layout, 1);
            assert_eq!(
                comparable(&ours),
                planned_sequence(&plan),
                "bucket {bucket}"
            );
            let reductions: Vec<CollectiveRecord> = ours
                .into_iter()
                .filter(|r| matches!(r.purpose, Purpose::ReduceBucket { .. }))
                .collect();
            assert_eq!(reductions.len(), plan.buckets.reduce.len());
            sequences.push(reductions);
        }
        assert!(
            sequences[1].len() > sequences[0].len(),
            "stage {stage}: {} buckets at 50k elements, {} at 5e8",
            sequences[1].len(),
            sequences[0].len()
        );
    }
}
