//! ZeRO-Offload on the `dsplan-cuda` backend (issue 30): the issue's jobs plan (bf16, AdamW,
//! full activation checkpointing, micro-batch 2, 2,048 tokens), each within the
//! `deepspeed-gpu` plan's per-GPU peak, with its host buffers and copies listed; the offload
//! keys are honoured or refused by name; the host pre-flight names the buffer that does not
//! fit. The table (`--nocapture`) prints both device peaks and both host peaks.

mod plan_support;

use dsplan_planner::plan::cuda_offload::preflight::{HostLimit, HostMemory, check_host};
use dsplan_planner::plan::settings::Pinning;
use dsplan_planner::plan::{
    self, BufferKind, Checkpointing, Cluster, Device, Plan, PlanBackend, Workload,
};
use plan_support::{config, preset};
use serde_json::{Value, json};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// One job of the grid: model, ZeRO stage, GPUs, the offload sections.
struct Job {
    model: &'static str,
    stage: u64,
    world: u64,
    offload: Value,
}

fn cpu() -> Value {
    json!({"device": "cpu", "pin_memory": true})
}

fn nvme() -> Value {
    json!({"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true})
}

/// The issue's jobs.
fn jobs() -> Vec<Job> {
    let job = |model, stage, world, offload| Job {
        model,
        stage,
        world,
        offload,
    };
    vec![
        job("llama-3-8b", 2, 1, json!({"offload_optimizer": cpu()})),
        job("llama-3-8b", 3, 1, json!({"offload_optimizer": cpu()})),
        job(
            "llama-3-8b",
            3,
            1,
            json!({"offload_optimizer": cpu(), "offload_param": cpu()}),
        ),
        job("qwen2-7b", 2, 2, json!({"offload_optimizer": cpu()})),
        job(
            "qwen2-7b",
            3,
            8,
            json!({"offload_optimizer": cpu(), "offload_param": cpu()}),
        ),
        job("gpt2-xl", 1, 2, json!({"offload_optimizer": cpu()})),
        job(
            "gpt2-xl",
            3,
            1,
            json!({"offload_optimizer": nvme(), "offload_param": nvme()}),
        ),
    ]
}

fn compile(job: &Job, backend: PlanBackend) -> Result<Plan, Vec<String>> {
    let mut zero = json!({"stage": job.stage, "overlap_comm": true});
    if let (Some(zero), Some(extra)) = (zero.as_object_mut(), job.offload.as_object()) {
        zero.extend(extra.clone());
    }
    let config = config(json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5}},
        "zero_optimization": zero,
    }));
    let workload = Workload {
        sequence_length: Some(2048),
        checkpointing: Checkpointing::Full,
        ..Workload::for_backend(backend, &config)
    };
    let cluster = Cluster::new(job.world, 8).expect("cluster");
    plan::compile(&config, &preset(job.model), &cluster, &workload).map_err(|d| {
        d.iter()
            .map(|d| format!("{}: {}", d.pointer, d.message))
            .collect()
    })
}

fn planned(job: &Job, backend: PlanBackend) -> Plan {
    compile(job, backend).unwrap_or_else(|e| {
        panic!(
            "{} stage {} W={} {}: refused: {e:?}",
            job.model,
            job.stage,
            job.world,
            backend.as_str()
        )
    })
}

fn host_bytes(plan: &Plan) -> u64 {
    plan.buffers
        .iter()
        .filter(|b| b.device == Device::Cpu)
        .map(|b| b.bytes)
        .sum()
}

