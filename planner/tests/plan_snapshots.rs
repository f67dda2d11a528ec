//! Snapshots of compiled plans for the GPT-2 presets at ZeRO stages 0-3 and world sizes 1, 2
//! and 8: the whole JSON plan of `tiny-gpt2` (the reference fixtures' shape) and the human
//! summary of `gpt2` (124M), as `dsplan plan` prints them.
//! `DSPLAN_UPDATE_SNAPSHOTS=1 cargo test -p dsplan-planner --test plan_snapshots` rewrites them.

mod plan_support;

use serde_json::json;

const STAGES: [u64; 4] = [0, 1, 2, 3];
const WORLDS: [u64; 3] = [1, 2, 8];

/// The reference fixtures' config (deepspeed_zero/README), in bf16: micro-batch 2, AdamW,
/// every tensor partitioned at stage 3 (persistence threshold 0), small buckets so that
/// several are formed, and a prefetch bucket that reaches two modules ahead.
fn tiny_config(stage: u64) -> serde_json::Value {
    json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 20000,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": 20000,
            "stage3_max_reuse_distance": 10000,
            "sub_group_size": 40000
        }
    })
}

#[test]
fn tiny_gpt2_plans_match_their_snapshots() {
    let model = plan_support::preset("tiny-gpt2");
    for stage in STAGES {
        let config = plan_support::config(tiny_config(stage));
        for world in WORLDS {
            let plan = plan_support::compile(&config, &model, world);
            let text = serde_json::to_string_pretty(&plan).expect("json") + "\n";
            let again =
                serde_json::to_string_pretty(&plan_support::compile(&config, &model, world))
                    .expect("json")
                    + "\n";
            assert_eq!(text, again, "compiling twice gives the same plan");
            plan_support::assert_snapshot(
                &format!("tiny-gpt2_stage{stage}_world{world}.json"),
                &text,
            );
        }
    }
}

/// The parts of a `gpt2` plan that fit on a page: settings, layout totals, shards, buckets,
/// stage-3 totals, offload, memory peaks by phase and the step time.
fn digest(plan: &dsplan_planner::plan::Plan) -> serde_json::Value {
    let value = serde_json::to_value(plan).expect("json");
    let layout = &plan.layout;
    let stage3 = plan.stage3.as_ref().map(|s| {
        json!({
            "steps": s.steps.len(),
            "on_demand": s.steps.iter().map(|x| x.on_demand.len()).sum::<usize>(),
            "prefetched": s.steps.iter().map(|x| x.prefetch.len()).sum::<usize>(),
            "kept": s.steps.iter().map(|x| x.kept.len()).sum::<usize>(),
            "released_at_end": s.released_at_end.len(),
            "peak_live_numel": s.peak_live_numel,
            "persistent_numel": s.persistent_numel,
        })
    });
    let buckets: Vec<_> = plan
        .buckets
        .reduce
        .iter()
        .map(|b| json!([b.tensors.len(), b.numel, b.bytes, b.collective, b.flush]))
        .collect();
    let memory: Vec<_> = plan
        .timeline
        .devices
        .iter()
        .map(|d| {
            json!({
                "device": d.device,
                "peak": d.peak.bytes,
                "peak_at": plan.ticks.ticks[d.peak.tick].label,
                "breakdown": d.peak.breakdown,
                "phases": d.phases.iter().map(|p| json!([p.phase, p.bytes])).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "settings": value["settings"],
        "layout": {
            "scheme": layout.scheme,
            "numel": layout.numel,
            "padded_numel": layout.padded_numel,
            "alignment": layout.alignment,
            "partition_numel": layout.partition_numel,
            "first": value["layout"]["entries"][0],
            "last": value["layout"]["entries"][layout.entries.len() - 1],
        },
        "shards": {
            "optimizer_states": value["shards"]["optimizer_states"],
            "gradients": value["shards"]["gradients"],
            "parameters": value["shards"]["parameters"],
            "persistent": plan.shards.persistent.as_ref().map(|p| json!([p.entries.len(), p.numel])),
            "sub_groups": value["shards"]["sub_groups"],
            "ranks": value["shards"]["ranks"],
        },
        "buckets": buckets,
        "param_gather": value["buckets"]["param_gather"],
        "stage3": stage3,
        "offload": value["offload"]["totals"],
        "buffers": plan.buffers.len(),
        "memory": memory,
        "ops": plan.graph.as_ref().map_or(0, |g| g.ops.len()),
        "critical_path": plan.graph.as_ref().map_or(0, |g| g.critical_path.len()),
        "step": value["graph"]["step"],
        "diagnostics": value["diagnostics"],
    })
}

#[test]
fn gpt2_plan_digests_match_their_snapshots() {
    let model = plan_support::preset("gpt2");
    for stage in STAGES {
        let config = plan_support::config(json!({
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
            "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW"},
            "zero_optimization": {"stage": stage, "reduce_bucket_size": 50000000}
        }));
        for world in WORLDS {
            let plan = plan_support::compile(&config, &model, world);
            let text = serde_json::to_string_pretty(&digest(&plan)).expect("json") + "\n";
            plan_support::assert_snapshot(&format!("gpt2_stage{stage}_world{world}.json"), &text);
        }
    }
}
