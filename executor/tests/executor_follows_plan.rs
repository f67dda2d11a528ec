//! The executor follows the plan: a plan field changed through the config key that sets it
//! (the gradient bucket size, stage 3's persistence threshold) changes what the executor does
//! in the same way. Its collectives (counted per kind by the rank's `Comm`, `CommTraffic`) are
//! the plan's, one per planned bucket per step with the planned collective, and fewer gathered
//! bytes when the plan keeps more tensors whole; its measured memory moves with the plan's, to
//! the byte. Fields changed in the plan itself (the parameter all-gather's pieces, the
//! gradient-norm rule of the plan's `run` policy) change the executor's collectives with them,
//! and a plan that leaves out a gather its engine needs is refused, not completed. The rank's
//! run-long buffers are the plan's buffer list: a listed size changed is refused, naming the
//! buffer.
//!
//! (The plan's stage 3 `prefetch` and `max_live_parameters` decisions are not followed on the
//! CPU, see `zero::partition`: one thread per rank has no second stream to prefetch on.)

use dsplan_executor::comm::CommTraffic;
use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use dsplan_executor::train::{
    DataChoice, TrainError, TrainReport, TrainSettings, TrainSpec, compile_plan, train_planned,
};
use dsplan_executor::zero::{ListedBuffers, ZeroError};
use dsplan_planner::config::ZeroStage;
use dsplan_planner::plan::shards::ElementRange;
use dsplan_planner::plan::{ClipRule, Collective, EngineFamily, Plan, PlanBackend};
use serde_json::{Value, json};

const MODEL: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 64,
    n_embd: 64,
    n_layer: 2,
    n_head: 4,
    layer_norm_epsilon: 1e-5,
};
const WORLD: usize = 2;
const STEPS: u64 = 2;

/// Compiles the plan of `zero` and runs it.
fn run(zero: Value) -> (Plan, TrainReport) {
    let (plan, report) = run_edited(json!({"zero_optimization": zero}), |_| {});
    (plan, report.expect("training runs"))
}

/// Compiles the plan of the base config with `extra`'s keys, changes it with `edit` and runs
/// the changed plan.
fn run_edited(
    extra: Value,
    edit: impl FnOnce(&mut Plan),
) -> (Plan, Result<TrainReport, TrainError>) {
    let (spec, mut plan) = planned(extra);
    edit(&mut plan);
    let report = train_planned(&spec, &plan, &|_| {});
    if let Ok(report) = &report {
        assert_eq!(report.applied_steps, STEPS);
    }
    (plan, report)
}

/// The run of the base config with `extra`'s keys, and its plan and graph.
fn planned(extra: Value) -> (TrainSpec, Plan) {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    });
    for (key, value) in extra.as_object().expect("an object") {
        config[key] = value.clone();
    }
    let settings = TrainSettings::from_config(&config, WORLD).expect("config");
    let spec = TrainSpec {
        settings,
        model: MODEL.into(),
        initial_params: init_params(&MODEL, &ParamLayout::new(&MODEL), 3),
        data: DataChoice::Bundled {
            order: WindowOrder::Sequential,
        },
        seq_len: 32,
        steps: STEPS,
        world: WORLD,
    };
    let plan =
        compile_plan(&spec.settings, &spec.model, spec.seq_len, WORLD).expect("the plan compiles");
    (spec, plan)
}

/// Every rank's measured peak, per category and in total, is the plan's.
fn assert_memory_is_the_plans(label: &str, report: &TrainReport) {
    for (rank, measured) in report.memory.iter().enumerate() {
        for category in Category::ALL {
            assert_eq!(
                measured.peak.get(category),
                report.plan_memory.peak.get(category),
                "{label}: rank {rank}, {}",
                category.name()
            );
        }
        assert_eq!(
            measured.peak_total, report.plan_memory.peak_total,
            "{label}"
        );
    }
}

/// Reduce-scatter and all-reduce calls a rank makes per step for the plan's gradient buckets
/// (`Reduce` runs as an all-reduce on the CPU).
fn planned_bucket_calls(plan: &Plan) -> (u64, u64) {
    let count = |wanted: &[Collective]| {
        plan.buckets
            .reduce
            .iter()
            .filter(|b| wanted.contains(&b.collective))
            .count() as u64
    };
    (
        count(&[Collective::ReduceScatter]),
        count(&[Collective::AllReduce, Collective::Reduce]),
    )
}

