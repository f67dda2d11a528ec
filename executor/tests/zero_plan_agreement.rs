//! The executor's interim sharding arithmetic (`zero::partition::ShardPlan`) against the
//! planner's execution plan (`planner::plan::compile`) for the same model and config: the
//! padded flat buffer and partition size (stages 1/2), the gradient buckets and their tensors
//! in readiness order (stages 2/3), and stage 3's persistent set. When they agree, swapping
//! the one for the other changes nothing the engines compute.

use dsplan_executor::model::{Gpt2Config, ParamLayout};
use dsplan_executor::zero::{ShardOptions, ShardPlan};
use dsplan_planner::config;
use dsplan_planner::model::{Architecture, Embeddings, Family};
use dsplan_planner::plan::{self, Cluster, ModelGraph, Workload};
use serde_json::json;

fn architecture(config: &Gpt2Config) -> Architecture {
    let as_u64 = |n: usize| n as u64;
    Architecture {
        family: Family::Gpt2,
        layers: as_u64(config.n_layer),
        hidden: as_u64(config.n_embd),
        heads: as_u64(config.n_head),
        kv_heads: as_u64(config.n_head),
        head_dim: as_u64(config.head_dim()),
        intermediate: 4 * as_u64(config.n_embd),
        vocab: as_u64(config.vocab_size),
        positions: Some(as_u64(config.n_positions)),
        embeddings: Embeddings::Tied,
    }
}

fn check(model: &Gpt2Config, stage: u64, world: u64, bucket: u64, persistence: u64) {
    let ds = config::from_value(&json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": bucket,
            "stage3_param_persistence_threshold": persistence}
    }))
    .expect("config");
    let graph = ModelGraph::from_architecture("gpt2", &architecture(model)).expect("graph");
    let cluster = Cluster::new(world, 8).expect("cluster");
    let planned = plan::compile(&ds, &graph, &cluster, &Workload::default()).expect("plan");
    let ours = ShardPlan::new(
        &ParamLayout::new(model),
        world as usize,
        ShardOptions {
            reduce_bucket_size: bucket as usize,
            param_persistence_threshold: persistence,
            model_persistence_threshold: u64::MAX,
        },
    );
    let what = format!("stage {stage}, world {world}, bucket {bucket}");
    if stage == 1 || stage == 2 {
        assert_eq!(
            planned.layout.padded_numel as usize,
            ours.flat().padded,
            "{what}"
        );
        assert_eq!(
            planned.layout.partition_numel as usize,
            ours.flat().partition,
            "{what}"
        );
    }
    if stage >= 2 {
        let theirs: Vec<Vec<usize>> = planned
            .buckets
            .reduce
            .iter()
            .map(|b| b.tensors.clone())
            .collect();
        let mine: Vec<Vec<usize>> = ours.buckets().iter().map(|b| b.tensors.clone()).collect();
        assert_eq!(theirs, mine, "{what}: buckets");
    }
    if stage == 3 {
        let theirs = planned
            .shards
            .persistent
            .as_ref()
            .map(|p| p.entries.clone())
            .unwrap_or_default();
        let mine: Vec<usize> = ours.persistent_tensors().collect();
        assert_eq!(theirs, mine, "{what}: persistent tensors");
    }
}

#[test]
fn the_interim_shards_and_buckets_are_the_plans() {
    let tiny = Gpt2Config {
        vocab_size: 256,
        n_positions: 64,
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        layer_norm_epsilon: 1e-5,
    };
    for (stage, world) in [(1, 2), (2, 2), (2, 3), (3, 2), (3, 4)] {
        for bucket in [20_000, 500_000_000] {
            check(&tiny, stage, world, bucket, 100);
        }
    }
    check(&Gpt2Config::gpt2(), 2, 8, 50_000_000, 100_000);
    check(&Gpt2Config::gpt2(), 3, 8, 50_000_000, 100_000);
}