#[test]
fn every_job_of_the_issue_plans_within_deepspeeds_device_peak_and_lists_host_buffers() {
    let mut over = Vec::new();
    eprintln!(
        "| model | stage | GPUs | offload | deepspeed-gpu GPU | dsplan-cuda GPU | ratio | deepspeed-gpu host | dsplan-cuda host | D2H / step | H2D / step |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|---|");
    for job in jobs() {
        let deepspeed = planned(&job, PlanBackend::DeepspeedGpu);
        let dsplan = planned(&job, PlanBackend::DsplanCuda);
        let (ds_gpu, our_gpu) = (
            deepspeed.timeline.peak_bytes(Device::Gpu),
            dsplan.timeline.peak_bytes(Device::Gpu),
        );
        let (ds_host, our_host) = (
            deepspeed.timeline.peak_bytes(Device::Cpu),
            dsplan.timeline.peak_bytes(Device::Cpu),
        );
        let totals = dsplan.offload.totals;
        eprintln!(
            "| {} | {} | {} | {} | {:.2} GiB | {:.2} GiB | {:.3} | {:.2} GiB | {:.2} GiB | {:.2} GiB | {:.2} GiB |",
            job.model,
            job.stage,
            job.world,
            job.offload,
            ds_gpu as f64 / GIB,
            our_gpu as f64 / GIB,
            our_gpu as f64 / ds_gpu as f64,
            ds_host as f64 / GIB,
            our_host as f64 / GIB,
            totals.device_to_host as f64 / GIB,
            totals.host_to_device as f64 / GIB,
        );
        let name = format!("{} stage {} W={}", job.model, job.stage, job.world);
        if our_gpu > ds_gpu {
            over.push(format!("{name}: {our_gpu} > {ds_gpu}"));
        }
        // Every buffer lives for the run: each device's peak is its buffers' sum, to the byte.
        for device in [Device::Gpu, Device::Cpu] {
            let sum: u64 = dsplan
                .buffers
                .iter()
                .filter(|b| b.device == device)
                .map(|b| b.bytes)
                .sum();
            assert_eq!(dsplan.timeline.peak_bytes(device), sum, "{name} {device:?}");
        }
        assert!(our_host > 0 && our_host == host_bytes(&dsplan), "{name}");
        // The GPU holds no master or moment of an offloaded partition.
        assert!(
            !dsplan.buffers.iter().any(|b| b.device == Device::Gpu
                && matches!(
                    b.kind,
                    BufferKind::MasterWeights | BufferKind::OptimizerStates
                )),
            "{name}"
        );
        // The gradients cross once per step, in bf16: the host staging's size in bytes.
        let staging = dsplan
            .buffers
            .iter()
            .find(|b| b.name.starts_with("gradient staging"))
            .unwrap_or_else(|| panic!("{name}: no gradient staging"));
        assert_eq!(staging.dtype.bytes(), 2, "{name}");
        assert_eq!(totals.device_to_host, staging.bytes, "{name}");
        assert!(totals.host_to_device > 0, "{name}");
    }
    assert!(over.is_empty(), "{over:#?}");
}

#[test]
fn llama_3_8b_with_both_offloads_fits_128_gib_of_host_where_deepspeeds_plan_does_not() {
    let job = Job {
        model: "llama-3-8b",
        stage: 3,
        world: 1,
        offload: json!({"offload_optimizer": cpu(), "offload_param": cpu()}),
    };
    let machine = HostMemory {
        ram: 128 << 30,
        pinnable: 128 << 30,
    };
    let dsplan = planned(&job, PlanBackend::DsplanCuda);
    let need = check_host(&dsplan, machine).expect("fits");
    // 16 bytes a parameter: fp32 master and moments, bf16 gradients and parameters.
    let psi = dsplan.model.total_params;
    assert_eq!(need.total, 16 * psi);
    // Pinned: the bf16 gradient staging and parameter slices only.
    assert_eq!(need.pinned, 4 * psi);
    let deepspeed = planned(&job, PlanBackend::DeepspeedGpu);
    let short = check_host(&deepspeed, machine).expect_err("DeepSpeed's host layout");
    assert_eq!(short.limit, HostLimit::Ram);
    assert!(short.needed > machine.ram, "{short}");
}

#[test]
fn the_host_preflight_names_the_buffer_that_does_not_fit() {
    let job = Job {
        model: "gpt2-xl",
        stage: 2,
        world: 1,
        offload: json!({"offload_optimizer": cpu()}),
    };
    let plan = planned(&job, PlanBackend::DsplanCuda);
    let master = plan
        .buffers
        .iter()
        .find(|b| b.name == "fp32 master (host)")
        .expect("host master");
    // RAM for the master and not one byte more: the first moment crosses.
    let short = check_host(
        &plan,
        HostMemory {
            ram: master.bytes,
            pinnable: u64::MAX,
        },
    )
    .expect_err("short of RAM");
    assert_eq!(short.limit, HostLimit::Ram);
    assert_eq!(short.buffer, "AdamW exp_avg (host)");
    assert!(
        short.to_string().contains("AdamW exp_avg (host)"),
        "{short}"
    );
    // Pinnable memory below the gradient staging.
    let short = check_host(
        &plan,
        HostMemory {
            ram: u64::MAX,
            pinnable: 1 << 20,
        },
    )
    .expect_err("short of pinnable memory");
    assert_eq!(short.limit, HostLimit::Pinnable);
    assert_eq!(short.buffer, "gradient staging (host, bf16)");
    assert!(short.to_string().contains("pin_memory: false"), "{short}");
}

fn small_job(stage: u64, offload_optimizer: Value, extra: Value) -> Job {
    let mut offload = json!({"offload_optimizer": offload_optimizer});
    if let (Some(offload), Some(extra)) = (offload.as_object_mut(), extra.as_object()) {
        offload.extend(extra.clone());
    }
    Job {
        model: "gpt2-xl",
        stage,
        world: 2,
        offload,
    }
}

