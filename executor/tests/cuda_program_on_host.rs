//! The CUDA step's programs run on the host (`cuda::train::host`), against the CPU backend
//! (`train::train`) from the same [`TrainSpec`]: what the GPU tests of `cuda_train.rs` compare
//! (the final fp32 parameters within `|gpu - cpu| <= 1e-5 |cpu| + 1e-6`), with every op of
//! the GPU's program interpreted on host buffers laid out as the device's and every
//! collective through thread ranks' host `Comm`. No GPU needed: a failure here is the
//! program's (buckets, averaging, partitions, the norm's and AdamW's views, the clip
//! coefficient, the parameter all-gather, stage 3's arena), not a kernel's.
//!
//! 1. One rank (the program the H200 passed) matches the CPU: the anchor.
//! 2. Two ranks at ZeRO stages 1-3 (`cuda_train.rs`'s `world_two_spec`: two steps of two
//!    micro-steps of 4 x 64 tokens per rank, clipping at 1.0).
//! 3. The same at four ranks, and stage 3 with a small persistence threshold and prefetch.
//! 4. Every rank's program orders each cross-stream access by its events.
//!    Taking the wait out of the stage-1 parameter all-gather is found as a race.
//! 5. The comparison notices a wrong program: without its gradient all-reduces, or without
//!    its parameter all-gather, stage 1 leaves the CPU's parameters.
//! 6. A checkpoint saved by a W = 2 host run of the programs resumes on W = 2 CPU ranks and
//!    ends where the uninterrupted CPU run ends (`cuda_train.rs`'s test 6).
//! 7. The small Llama (grouped-query attention, untied head) and Qwen2 (q/k/v biases, tied
//!    head) at one rank: every Llama-family op interpreted.
//! 8. The same at W = 2 (stages 1-3, stage 3 also gathering on demand and by prefetch) and
//!    W = 4 (stages 2 and 3): each rank's shares of the plan, `world_program` over the Llama
//!    ops.
//! 9. Every rank's Llama-family program of test 8 orders its cross-stream accesses.
//! 10. bf16 programs (every store rounded as the device stores it) against the CPU's bf16
//!     training, GPT-2, Llama and Qwen2 at W = 1 and 2, within the GPU check's bf16
//!     tolerances.
//!
//! Run with `--nocapture` to see each comparison's worst excess and, tensor by tensor, where
//! it lies beyond the tolerance.

use dsplan_executor::cuda::check::step::{
    SmallLlama, param_errors, small_llama_spec, small_model, small_spec,
};
use dsplan_executor::cuda::train::host::{
    check_ordering, run_rank_models_on_host, train_program_on_host,
};
use dsplan_executor::cuda::train::program::{CommAction, CommOp, Purpose};
use dsplan_executor::cuda::train::{Op, rank_models};
use dsplan_executor::data::WindowOrder;
use dsplan_executor::model::ModelConfig;
use dsplan_executor::train::{
    CheckpointOptions, DataChoice, TrainReport, TrainSettings, TrainSpec, compile_cuda_plan, train,
};
use dsplan_planner::plan::cuda_world::CudaShares;
use serde_json::{Value, json};

#[path = "support/beyond.rs"]
mod beyond;

/// The fp32 tolerance of the GPU tests: `|gpu - cpu| <= REL |cpu| + ABS`.
const REL: f64 = 1e-5;
const ABS: f64 = 1e-6;

/// `cuda_train.rs`'s `world_two_spec` at `world` ranks, f32, with `zero` extra keys of
/// `zero_optimization`: two micro-steps per optimizer step.
fn world_spec(stage: u8, world: usize, zero: Value) -> TrainSpec {
    spec_in(stage, world, zero, Precision::F32)
}

/// The model dtype of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Precision {
    F32,
    Bf16,
}

/// [`world_spec`] in `precision`.
fn spec_in(stage: u8, world: usize, zero: Value, precision: Precision) -> TrainSpec {
    spec_accumulating(stage, world, zero, precision, 2)
}