fn bucket_calls(traffic: &CommTraffic) -> (u64, u64) {
    (traffic.reduce_scatter.calls, traffic.all_reduce.calls)
}

/// Stage 2: the gradient bucket size decides how many buckets the plan reduces per step, and
/// so how many reductions every rank makes and how large its bucket buffer is. Besides the
/// buckets a rank makes the same other collectives in both runs (fp32 stage 2: one all-reduce
/// of the gradient norm per step), so the counts differ by exactly the planned buckets.
#[test]
fn the_bucket_size_of_the_plan_sets_the_reductions_and_the_bucket_memory() {
    let mut seen = Vec::new();
    for bucket in [4_000u64, 40_000] {
        let label = format!("stage 2, reduce_bucket_size {bucket}");
        let (plan, report) = run(json!({"stage": 2, "reduce_bucket_size": bucket}));
        assert_eq!(
            plan.buckets.bucket_size, bucket,
            "{label}: the plan's field"
        );
        let planned = planned_bucket_calls(&plan);
        for (rank, traffic) in report.traffic.iter().enumerate() {
            assert_eq!(
                bucket_calls(traffic),
                bucket_calls(&report.traffic[0]),
                "{label}: rank {rank} as rank 0"
            );
        }
        assert_memory_is_the_plans(&label, &report);
        let done = bucket_calls(&report.traffic[0]);
        eprintln!(
            "{label}: {} buckets per step (reduce-scatter, all-reduce) {planned:?}; rank 0 made {done:?} over {STEPS} steps; bucket memory {} B",
            plan.buckets.reduce.len(),
            report.memory[0].peak.get(Category::Buckets)
        );
        seen.push((planned, done, report.memory[0].peak.get(Category::Buckets)));
    }
    let (small, large) = (seen[0], seen[1]);
    let (planned_small, planned_large) = (small.0, large.0);
    assert!(
        planned_small.0 + planned_small.1 > planned_large.0 + planned_large.1,
        "smaller buckets, more of them: {seen:?}"
    );
    assert_eq!(
        (small.1.0 - large.1.0, small.1.1 - large.1.1,),
        (
            (planned_small.0 - planned_large.0) * STEPS,
            (planned_small.1 - planned_large.1) * STEPS,
        ),
        "the reductions differ by the planned buckets: {seen:?}"
    );
    assert!(
        small.2 < large.2,
        "smaller buckets, less bucket memory: {seen:?}"
    );
}

/// Stage 3: a higher persistence threshold makes the plan keep more tensors whole on every
/// rank, so the executor gathers fewer bytes and holds more parameter memory, as planned.
#[test]
fn the_persistence_threshold_of_the_plan_sets_the_gathers_and_the_parameter_memory() {
    let mut seen = Vec::new();
    for threshold in [0u64, 20_000] {
        let label = format!("stage 3, stage3_param_persistence_threshold {threshold}");
        let (plan, report) = run(json!({"stage": 3, "reduce_bucket_size": 20_000,
            "stage3_param_persistence_threshold": threshold}));
        let persistent = plan.shards.persistent.as_ref().map_or(0, |p| p.numel);
        let (scatters, reduces) = planned_bucket_calls(&plan);
        for (rank, traffic) in report.traffic.iter().enumerate() {
            assert_eq!(
                bucket_calls(traffic),
                (scatters * STEPS, reduces * STEPS),
                "{label}, rank {rank}: bucket reductions"
            );
        }
        assert_memory_is_the_plans(&label, &report);
        let gathered = report.traffic[0].all_gather;
        eprintln!(
            "{label}: {persistent} persistent elements, rank 0 all-gathered {} times, {} B; params {} B, gathered {} B",
            gathered.calls,
            gathered.bytes_sent,
            report.memory[0].peak.get(Category::Params),
            report.memory[0].peak.get(Category::Gathered)
        );
        seen.push((
            persistent,
            gathered.bytes_sent,
            report.memory[0].peak.get(Category::Params),
        ));
    }
    let (none, most) = (seen[0], seen[1]);
    assert_eq!(none.0, 0, "threshold 0: nothing persistent ({seen:?})");
    assert!(
        most.0 > 0,
        "a higher threshold keeps tensors whole ({seen:?})"
    );
    assert!(
        most.1 < none.1,
        "persistent tensors are not gathered: fewer bytes ({seen:?})"
    );
    assert!(
        most.2 > none.2,
        "persistent tensors are held whole: more parameter memory ({seen:?})"
    );
}

