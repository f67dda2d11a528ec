//! Invariants of compiled plans on random model shapes and configs: exact ownership, buckets
//! that cover every gradient once, a stage-3 schedule that gathers before use and releases
//! after, prefetch within its bound, a timeline equal to the sum of live buffers, and a
//! schedule that respects every dependency.

mod plan_support;

use dsplan_planner::model::{Architecture, Bias, Embeddings, Family};
use dsplan_planner::plan::buffers::Lifetime;
use dsplan_planner::plan::shards::{ElementRange, ShardRule, Shards};
use dsplan_planner::plan::{Device, ModelGraph, Plan};
use proptest::prelude::*;
use serde_json::json;

fn architecture() -> impl Strategy<Value = Architecture> {
    (0..3usize, 1..4u64, 1..4u64, 1..5u64, 2..40u64, 1..9u64).prop_map(
        |(family, layers, heads, head_dim, vocab, mlp)| {
            let hidden = heads * head_dim * 2;
            let family = match family {
                0 => Family::Gpt2,
                1 => Family::Llama {
                    attention_bias: Bias::Absent,
                    mlp_bias: Bias::Present,
                },
                _ => Family::Qwen2,
            };
            Architecture {
                family,
                layers,
                hidden,
                heads,
                kv_heads: if family == Family::Gpt2 { heads } else { 1 },
                head_dim: head_dim * 2,
                intermediate: hidden * mlp / 2 + 1,
                vocab,
                positions: Some(vocab + 3),
                embeddings: if vocab % 2 == 0 {
                    Embeddings::Tied
                } else {
                    Embeddings::Untied
                },
            }
        },
    )
}

#[derive(Debug, Clone)]
struct Case {
    stage: u64,
    world: u64,
    bucket: u64,
    prefetch: u64,
    max_live: u64,
    reuse: u64,
    persistence: u64,
    sub_group: u64,
    accumulation: u64,
    overlap: bool,
    contiguous: bool,
    reduce_scatter: bool,
    round_robin: bool,
    offload: u8,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            0..4u64,
            1..13u64,
            1..3000u64,
            0..3000u64,
            0..6000u64,
            0..4000u64,
        ),
        (
            0..300u64,
            1..5000u64,
            1..4u64,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (any::<bool>(), 0..3u8),
    )
        .prop_map(
            |((stage, world, bucket, prefetch, max_live, reuse), rest, (round_robin, offload))| {
                let (persistence, sub_group, accumulation, overlap, contiguous, reduce_scatter) =
                    rest;
                Case {
                    stage,
                    world,
                    bucket,
                    prefetch,
                    max_live,
                    reuse,
                    persistence,
                    sub_group,
                    accumulation,
                    overlap,
                    contiguous,
                    reduce_scatter,
                    round_robin,
                    offload,
                }
            },
        )
}

fn compile(arch: &Architecture, case: &Case) -> (ModelGraph, Plan) {
    let model = ModelGraph::from_architecture("random", arch).expect("graph");
    let offload = match case.offload {
        0 => json!({"device": "none"}),
        1 => json!({"device": "cpu"}),
        _ => json!({"device": "nvme", "nvme_path": "/nvme"}),
    };
    let mut zero = json!({
        "stage": case.stage,
        "reduce_bucket_size": case.bucket,
        "overlap_comm": case.overlap,
        "contiguous_gradients": case.contiguous,
        "reduce_scatter": case.reduce_scatter,
        "round_robin_gradients": case.round_robin,
        "stage3_prefetch_bucket_size": case.prefetch,
        "stage3_max_live_parameters": case.max_live,
        "stage3_max_reuse_distance": case.reuse,
        "stage3_param_persistence_threshold": case.persistence,
        "sub_group_size": case.sub_group,
    });
    if case.stage > 0 {
        zero["offload_optimizer"] = offload;
    }
    let config = plan_support::config(json!({
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": case.accumulation,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW"},
        "zero_optimization": zero,
    }));
    let plan = plan_support::compile(&config, &model, case.world);
    (model, plan)
}

/// Sorted ranges tile [0, numel) with no gap and no overlap.
fn assert_exact_cover(mut ranges: Vec<ElementRange>, numel: u64, what: &str) {
    ranges.retain(|r| !r.is_empty());
    ranges.sort();
    let mut next = 0;
    for range in ranges {
        assert_eq!(range.start, next, "{what}: gap or overlap at {next}");
        next = range.end;
    }
    assert_eq!(next, numel, "{what}: elements not covered");
}

fn check_ownership(plan: &Plan) {
    let shards = &plan.shards;
    let layout = &plan.layout;
    for (rule, what) in [
        (shards.optimizer_states, "optimizer states"),
        (shards.gradients, "gradients"),
        (shards.parameters, "parameters"),
    ] {
        if rule == ShardRule::Replicated {
            continue;
        }
        let ranges = (0..shards.world_size)
            .flat_map(|rank| Shards::owned_ranges(layout, rule, shards.world_size, rank))
            .collect();
        assert_exact_cover(ranges, layout.numel, what);
    }
    // The buffer itself: entries back to back, padding to the alignment.
    let mut offset = 0;
    for entry in &layout.entries {
        assert_eq!(entry.offset, offset, "{}", entry.name);
        offset += entry.partition_numel;
    }
    assert_eq!(layout.padded_numel % layout.alignment, 0);
    assert!(layout.padded_numel >= layout.numel);
    let groups = &shards.sub_groups;
    assert_eq!(groups.first().map(|g| g.first_entry), Some(0));
    assert_eq!(
        groups.last().map(|g| g.end_entry),
        Some(layout.entries.len())
    );
    assert!(
        groups
            .windows(2)
            .all(|w| w[0].end_entry == w[1].first_entry)
    );
    let stepped: u64 = groups.iter().map(|g| g.partition_numel).sum();
    assert_eq!(stepped, layout.partition_numel);
}