/// [`spec_in`] with `accumulation` micro-steps a step.
fn spec_accumulating(
    stage: u8,
    world: usize,
    zero: Value,
    precision: Precision,
    accumulation: u64,
) -> TrainSpec {
    let model = small_model().expect("the small model");
    let params = dsplan_executor::model::init_params(
        &model,
        &dsplan_executor::model::ParamLayout::new(&model),
        11,
    );
    let mut zero_optimization = json!({"stage": stage, "reduce_bucket_size": 50_000});
    if let (Some(object), Some(extra)) = (zero_optimization.as_object_mut(), zero.as_object()) {
        object.extend(extra.clone());
    }
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-6, "weight_decay": 0.01}},
        "zero_optimization": zero_optimization,
    });
    if precision == Precision::Bf16 {
        config["bf16"] = json!({"enabled": true});
    }
    TrainSpec {
        settings: TrainSettings::from_config(&config, world).expect("settings"),
        model: model.into(),
        initial_params: params,
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 7 },
        },
        seq_len: 64,
        steps: 2,
        world,
    }
}

/// [`beyond::beyond_tolerance`] of the host interpreter's run.
fn beyond_tolerance(
    model: &ModelConfig,
    initial: &[f32],
    host: &[f32],
    cpu: &[f32],
    tolerance: (f64, f64),
) -> String {
    beyond::beyond_tolerance("host", model, initial, host, cpu, tolerance)
}

/// The spec's CUDA plan run by the host interpreter, and the CPU backend's run.
fn run_both(spec: &TrainSpec) -> (TrainReport, TrainReport) {
    let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .expect("the CUDA plan");
    let host = train_program_on_host(spec, &plan, &CheckpointOptions::default(), &|_| {})
        .unwrap_or_else(|e| panic!("the host interpreter: {e}"));
    let cpu = train(spec, &|_| {}).expect("the CPU run");
    (host, cpu)
}

/// Runs `spec` both ways and returns its worst excess over the tolerance, printing the
/// comparison (losses, norms, parameters tensor by tensor).
fn compare(what: &str, spec: &TrainSpec) -> f64 {
    let (host, cpu) = run_both(spec);
    assert_eq!(host.steps.len(), cpu.steps.len(), "{what}: steps");
    for (h, c) in host.steps.iter().zip(&cpu.steps) {
        eprintln!(
            "{what} step {}: loss host {:.7} cpu {:.7}; norm host {:?} cpu {:?}",
            h.step, h.loss, c.loss, h.grad_norm, c.grad_norm
        );
    }
    let (worst, worst_abs, update) = param_errors(
        &spec.initial_params,
        &host.final_params,
        &cpu.final_params,
        REL,
    );
    eprintln!(
        "{what}: parameters beyond tolerance {worst:.3e} (tol {ABS:.1e}), largest difference \
         {worst_abs:.3e}, update {update:.3e}\n{}",
        beyond_tolerance(
            &spec.model,
            &spec.initial_params,
            &host.final_params,
            &cpu.final_params,
            (REL, ABS)
        )
    );
    for (h, c) in host.steps.iter().zip(&cpu.steps) {
        let rel = (h.loss - c.loss).abs() / c.loss.abs();
        assert!(rel < 1e-5, "{what}: loss {} vs {}", h.loss, c.loss);
    }
    assert!(update < 1e-3, "{what}: update {update}");
    worst
}

