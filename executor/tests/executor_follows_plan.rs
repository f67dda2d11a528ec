//! The executor follows the plan: a plan field changed through the config key that sets it
//! (the gradient bucket size, stage 3's persistence threshold) changes what the executor does
//! in the same way. Its collectives (counted per kind by the rank's `Comm`, `CommTraffic`) are
//! the plan's, one per planned bucket per step with the planned collective, and fewer gathered
//! bytes when the plan keeps more tensors whole; its measured memory moves with the plan's, to
//! the byte. The rank's run-long buffers are the plan's buffer list: a listed size changed is
//! refused, naming the buffer.
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
use dsplan_planner::plan::{Collective, ModelGraph, Plan, PlanBackend};
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

/// The run of `zero`, and its plan and graph.
fn planned(zero: Value) -> (TrainSpec, Plan, ModelGraph) {
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": zero,
    });
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
    let (plan, graph) =
        compile_plan(&spec.settings, &spec.model, spec.seq_len, WORLD).expect("the plan compiles");
    (spec, plan, graph)
}

/// Compiles the plan of `zero` and runs it.
fn run(zero: Value) -> (Plan, TrainReport) {
    let (spec, plan, graph) = planned(zero);
    let report = train_planned(&spec, &plan, &graph, &|_| {}).expect("training runs");
    assert_eq!(report.applied_steps, STEPS);
    (plan, report)
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
        let (spec, mut plan, graph) = planned(zero);
        let buffer = plan
            .buffers
            .iter_mut()
            .find(|b| b.name == name)
            .unwrap_or_else(|| panic!("stage {stage}: the plan lists `{name}`"));
        buffer.numel = buffer.numel.saturating_add_signed(by);
        match train_planned(&spec, &plan, &graph, &|_| {}) {
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
        let (_, plan, graph) = planned(json!({"stage": stage, "reduce_bucket_size": 20_000}));
        let listed = ListedBuffers::of_plan(&plan, &graph);
        assert_ne!(listed, ListedBuffers::default(), "stage {stage}: a list");
        let mut other = plan.clone();
        other.settings.backend = PlanBackend::DeepspeedGpu;
        other.buffers.clear();
        assert_eq!(
            ListedBuffers::of_plan(&other, &graph),
            listed,
            "stage {stage}: derived as compiled"
        );
    }
}