fn check_buckets(model: &ModelGraph, plan: &Plan) {
    let mut seen = vec![0u32; model.tensors.len()];
    for bucket in &plan.buckets.reduce {
        for &t in &bucket.tensors {
            seen[t] += 1;
        }
        let numel: u64 = bucket.tensors.iter().map(|&t| model.tensors[t].numel).sum();
        assert_eq!(numel, bucket.numel);
        if bucket.tensors.len() > 1 && plan.settings.stage.number() > 0 {
            assert!(bucket.numel <= plan.buckets.bucket_size, "bucket over size");
        }
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "every gradient in exactly one bucket: {seen:?}"
    );
}

fn check_stage3(model: &ModelGraph, plan: &Plan) {
    let Some(schedule) = &plan.stage3 else { return };
    let s3 = plan.settings.stage3.expect("stage 3 settings");
    let persistent: Vec<usize> = plan
        .shards
        .persistent
        .as_ref()
        .expect("set")
        .entries
        .iter()
        .map(|&e| plan.layout.entries[e].tensor)
        .collect();
    let mut gathered = vec![false; model.tensors.len()];
    for &t in &persistent {
        gathered[t] = true;
    }
    let largest_unit = model
        .units
        .iter()
        .map(|u| model.unit_numel(u))
        .max()
        .unwrap_or(0);
    for step in &schedule.steps {
        for &t in &step.on_demand {
            assert!(!gathered[t], "gathered twice");
            gathered[t] = true;
        }
        if !step.prefetch.is_empty() {
            assert!(
                step.live_before_prefetch < s3.max_live_parameters,
                "prefetch above max_live"
            );
            assert!(
                step.live_numel <= s3.max_live_parameters + largest_unit,
                "prefetch beyond one unit"
            );
        }
        for &t in &step.prefetch {
            assert!(!gathered[t], "prefetched twice");
            gathered[t] = true;
        }
        for &t in &model.units[step.unit].tensors {
            assert!(
                gathered[t],
                "{} not gathered before its {:?}",
                model.tensors[t].name, step.pass
            );
        }
        for &t in &step.released {
            assert!(
                gathered[t] && !persistent.contains(&t),
                "release of a non-gathered tensor"
            );
            gathered[t] = false;
        }
    }
    for &t in &schedule.released_at_end {
        gathered[t] = false;
    }
    for (t, g) in gathered.iter().enumerate() {
        assert_eq!(
            *g,
            persistent.contains(&t),
            "{} left gathered",
            model.tensors[t].name
        );
    }
}

fn check_timeline(plan: &Plan) {
    for device in Device::ALL {
        let naive: Vec<u64> = (0..plan.ticks.len())
            .map(|tick| {
                plan.buffers
                    .iter()
                    .filter(|b| b.device == device && b.lifetime.live_at(tick))
                    .map(|b| b.bytes)
                    .sum()
            })
            .collect();
        let peak = naive.iter().copied().max().unwrap_or(0);
        assert_eq!(plan.timeline.peak_bytes(device), peak, "{device:?} peak");
        if let Some(timeline) = plan.timeline.device(device) {
            assert_eq!(timeline.live_bytes, naive);
        }
    }
    for buffer in &plan.buffers {
        if let Lifetime::Ticks { first, last } = buffer.lifetime {
            assert!(first <= last && last < plan.ticks.len(), "{}", buffer.name);
        }
        assert_eq!(buffer.bytes, buffer.numel * buffer.dtype.bytes());
    }
}

fn check_graph(plan: &Plan) {
    let graph = plan.graph.as_ref().expect("compile builds the op graph");
    let ops = &graph.ops;
    let eps = 1e-3;
    for [from, to] in &graph.edges {
        assert!(from < to);
        assert!(
            ops[*to].start_us + eps >= ops[*from].end_us(),
            "dependency violated"
        );
    }
    for stream in dsplan_planner::plan::Stream::ALL {
        let mut end = 0.0f64;
        for op in ops.iter().filter(|o| o.stream == stream) {
            assert!(
                op.start_us + eps >= end,
                "stream {stream:?} overlaps itself"
            );
            end = op.end_us();
        }
    }
    let makespan = ops.iter().map(|o| o.end_us()).fold(0.0, f64::max);
    assert!(graph.step.step_seconds * 1e6 + eps >= makespan);
    let s = &graph.step;
    assert!(s.communication_hidden_seconds <= s.communication_seconds + 1e-12);
    assert!(!graph.critical_path.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, .. ProptestConfig::default() })]

    #[test]
    fn plans_keep_their_invariants(arch in architecture(), case in case()) {
        let (model, plan) = compile(&arch, &case);
        check_ownership(&plan);
        check_buckets(&model, &plan);
        check_stage3(&model, &plan);
        check_timeline(&plan);
        check_graph(&plan);
    }
}