#[test]
fn pin_memory_false_leaves_every_copied_buffer_pageable() {
    let job = small_job(2, json!({"device": "cpu", "pin_memory": false}), json!({}));
    let plan = planned(&job, PlanBackend::DsplanCuda);
    let host: Vec<_> = plan
        .buffers
        .iter()
        .filter(|b| b.device == Device::Cpu)
        .collect();
    assert!(host.len() >= 4);
    assert!(host.iter().all(|b| b.pinning == Some(Pinning::Pageable)));
}

#[test]
fn ratio_keeps_the_later_sub_groups_optimizer_on_the_gpu() {
    let sub_groups = json!({"sub_group_size": 100_000_000});
    let whole = planned(
        &small_job(3, cpu(), sub_groups.clone()),
        PlanBackend::DsplanCuda,
    );
    let mut half_cpu = cpu();
    half_cpu["ratio"] = json!(0.5);
    let half = planned(&small_job(3, half_cpu, sub_groups), PlanBackend::DsplanCuda);
    let on = |plan: &Plan, device: Device, kind: BufferKind| -> u64 {
        plan.buffers
            .iter()
            .filter(|b| b.device == device && b.kind == kind)
            .map(|b| b.numel)
            .sum()
    };
    let groups = &half.shards.sub_groups;
    assert!(groups.len() >= 4, "{}", groups.len());
    let kept: u64 = groups
        .iter()
        .filter(|g| g.device == Device::Gpu)
        .map(|g| g.partition_numel)
        .sum();
    assert!(kept > 0);
    assert_eq!(on(&half, Device::Gpu, BufferKind::MasterWeights), kept);
    assert_eq!(
        on(&half, Device::Cpu, BufferKind::MasterWeights) + kept,
        on(&whole, Device::Cpu, BufferKind::MasterWeights)
    );
    assert!(half.timeline.peak_bytes(Device::Gpu) > whole.timeline.peak_bytes(Device::Gpu));
    assert!(half.offload.totals.device_to_host < whole.offload.totals.device_to_host);
}

#[test]
fn sub_group_size_sets_the_host_steps_and_the_nvme_swap_buffers() {
    let swap = |plan: &Plan| {
        plan.buffers
            .iter()
            .find(|b| b.kind == BufferKind::OptimizerSwapBuffers)
            .map(|b| b.numel)
            .expect("swap buffers")
    };
    let copies_back = |plan: &Plan| {
        plan.offload
            .transfers
            .iter()
            .filter(|t| t.from == Device::Nvme)
            .count()
    };
    let large = planned(
        &small_job(3, nvme(), json!({"sub_group_size": 1_000_000_000})),
        PlanBackend::DsplanCuda,
    );
    let small = planned(
        &small_job(3, nvme(), json!({"sub_group_size": 50_000_000})),
        PlanBackend::DsplanCuda,
    );
    assert!(swap(&small) < swap(&large));
    assert!(copies_back(&small) > copies_back(&large));
}

#[test]
fn super_offload_plans_the_speculative_steps_second_state() {
    let exact = planned(&small_job(2, cpu(), json!({})), PlanBackend::DsplanCuda);
    let mut speculative_cpu = cpu();
    speculative_cpu["super_offload"] = json!(true);
    let speculative = planned(
        &small_job(2, speculative_cpu, json!({})),
        PlanBackend::DsplanCuda,
    );
    let partition = exact.layout.partition_numel;
    assert_eq!(
        host_bytes(&speculative) - host_bytes(&exact),
        12 * partition,
        "a second master and pair of moments"
    );
}

#[test]
fn offload_keys_the_cuda_step_does_not_run_are_refused_by_name() {
    let mut fast = nvme();
    fast["fast_init"] = json!(true);
    let mut two_buffers = nvme();
    two_buffers["buffer_count"] = json!(2);
    let cases = [
        (
            small_job(3, fast, json!({})),
            "/zero_optimization/offload_optimizer/fast_init",
        ),
        (
            small_job(3, two_buffers, json!({})),
            "/zero_optimization/offload_optimizer/buffer_count",
        ),
        (
            Job {
                model: "gpt2-xl",
                stage: 3,
                world: 2,
                offload: json!({"offload_param": cpu()}),
            },
            "/zero_optimization/offload_param",
        ),
    ];
    for (job, pointer) in cases {
        let errors = compile(&job, PlanBackend::DsplanCuda).expect_err(pointer);
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with(&format!("{pointer}: "))),
            "{pointer}: {errors:?}"
        );
        // DeepSpeed's own plan takes the same config.
        compile(&job, PlanBackend::DeepspeedGpu).expect("deepspeed-gpu plans it");
    }
}