/// The all-gather calls and bytes rank 0 made.
fn gathers(report: &TrainReport) -> (u64, u64) {
    let gathered = report.traffic[0].all_gather;
    (gathered.calls, gathered.bytes_sent)
}

/// Stage 1 (and `BF16_Optimizer`, bf16 at stage 1 accumulating in fp32): the parameter all-gather after
/// the step is the plan's `buckets.param_gather`, one collective per planned piece. Cutting
/// the planned gather into four pieces makes four collectives per step moving the same bytes,
/// with the same parameters at the end; a plan without the gather is refused rather than
/// completed by the executor.
#[test]
fn the_plans_parameter_all_gather_sets_the_gathers() {
    for (extra, label) in [
        (json!({"zero_optimization": {"stage": 1}}), "fp32 stage 1"),
        (
            json!({"zero_optimization": {"stage": 1}, "bf16": {"enabled": true},
                "data_types": {"grad_accum_dtype": "fp32"}}),
            "BF16_Optimizer",
        ),
    ] {
        let (plan, report) = run_edited(extra.clone(), |_| {});
        let report = report.expect("training runs");
        assert_eq!(plan.run.engine, EngineFamily::FlatPartition, "{label}");
        assert_eq!(plan.run.engine_stage, ZeroStage::OptimizerStates, "{label}");
        let planned = plan
            .buckets
            .param_gather
            .as_ref()
            .unwrap_or_else(|| panic!("{label}: the plan gathers the partitions"));
        assert_eq!(planned.shards.len(), 1, "{label}: one piece as compiled");
        let whole = gathers(&report);
        assert_eq!(whole.0, STEPS, "{label}: one all-gather per step");

        let partition = plan.layout.partition_numel;
        let quarter = (partition / 4) & !1;
        let (cut, report4) = run_edited(extra.clone(), |plan| {
            let gather = plan.buckets.param_gather.as_mut().expect("a gather");
            gather.shards = (0..4)
                .map(|i| ElementRange {
                    start: i * quarter,
                    end: if i == 3 { partition } else { (i + 1) * quarter },
                })
                .collect();
        });
        let report4 = report4.expect("training runs");
        let pieces = cut
            .buckets
            .param_gather
            .as_ref()
            .map_or(0, |g| g.shards.len());
        let four = gathers(&report4);
        eprintln!("{label}: as planned {whole:?}, in {pieces} pieces {four:?} (calls, bytes)");
        assert_eq!(
            four.0,
            4 * STEPS,
            "{label}: one all-gather per planned piece"
        );
        assert_eq!(four.1, whole.1, "{label}: the same bytes in all");
        assert_eq!(
            report4.final_params, report.final_params,
            "{label}: the same parameters"
        );

        let (_, refused) = run_edited(extra, |plan| plan.buckets.param_gather = None);
        match refused {
            Err(TrainError::PlanMismatch(mismatch)) => assert!(
                mismatch.message.contains("param_gather"),
                "{label}: {mismatch}"
            ),
            Err(other) => panic!("{label}: refused for another reason: {other}"),
            Ok(_) => panic!("{label}: a plan without its gather ran"),
        }
    }
}

