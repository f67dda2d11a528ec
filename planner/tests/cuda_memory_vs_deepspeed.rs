//! dsplan's CUDA executor never needs more GPU memory than DeepSpeed for the same job: the
//! `dsplan-cuda` plan of each of 24 jobs (GPT-2 XL, Llama-3-8B and Qwen2-7B; ZeRO stages 0-3;
//! 2 and 8 GPUs; bf16, AdamW, DeepSpeed's default buckets, `overlap_comm`, micro-batch 2,
//! 2,048 tokens, activation checkpointing) plans, and its per-GPU peak is at most the
//! `deepspeed-gpu` plan's. The table is printed (`--nocapture`) with both peaks and the ratio.

mod plan_support;

use dsplan_planner::plan::{self, Checkpointing, Cluster, Device, Plan, PlanBackend, Workload};
use plan_support::{config, preset};
use serde_json::json;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn plan_of(model: &str, stage: u64, world: u64, backend: PlanBackend) -> Plan {
    let config = config(json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
        "zero_optimization": {"stage": stage, "overlap_comm": true},
    }));
    let workload = Workload {
        sequence_length: Some(2048),
        checkpointing: Checkpointing::Full,
        ..Workload::for_backend(backend, &config)
    };
    let cluster = Cluster::new(world, 8).expect("cluster");
    plan::compile(&config, &preset(model), &cluster, &workload).unwrap_or_else(|d| {
        panic!(
            "{model} stage {stage} W={world} {}: refused: {:?}",
            backend.as_str(),
            d.iter().map(|d| &d.message).collect::<Vec<_>>()
        )
    })
}

#[test]
fn every_job_of_the_grid_plans_within_deepspeeds_peak() {
    let mut over = Vec::new();
    eprintln!("| model | stage | GPUs | deepspeed-gpu | dsplan-cuda | ratio |");
    eprintln!("|---|---|---|---|---|---|");
    for model in ["gpt2-xl", "llama-3-8b", "qwen2-7b"] {
        for stage in 0..=3 {
            for world in [2, 8] {
                let deepspeed = plan_of(model, stage, world, PlanBackend::DeepspeedGpu)
                    .timeline
                    .peak_bytes(Device::Gpu);
                let dsplan = plan_of(model, stage, world, PlanBackend::DsplanCuda)
                    .timeline
                    .peak_bytes(Device::Gpu);
                eprintln!(
                    "| {model} | {stage} | {world} | {:.2} GiB | {:.2} GiB | {:.3} |",
                    deepspeed as f64 / GIB,
                    dsplan as f64 / GIB,
                    dsplan as f64 / deepspeed as f64
                );
                if dsplan > deepspeed {
                    over.push(format!(
                        "{model} stage {stage} W={world}: {dsplan} > {deepspeed}"
                    ));
                }
            }
        }
    }
    assert!(over.is_empty(), "{over:#?}");
}