/// [`compare`] on every case, then one assertion naming each case beyond the tolerance (so
/// one failure does not hide the others).
fn assert_every_case_within<W: AsRef<str>>(cases: &[(W, TrainSpec)]) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|(what, spec)| {
            let what = what.as_ref();
            let worst = compare(what, spec);
            (worst.is_nan() || worst > ABS).then(|| format!("{what}: {worst:.3e} > {ABS:.1e}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// Test 1: one rank, two steps of the check's spec, as the GPU ran it.
#[test]
fn the_one_rank_program_on_the_host_matches_the_cpu() {
    let spec = small_spec(&json!({}), 2).expect("the check's spec");
    let worst = compare("W = 1", &spec);
    assert!(worst <= ABS, "W = 1: {worst} > {ABS}");
}

/// Test 2: two ranks at stages 1-3 (the failing GPU test's spec).
#[test]
fn two_rank_programs_on_the_host_match_the_cpu_at_stages_1_to_3() {
    let mut failures = Vec::new();
    for stage in 1..=3u8 {
        let what = format!("W = 2 stage {stage}");
        let worst = compare(&what, &world_spec(stage, 2, json!({})));
        if worst.is_nan() || worst > ABS {
            failures.push(format!("{what}: {worst:.3e} > {ABS:.1e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// Test 3: four ranks at stages 1-3, and stage 3 with smaller persistence thresholds (the
/// small model is whole persistent by default, so the default stage 3 gathers nothing
/// before the optimizer step): two ranks with nothing persistent and a prefetch bucket, four
/// ranks with the LayerNorms and biases persistent and every weight gathered on demand; and
/// stage 0 (every rank steps the whole model after one all-reduce per bucket); and stages 1-2
/// with many small gradient buckets, reduced overlapped with the compute or not.
#[test]
fn other_world_sizes_and_stage_3_settings_match_the_cpu() {
    let stage3 = json!({
        "stage3_param_persistence_threshold": 100,
        "stage3_prefetch_bucket_size": 40_000,
        "stage3_max_live_parameters": 200_000,
    });
    let mut cases: Vec<(String, TrainSpec)> = (1..=3u8)
        .map(|stage| {
            (
                format!("W = 4 stage {stage}"),
                world_spec(stage, 4, json!({})),
            )
        })
        .collect();
    cases.push((
        "W = 2 stage 3 small persistence, prefetch".to_string(),
        world_spec(3, 2, stage3),
    ));
    cases.push((
        "W = 4 stage 3 mixed persistence, on demand only".to_string(),
        world_spec(
            3,
            4,
            json!({"stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 0}),
        ),
    ));
    // The small threshold and the prefetch bucket do change the stage-3 schedule: fewer
    // persistent elements, and tensors prefetched ahead of their unit.
    let schedule = |spec: &TrainSpec| {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let s3 = plan.stage3.expect("a stage-3 schedule");
        let prefetched: usize = s3.steps.iter().map(|s| s.prefetch.len()).sum();
        (s3.persistent_numel, prefetched)
    };
    let (default_persistent, _) = schedule(&world_spec(3, 2, json!({})));
    let (persistent, prefetched) = schedule(&cases[3].1);
    let (mixed, on_demand_only) = schedule(&cases[4].1);
    eprintln!(
        "stage 3 persistent elements: default {default_persistent}, threshold 100 \
         {persistent} ({prefetched} tensors prefetched per micro-step), threshold 1000 {mixed} \
         ({on_demand_only} prefetched)"
    );
    assert!(persistent < default_persistent && prefetched > 0);
    assert!(0 < mixed && mixed < default_persistent && on_demand_only == 0);
    // Stages 1-2 with many small gradient buckets, with and without overlapping communication
    // (the parameter all-gather stays one collective: the dsplan-cuda plan gathers the flat
    // buffer with all_gather_into_tensor, whatever allgather_bucket_size says).
    cases.push(("W = 2 stage 0".to_string(), world_spec(0, 2, json!({}))));
    for (stage, overlap) in [(1u8, false), (2, true), (2, false)] {
        cases.push((
            format!("W = 2 stage {stage} small buckets, overlap_comm {overlap}"),
            world_spec(
                stage,
                2,
                json!({"reduce_bucket_size": 20_000, "overlap_comm": overlap}),
            ),
        ));
    }
    let plan = compile_cuda_plan(
        &cases[6].1.settings,
        &cases[6].1.model,
        cases[6].1.seq_len,
        cases[6].1.world,
    )
    .expect("the CUDA plan");
    eprintln!(
        "small buckets: {} gradient buckets",
        plan.buckets.reduce.len()
    );
    assert!(plan.buckets.reduce.len() > 4);
    // Stage 1 with one micro-step a step and overlap_comm keeps only its gradient partition
    // and the gradients in flight, as stage 2 does.
    let one_micro_step = spec_accumulating(
        1,
        2,
        json!({"reduce_bucket_size": 20_000, "overlap_comm": true}),
        Precision::F32,
        1,
    );
    let plan = compile_cuda_plan(
        &one_micro_step.settings,
        &one_micro_step.model,
        one_micro_step.seq_len,
        one_micro_step.world,
    )
    .expect("the CUDA plan");
    assert!(
        plan.buckets.gradient_arena.is_some(),
        "stage 1, one micro-step: a gradient arena"
    );
    cases.push((
        "W = 2 stage 1 one micro-step, gradient partition".to_string(),
        one_micro_step,
    ));
    assert_every_case_within(&cases);
}

/// Test 4: no two accesses of a buffer on different streams go unordered in any rank's
/// program of test 2's specs, in f32 and bf16 (with bf16 stage 0, `FP16_Optimizer`'s
/// replicated states), and of test 3's stage-3 and small-bucket
/// settings (two applied steps, as the loop runs them).
#[test]
fn every_world_program_orders_its_cross_stream_accesses() {
    let mut specs: Vec<TrainSpec> = (1..=3u8).map(|s| world_spec(s, 2, json!({}))).collect();
    specs.extend((0..=3u8).map(|s| spec_in(s, 2, json!({}), Precision::Bf16)));
    specs.push(spec_accumulating(
        1,
        2,
        json!({"reduce_bucket_size": 20_000, "overlap_comm": true}),
        Precision::Bf16,
        1,
    ));
    specs.push(world_spec(
        3,
        2,
        json!({"stage3_param_persistence_threshold": 100, "stage3_prefetch_bucket_size": 40_000}),
    ));
    specs.push(world_spec(
        3,
        4,
        json!({"stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 0}),
    ));
    for overlap in [true, false] {
        specs.push(world_spec(
            2,
            2,
            json!({"reduce_bucket_size": 20_000, "overlap_comm": overlap}),
        ));
    }
    let mut races = Vec::new();
    for spec in &specs {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let models = rank_models(spec, &plan).expect("every rank's program");
        for (rank, model) in models.iter().enumerate() {
            let found = check_ordering(&model.program, spec.settings.batch.grad_accum, 2);
            let stage = spec.settings.stage;
            let dtype = spec.settings.precision().model_dtype();
            eprintln!(
                "stage {stage:?} {dtype:?} rank {rank}: {} unordered cross-stream access(es)",
                found.len()
            );
            races.extend(
                found
                    .iter()
                    .take(5)
                    .map(|r| format!("stage {stage:?} rank {rank}: {r}")),
            );
        }
    }
    assert!(races.is_empty(), "{}", races.join("\n"));
}

/// Which collectives a case of test 5 takes out, by purpose.
type Dropped = fn(&Purpose) -> bool;

/// Test 5: the W = 2 stage-1 programs with one kind of collective taken out leave the CPU's
/// parameters by far more than the tolerance (the interpreter runs the collectives; a
/// comparison that passed without them would check nothing).
#[test]
fn a_program_without_its_collectives_does_not_match() {
    let spec = world_spec(1, 2, json!({}));
    let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .expect("the CUDA plan");
    let cpu = train(&spec, &|_| {}).expect("the CPU run");
    let cases: [(&str, Dropped); 2] = [
        ("without the gradient buckets' all-reduce", |p| {
            matches!(p, Purpose::ReduceBucket { .. })
        }),
        ("without the parameter all-gather", |p| {
            matches!(p, Purpose::ParamGather { .. })
        }),
    ];
    for (what, dropped) in cases {
        let mut models = rank_models(&spec, &plan).expect("every rank's program");
        let mut removed = 0;
        for model in &mut models {
            let program = &mut model.program;
            for phase in [
                &mut program.micro_step,
                &mut program.boundary_micro_step,
                &mut program.after_update,
            ] {
                let before = phase.len();
                phase.retain(|op| {
                    !matches!(op, Op::Collective(CommOp {
                        action: CommAction::Collective { purpose, .. },
                        ..
                    }) if dropped(purpose))
                });
                removed += before - phase.len();
            }
        }
        assert!(removed > 0, "{what}: the programs have such collectives");
        let host = run_rank_models_on_host(
            &spec,
            &plan,
            &models,
            &CheckpointOptions::default(),
            &|_| {},
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .report;
        let (worst, _, update) = param_errors(
            &spec.initial_params,
            &host.final_params,
            &cpu.final_params,
            REL,
        );
        eprintln!(
            "stage 1 {what} ({removed} collectives): {worst:.3e} beyond, update {update:.3e}"
        );
        assert!(
            worst > 1e-4,
            "{what}: {worst} is within reach of the tolerance"
        );
    }
}

/// Test 6: one W = 2 step of the programs on the host saves a checkpoint; W = 2 CPU ranks
/// resume it and end where the uninterrupted CPU run ends, within the tolerance.
#[test]
fn a_world_two_host_checkpoint_resumes_on_two_cpu_ranks() {
    use dsplan_executor::checkpoint::load_checkpoint;
    use dsplan_executor::train::{SavePolicy, compile_plan, resume_point, train_planned_with};
    let mut failures = Vec::new();
    for stage in 1..=3u8 {
        let dir = tempfile::tempdir().expect("a directory");
        let spec = world_spec(stage, 2, json!({}));
        let one_step = TrainSpec {
            steps: 1,
            ..spec.clone()
        };
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, 2).expect("plan");
        let save = CheckpointOptions {
            save: Some(SavePolicy::new(dir.path(), None)),
            resume: None,
        };
        train_program_on_host(&one_step, &plan, &save, &|_| {}).expect("host step");
        let loaded = load_checkpoint(dir.path()).expect("the host run's checkpoint");
        let cpu_plan =
            compile_plan(&spec.settings, &spec.model, spec.seq_len, 2).expect("cpu plan");
        let point = resume_point(&spec, &cpu_plan, &loaded).expect("resumable");
        let resumed = train_planned_with(
            &spec,
            &cpu_plan,
            &CheckpointOptions {
                save: None,
                resume: Some(point),
            },
            &|_| {},
        )
        .expect("resumed on the CPU");
        let straight = train(&spec, &|_| {}).expect("CPU run");
        let (worst, worst_abs, _) = param_errors(
            &spec.initial_params,
            &resumed.final_params,
            &straight.final_params,
            REL,
        );
        eprintln!(
            "stage {stage}: resumed vs straight {worst:.3e} (largest {worst_abs:.3e})\n{}",
            beyond_tolerance(
                &spec.model,
                &spec.initial_params,
                &resumed.final_params,
                &straight.final_params,
                (REL, ABS)
            )
        );
        if worst.is_nan() || worst > ABS {
            failures.push(format!("stage {stage}: {worst:.3e} > {ABS:.1e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// Test 4's check finds a race where one is made: the stage-1 parameter all-gather (on the
/// communication stream) no longer waiting for the optimizer step's event.
#[test]
fn the_ordering_check_finds_a_missing_wait() {
    let spec = world_spec(1, 2, json!({}));
    let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .expect("the CUDA plan");
    let mut models = rank_models(&spec, &plan).expect("every rank's program");
    let program = &mut models[0].program;
    let mut cleared = 0;
    for op in &mut program.after_update {
        if let Op::Collective(comm) = op
            && !comm.waits.is_empty()
            && matches!(
                comm.action,
                CommAction::Collective { .. } | CommAction::Copy { .. }
            )
        {
            comm.waits.clear();
            cleared += 1;
        }
    }
    assert!(cleared > 0, "the all-gather waits for the optimizer step");
    let races = check_ordering(program, spec.settings.batch.grad_accum, 2);
    eprintln!(
        "{} race(s); the first: {:?}",
        races.len(),
        races.first().map(ToString::to_string)
    );
    assert!(
        !races.is_empty(),
        "a gather racing the optimizer step goes unseen"
    );
}

/// The bf16 tolerances of the GPU's own check against the CPU (`cuda::check::step`, what
/// `dsplan report --check` holds the H200 to): the loss within 1e-2 relative, every final
/// parameter within 2e-3 per applied step (twice AdamW's `lr`: the most a gradient near zero
/// whose sign flips moves one update; the check runs one step, these two), the update
/// within 0.1 of the CPU's (relative norm). The CPU's bf16
/// rounds only parameters and gradients; the device (and so the interpreter) also stores
/// every activation in bf16 (8 significand bits, 2^-9 relative per store), which is the
/// difference these bound: the f32 tolerances would fail on it.
const BF16_LOSS_REL: f64 = 1e-2;
const BF16_PARAM_ABS_PER_STEP: f64 = 2e-3;
const BF16_UPDATE_REL: f64 = 0.1;

/// Runs `spec` (bf16) both ways and the same spec in f32 on the host; returns what is beyond
/// the bf16 tolerances, after checking that the bf16 run is not the f32 one (the rounding of
/// every store is applied).
fn bf16_failures(what: &str, spec: &TrainSpec, f32_spec: &TrainSpec) -> Vec<String> {
    let (host, cpu) = run_both(spec);
    let (f32_host, _) = run_both(f32_spec);
    let mut failures = Vec::new();
    for ((h, c), f) in host.steps.iter().zip(&cpu.steps).zip(&f32_host.steps) {
        let rel = (h.loss - c.loss).abs() / c.loss.abs();
        eprintln!(
            "{what} step {}: loss host bf16 {:.7} cpu bf16 {:.7} (rel {rel:.2e}), host f32 {:.7}",
            h.step, h.loss, c.loss, f.loss
        );
        if rel.is_nan() || rel > BF16_LOSS_REL {
            failures.push(format!("{what} step {}: loss rel {rel:.3e}", h.step));
        }
    }
    if host.steps.len() != cpu.steps.len() || host.steps.is_empty() {
        failures.push(format!(
            "{what}: {} vs {} steps",
            host.steps.len(),
            cpu.steps.len()
        ));
    }
    if host.final_params == f32_host.final_params {
        failures.push(format!("{what}: the bf16 run ended where the f32 run ends"));
    }
    let (_, worst_abs, update) = param_errors(
        &spec.initial_params,
        &host.final_params,
        &cpu.final_params,
        0.0,
    );
    eprintln!("{what}: largest parameter difference {worst_abs:.3e}, update {update:.3e}");
    let param_tolerance = BF16_PARAM_ABS_PER_STEP * host.applied_steps as f64;
    if worst_abs.is_nan() || worst_abs > param_tolerance {
        failures.push(format!("{what}: parameter difference {worst_abs:.3e}"));
    }
    if update.is_nan() || update > BF16_UPDATE_REL {
        failures.push(format!("{what}: update {update:.3e}"));
    }
    failures
}

/// bf16 programs on the host against the CPU's bf16 training: GPT-2 at W = 1 and at W = 2
/// (stages 1-3, stage 0's replicated `FP16_Optimizer` states), two steps of two micro-steps.
#[test]
fn bf16_gpt2_programs_on_the_host_match_the_cpu_bf16() {
    let mut failures = Vec::new();
    let one = small_spec(&json!({"bf16": {"enabled": true}}), 2).expect("the check's spec");
    let one_f32 = small_spec(&json!({}), 2).expect("the check's spec");
    failures.extend(bf16_failures("bf16 W = 1", &one, &one_f32));
    for stage in 0..=3u8 {
        failures.extend(bf16_failures(
            &format!("bf16 W = 2 stage {stage}"),
            &spec_in(stage, 2, json!({}), Precision::Bf16),
            &world_spec(stage, 2, json!({})),
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// The same for the small Llama and Qwen2 at W = 1 and W = 2 (stages 2 and 3).
#[test]
fn bf16_llama_programs_on_the_host_match_the_cpu_bf16() {
    let mut failures = Vec::new();
    for which in [SmallLlama::Llama, SmallLlama::Qwen2] {
        let one = small_llama_spec(which, &json!({"bf16": {"enabled": true}}), 2)
            .expect("the small Llama");
        let one_f32 = small_llama_spec(which, &json!({}), 2).expect("the small Llama");
        failures.extend(bf16_failures(
            &format!("bf16 {which:?} W = 1"),
            &one,
            &one_f32,
        ));
        for stage in [2u8, 3] {
            failures.extend(bf16_failures(
                &format!("bf16 {which:?} W = 2 stage {stage}"),
                &llama_spec_in(which, stage, 2, json!({}), Precision::Bf16),
                &llama_world_spec(which, stage, 2, json!({})),
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// Test 7: the small Llama (grouped-query attention, untied head) and Qwen2 (q/k/v biases,
/// tied head) at one rank, two steps of two micro-steps: every Llama-family op interpreted
/// (RMSNorm, RoPE, SwiGLU, grouped-query attention, the `nn.Linear` products) ends where the
/// CPU backend ends.
#[test]
fn the_one_rank_llama_programs_on_the_host_match_the_cpu() {
    let cases: Vec<(String, TrainSpec)> = [SmallLlama::Llama, SmallLlama::Qwen2]
        .into_iter()
        .map(|which| {
            let spec = small_llama_spec(which, &json!({}), 2).expect("the small Llama");
            (format!("{which:?} W = 1"), spec)
        })
        .collect();
    assert_every_case_within(&cases);
}

/// The small Llama-family model `which` ([`small_llama_spec`]) trained as [`world_spec`]
/// trains the small GPT-2: ZeRO `stage`, `world` ranks, `zero` extra keys, two steps of two
/// micro-steps, clipping at 1.0.
fn llama_world_spec(which: SmallLlama, stage: u8, world: usize, zero: Value) -> TrainSpec {
    llama_spec_in(which, stage, world, zero, Precision::F32)
}

/// [`llama_world_spec`] in `precision`.
fn llama_spec_in(
    which: SmallLlama,
    stage: u8,
    world: usize,
    zero: Value,
    precision: Precision,
) -> TrainSpec {
    let llama = small_llama_spec(which, &json!({}), 2).expect("the small Llama");
    let mut zero = zero;
    if let Some(object) = zero.as_object_mut() {
        object
            .entry("reduce_bucket_size")
            .or_insert(json!(LLAMA_BUCKET));
    }
    TrainSpec {
        model: llama.model,
        initial_params: llama.initial_params,
        ..spec_in(stage, world, zero, precision)
    }
}

/// Test 8's cases: the small Llama and Qwen2 at W = 2, stages 1-3 (stage 3 also with nothing
/// but the norms persistent and a prefetch bucket, so the arena gathers and releases the
/// projections), and at W = 4, stage 2 and stage 3.
fn llama_world_cases() -> Vec<(String, TrainSpec)> {
    let mut cases = Vec::new();
    for which in [SmallLlama::Llama, SmallLlama::Qwen2] {
        for stage in 1..=3u8 {
            cases.push((
                format!("{which:?} W = 2 stage {stage}"),
                llama_world_spec(which, stage, 2, json!({})),
            ));
        }
        cases.push((
            format!("{which:?} W = 2 stage 3 small persistence, prefetch"),
            llama_world_spec(
                which,
                3,
                2,
                json!({"stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 40_000}),
            ),
        ));
        cases.push((
            format!("{which:?} W = 4 stage 2"),
            llama_world_spec(which, 2, 4, json!({})),
        ));
        for stage in [1u8, 2, 3] {
            cases.push((
                format!("{which:?} W = 2 stage {stage} small buckets (packed)"),
                llama_world_spec(
                    which,
                    stage,
                    2,
                    json!({"reduce_bucket_size": PACKED_BUCKET}),
                ),
            ));
        }
    }
    cases.push((
        "Llama W = 4 stage 3 small persistence, on demand only".to_string(),
        llama_world_spec(
            SmallLlama::Llama,
            3,
            4,
            json!({"stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 0}),
        ),
    ));
    cases
}

/// Test 8: the Llama family at W > 1 (each rank's shares of the plan, `world_program` over
/// the Llama ops) matches the CPU backend's W-rank run within the tolerance.
#[test]
fn llama_world_programs_on_the_host_match_the_cpu() {
    let cases = llama_world_cases();
    // The small persistence threshold does gather: fewer persistent elements than the default.
    let persistent = |spec: &TrainSpec| {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        plan.stage3.expect("a stage-3 schedule").persistent_numel
    };
    let (default, small) = (persistent(&cases[2].1), persistent(&cases[3].1));
    eprintln!("Llama stage 3 persistent elements: default {default}, threshold 1000 {small}");
    assert!(small < default, "the threshold gathers something");
    // The small buckets are cut inside decoder layers: packed through the bucket staging.
    for (what, spec) in cases.iter().filter(|(what, _)| what.contains("packed")) {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let staging = CudaShares::of_plan(&plan).bucket;
        eprintln!(
            "{what}: {} buckets, staging {staging}",
            plan.buckets.reduce.len()
        );
        assert!(staging > 0, "{what}: a bucket is packed");
    }
    assert_every_case_within(&cases);
}

/// Test 9: every rank's Llama-family program of test 8 orders each cross-stream access by its
/// events (two applied steps, as the loop runs them).
#[test]
fn every_llama_world_program_orders_its_cross_stream_accesses() {
    let mut races = Vec::new();
    for (what, spec) in &llama_world_cases() {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let models = rank_models(spec, &plan).expect("every rank's program");
        assert_eq!(models.len(), spec.world, "{what}");
        for (rank, model) in models.iter().enumerate() {
            let collectives = model
                .program
                .micro_step
                .iter()
                .chain(&model.program.boundary_micro_step)
                .filter(|op| {
                    matches!(
                        op,
                        Op::Collective(CommOp {
                            action: CommAction::Collective { .. },
                            ..
                        })
                    )
                })
                .count();
            assert!(collectives > 0, "{what} rank {rank}: the step communicates");
            let found = check_ordering(&model.program, spec.settings.batch.grad_accum, 2);
            eprintln!(
                "{what} rank {rank}: {collectives} collectives per step, {} unordered \
                 cross-stream access(es)",
                found.len()
            );
            races.extend(
                found
                    .iter()
                    .take(5)
                    .map(|r| format!("{what} rank {rank}: {r}")),
            );
        }
    }
    assert!(races.is_empty(), "{}", races.join("\n"));
}

/// The Llama tests' gradient bucket: the whole small model in one (a bucket cut inside a
/// decoder layer holds tensors that are not back to back in the flat buffer, since the
/// layer's norms follow its projections but are reduced between them: every stage packs it
/// through the bucket staging, which the `PACKED_BUCKET` cases run).
const LLAMA_BUCKET: u64 = 1_000_000;

/// A bucket small enough to be cut inside the small Llama's decoder layers.
const PACKED_BUCKET: u64 = 20_000;

/// Test 10: at stages 2 and 3 (`W > 1`) a rank keeps the plan's gradient arena (the gradients
/// in flight) and its gradient partition, not the whole model's gradients: the gradient
/// region is smaller than the model, its partition is the rank's share, and the allocation is
/// the plan's to the byte; stage 1 keeps whole gradients, as DeepSpeed does.
#[test]
fn stages_2_and_3_keep_only_their_gradient_partition_and_the_buckets_in_flight() {
    use dsplan_executor::cuda::train::Region;
    use dsplan_executor::metrics::{Category, PlanMemory};
    let mut specs: Vec<(String, TrainSpec)> = Vec::new();
    for world in [2, 4] {
        for stage in 1..=3u8 {
            specs.push((
                format!("GPT-2 W = {world} stage {stage}"),
                world_spec(stage, world, json!({})),
            ));
            specs.push((
                format!("Llama W = {world} stage {stage} small buckets"),
                llama_world_spec(
                    SmallLlama::Llama,
                    stage,
                    world,
                    json!({"reduce_bucket_size": PACKED_BUCKET}),
                ),
            ));
        }
    }
    for (what, spec) in &specs {
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let psi = spec.model.layout().num_params();
        let predicted = PlanMemory::of(&plan);
        for model in rank_models(spec, &plan).expect("every rank's program") {
            let layout = &model.layout;
            let shares = layout.shares;
            let grads = layout.len(Region::Grads);
            let ours = layout.bytes_by_category();
            for category in Category::ALL {
                assert_eq!(
                    ours.get(category),
                    predicted.peak.get(category),
                    "{what}: {category:?}"
                );
            }
            eprintln!(
                "{what} rank {}: gradients {grads} elements (arena {}, partition {}) of a model of {psi}",
                shares.rank, shares.grads, shares.grad_partition
            );
            if spec.settings.stage == dsplan_planner::config::ZeroStage::OptimizerStates {
                assert!(grads >= psi, "{what}: stage 1 keeps whole gradients");
                continue;
            }
            let arena = plan
                .buckets
                .gradient_arena
                .as_ref()
                .expect("a gradient arena");
            assert_eq!(shares.grads, arena.numel, "{what}");
            assert!(
                (shares.grads as usize) < psi,
                "{what}: an arena of {} is not below the model's {psi}",
                shares.grads
            );
            assert_eq!(
                shares.grad_partition, shares.optimizer,
                "{what}: the gradient partition is the rank's optimizer partition"
            );
            assert!(
                grads < psi,
                "{what}: {grads} gradient elements for a model of {psi}"
            );
        }
    }
}

/// Test 11: without the accumulation of each reduced bucket into the rank's gradient
/// partition (a bucket's reduction skipped), stages 2 and 3 leave the CPU's parameters by far
/// more than the tolerance: the comparison sees the partitions.
#[test]
fn a_partitioned_program_without_its_accumulations_does_not_match() {
    for stage in [2u8, 3] {
        let spec = world_spec(stage, 2, json!({}));
        let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
            .expect("the CUDA plan");
        let cpu = train(&spec, &|_| {}).expect("the CPU run");
        let mut models = rank_models(&spec, &plan).expect("every rank's program");
        let mut removed = 0;
        for model in &mut models {
            for phase in [
                &mut model.program.micro_step,
                &mut model.program.boundary_micro_step,
            ] {
                let before = phase.len();
                phase.retain(|op| {
                    !matches!(
                        op,
                        Op::Collective(CommOp {
                            action: CommAction::Accumulate { .. },
                            ..
                        })
                    )
                });
                removed += before - phase.len();
            }
        }
        assert!(removed > 0, "stage {stage}: the programs accumulate");
        let host = run_rank_models_on_host(
            &spec,
            &plan,
            &models,
            &CheckpointOptions::default(),
            &|_| {},
        )
        .expect("the host run")
        .report;
        let (worst, _, _) = param_errors(
            &spec.initial_params,
            &host.final_params,
            &cpu.final_params,
            REL,
        );
        eprintln!("stage {stage} without {removed} accumulations: {worst:.3e} beyond");
        assert!(
            worst > 1e-4,
            "stage {stage}: {worst} is within reach of the tolerance"
        );
    }
}
