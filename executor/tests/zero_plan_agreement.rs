//! The engines read the execution plan (`planner::plan::compile`) through
//! `zero::EnginePlan`, which decides nothing itself: its flat padding and partition (stages
//! 1/2), gradient buckets (tensors, order, collective), stage 3 slices and persistent set are
//! the plan's, and a plan compiled for another model, world or flat order is refused when the
//! run starts.

use dsplan_executor::model::{Gpt2Config, ParamLayout};
use dsplan_executor::train::plan::{architecture, cpu_workload};
use dsplan_executor::zero::EnginePlan;
use dsplan_planner::config;
use dsplan_planner::plan::shards::Shards;
use dsplan_planner::plan::{self, Cluster, ModelGraph, Plan};
use serde_json::{Value, json};

const TINY: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 64,
    n_embd: 64,
    n_layer: 2,
    n_head: 4,
    layer_norm_epsilon: 1e-5,
};

fn compile(model: &Gpt2Config, world: u64, zero: Value) -> Plan {
    let ds = config::from_value(&json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": zero,
    }))
    .expect("config");
    let graph =
        ModelGraph::from_architecture("gpt2", &architecture(&(*model).into())).expect("graph");
    let cluster = Cluster::new(world, world).expect("cluster");
    plan::compile(&ds, &graph, &cluster, &cpu_workload(32)).expect("plan")
}

fn check(model: &Gpt2Config, stage: u64, world: u64, bucket: u64, persistence: u64) {
    let zero = json!({"stage": stage, "reduce_bucket_size": bucket,
        "stage3_param_persistence_threshold": persistence, "allgather_bucket_size": 4000});
    let planned = compile(model, world, zero);
    let ours = EnginePlan::from_plan(&planned, &ParamLayout::new(model)).expect("fits");
    let what = format!("stage {stage}, world {world}, bucket {bucket}");
    assert_eq!(ours.world() as u64, world, "{what}");
    if stage <= 2 {
        assert_eq!(
            ours.flat().padded as u64,
            planned.layout.padded_numel,
            "{what}"
        );
        assert_eq!(
            ours.flat().partition as u64,
            planned.layout.partition_numel,
            "{what}"
        );
        if stage > 0 {
            assert_eq!(ours.flat().padded % (2 * world as usize), 0, "{what}");
        }
    }
    let theirs: Vec<(Vec<usize>, _)> = planned
        .buckets
        .reduce
        .iter()
        .map(|b| (b.tensors.clone(), b.collective))
        .collect();
    let mine: Vec<(Vec<usize>, _)> = ours
        .buckets()
        .iter()
        .map(|b| (b.tensors.clone(), b.collective))
        .collect();
    assert_eq!(theirs, mine, "{what}: buckets");
    match &planned.buckets.param_gather {
        Some(gather) => {
            let pieces: Vec<(u64, u64)> = gather.shards.iter().map(|r| (r.start, r.end)).collect();
            let mine: Vec<(u64, u64)> = ours
                .param_gather()
                .iter()
                .map(|r| (r.start as u64, r.end as u64))
                .collect();
            assert_eq!(pieces, mine, "{what}: parameter all-gather");
        }
        None => assert!(ours.param_gather().is_empty(), "{what}"),
    }
    if stage == 3 {
        let theirs: Vec<usize> = planned
            .shards
            .persistent
            .as_ref()
            .map(|p| {
                p.entries
                    .iter()
                    .map(|&e| planned.layout.entries[e].tensor)
                    .collect()
            })
            .unwrap_or_default();
        let mine: Vec<usize> = ours.persistent_tensors().collect();
        assert_eq!(theirs, mine, "{what}: persistent tensors");
        assert_eq!(ours.shards().len() as u64, planned.layout.partition_numel);
        // Every rank's pieces are the plan's owned ranges, in model element space.
        for rank in 0..world {
            let owned =
                Shards::owned_ranges(&planned.layout, planned.shards.parameters, world, rank);
            let mine: Vec<(u64, u64)> = ours
                .tensors()
                .iter()
                .enumerate()
                .map(|(t, span)| {
                    let piece = ours.shards().piece(t, rank as usize);
                    (
                        (span.offset + piece.start) as u64,
                        (span.offset + piece.end) as u64,
                    )
                })
                .filter(|(a, b)| b > a)
                .collect();
            let theirs: Vec<(u64, u64)> = owned.iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(theirs, mine, "{what}: rank {rank}'s slices");
        }
        // A fetch of a model unit gathers the non-persistent tensors of the plan's units in it.
        let fetched: usize = ours.units().iter().map(|u| u.fetch.len()).sum();
        let not_persistent = (0..ours.tensors().len())
            .filter(|&t| !ours.is_persistent(t))
            .count();
        assert_eq!(fetched, not_persistent, "{what}");
    }
}

#[test]
fn the_engines_read_the_plans_shards_and_buckets() {
    for (stage, world) in [(0, 2), (1, 1), (1, 2), (2, 2), (2, 3), (3, 2), (3, 4)] {
        for bucket in [20_000, 500_000_000] {
            check(&TINY, stage, world, bucket, 100);
        }
    }
    check(&Gpt2Config::gpt2(), 2, 8, 50_000_000, 100_000);
    check(&Gpt2Config::gpt2(), 3, 8, 50_000_000, 100_000);
}

#[test]
fn a_plan_for_another_model_or_order_is_refused() {
    let planned = compile(&TINY, 2, json!({"stage": 2}));
    let wider = Gpt2Config {
        n_embd: 32,
        n_head: 2,
        ..TINY
    };
    let error = EnginePlan::from_plan(&planned, &ParamLayout::new(&wider)).expect_err("mismatch");
    assert!(error.to_string().contains("elements"), "{error}");

    let planned = compile(&TINY, 2, json!({"stage": 2, "round_robin_gradients": true}));
    let error = EnginePlan::from_plan(&planned, &ParamLayout::new(&TINY)).expect_err("order");
    assert!(
        error.to_string().contains("round_robin_gradients"),
        "{error}"
    );
}