/// The plan's gradient-norm rule (`run.clip`) decides whether the norm is summed over the
/// ranks: stage 1's `ZeroF32` all-reduces it once per step, `FP16_Optimizer`'s rule (the norm
/// of the rank's own, already averaged gradient) does not. Changing that field of the plan
/// removes exactly one all-reduce per step.
#[test]
fn the_plans_clip_rule_sets_the_norm_reduction() {
    let extra = json!({"zero_optimization": {"stage": 1}, "gradient_clipping": 1.0});
    let (plan, zero) = run_edited(extra.clone(), |_| {});
    assert_eq!(plan.run.clip, ClipRule::ZeroF32);
    let (edited, local) = run_edited(extra, |plan| plan.run.clip = ClipRule::Fp16Optimizer);
    assert_eq!(edited.run.clip, ClipRule::Fp16Optimizer);
    let (zero, local) = (zero.expect("runs"), local.expect("runs"));
    let calls = |r: &TrainReport| r.traffic[0].all_reduce.calls;
    eprintln!(
        "stage 1: all-reduces with the plan's rule {}, with the local rule {}",
        calls(&zero),
        calls(&local)
    );
    assert_eq!(calls(&zero) - calls(&local), STEPS);
    assert_eq!(
        (zero.traffic[0].all_gather, zero.traffic[0].reduce_scatter),
        (local.traffic[0].all_gather, local.traffic[0].reduce_scatter),
        "nothing else changes"
    );
}

/// Every stage allocates its run-long buffers from the plan's list: one listed buffer grown or
/// shrunk by an element makes the run stop before its first step with a plan mismatch naming
/// that buffer (the list and the rank's stage disagree), where the unaltered plan runs.
#[test]
fn the_rank_allocates_what_the_plans_buffer_list_says() {
    let nvme = std::env::temp_dir().join(format!("dsplan-listed-{}", std::process::id()));
    std::fs::create_dir_all(&nvme).expect("a scratch directory");
    let offloaded = json!({
        "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "buffer_count": 4},
        "offload_param": {"device": "nvme", "nvme_path": nvme, "buffer_count": 2,
            "buffer_size": 20_000},
    });
    let altered = [
        (0, "parameters", 1i64),
        (1, "fp32 master weights", -1),
        (1, "accumulated gradients", 1),
        (2, "gradient bucket (f32)", -1),
        (2, "optimizer state 1", 1),
        (3, "persistent parameters (whole)", 1),
        (3, "reduce-scatter output (f32)", -1),
        (3, "gradient bucket, per-rank layout (f32)", 1),
        (3, "optimizer swap buffers (f32)", 1),
        (3, "parameter swap buffers", -1),
    ];
    for (stage, name, by) in altered {
        let mut zero = json!({"stage": stage, "reduce_bucket_size": 20_000,
            "stage3_param_persistence_threshold": 100});
        if name.contains("swap") {
            zero.as_object_mut()
                .expect("an object")
                .extend(offloaded.as_object().expect("an object").clone());
        }
        let (spec, mut plan) = planned(json!({"zero_optimization": zero}));
        let buffer = plan
            .buffers
            .iter_mut()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("stage {stage}: the plan lists `{name}`"));
        buffer.numel = buffer.numel.saturating_add_signed(by);
        match train_planned(&spec, &plan, &|_| {}) {
            Err(TrainError::Rank {
                error: ZeroError::PlanMismatch(mismatch),
                ..
            }) => {
                eprintln!("stage {stage}, `{name}` {by:+}: {mismatch}");
                assert!(
                    mismatch.message.contains(&format!("`{name}`")),
                    "stage {stage}: the error names `{name}`: {mismatch}"
                );
            }
            other => panic!("stage {stage}, `{name}` {by:+}: refused, not {other:?}"),
        }
    }
    let left = std::fs::read_dir(&nvme).map_or(0, |d| d.count());
    std::fs::remove_dir_all(&nvme).ok();
    assert_eq!(left, 0, "a refused rank leaves no swap files");
}

/// A plan compiled for another backend lists that backend's buffers; the ranks then allocate
/// what the `dsplan-cpu` backend derives from the same plan, which is the list a `dsplan-cpu`
/// plan carries.
#[test]
fn a_plan_for_another_backend_is_sized_by_the_dsplan_cpu_list() {
    for stage in 0..=3 {
        let (_, plan) =
            planned(json!({"zero_optimization": {"stage": stage, "reduce_bucket_size": 20_000}}));
        let listed = ListedBuffers::of_plan(&plan);
        assert_ne!(listed, ListedBuffers::default(), "stage {stage}: a list");
        let mut other = plan.clone();
        other.settings.backend = PlanBackend::DeepspeedGpu;
        other.buffers.clear();
        assert_eq!(
            ListedBuffers::of_plan(&other),
            listed,
            "stage {stage}: derived as compiled"
        );
    }
}
