//! Each rank's measured peak memory against the plan's prediction. The run's plan is compiled
//! with the `dsplan-cpu` backend (`planner::plan::cpu_buffers`), whose buffer list over the
//! step's ticks is what the executor allocates: every category's peak and the peak total are
//! equal to the byte, for fp32, bf16 and fp16, ZeRO stages 0-3, world sizes 1, 2 and 4 on the
//! tiny GPT-2, and with optimizer offload to the CPU (which the CPU backend has nothing to copy
//! for: the plan lists no offload staging), and with gradient accumulation. Under stage 3
//! offload to NVMe (optimizer only; optimizer and parameters, some slices past `max_in_cpu`)
//! the swap buffers are counted in memory like the plan's, and each rank's swap files hold
//! exactly the plan's bytes on NVMe. With activation checkpointing (an
//! `activation_checkpointing` section) the arena keeps each block's input and one shared
//! working set: measured = plan again, and the activations' peak drops by exactly the planned
//! arena difference.
//!
//! Prints the table (measured / plan, bytes) with `--nocapture`.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::{ParamLayout, init_params};
use dsplan_executor::train::{
    DataChoice, TrainReport, TrainSettings, TrainSpec, choose_model, train,
};
use serde_json::{Value, json};

fn run(stage: u8, world: u64, precision: &Value, zero_extra: &Value) -> TrainReport {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 20000,
            "stage3_param_persistence_threshold": 100},
    });
    if let (Some(target), Some(extra)) = (config.as_object_mut(), precision.as_object()) {
        target.extend(extra.clone());
    }
    if let (Some(zero), Some(extra)) = (
        config["zero_optimization"].as_object_mut(),
        zero_extra.as_object(),
    ) {
        zero.extend(extra.clone());
    }
    let settings = TrainSettings::from_config(&config, world as usize).expect("config");
    let model = choose_model(None, 5)
        .expect("tiny-gpt2")
        .config
        .gpt2()
        .copied()
        .expect("a GPT-2");
    let spec = TrainSpec {
        settings,
        model: model.into(),
        initial_params: init_params(&model, &ParamLayout::new(&model), 5),
        data: DataChoice::Bundled {
            order: WindowOrder::Sequential,
        },
        seq_len: 64,
        steps: 2,
        world: world as usize,
    };
    train(&spec, &|_| {}).expect("training runs")
}

/// Checks one run to the byte and returns its table row.
fn check(label: &str, report: &TrainReport) -> String {
    for rank in &report.memory {
        assert_eq!(rank, &report.memory[0], "{label}: ranks hold the same");
    }
    assert!(report.applied_steps > 0, "{label}: no step applied");
    let measured = report.memory[0];
    let plan = report.plan_memory;
    let mut row = format!(
        "| {label} | {} / {} |",
        measured.peak_total, plan.peak_total
    );
    for &(category, relation) in &report.correspondence {
        let (got, planned) = (measured.peak.get(category), plan.peak.get(category));
        assert!(relation.is_same(), "{label}: {}", category.name());
        assert_eq!(
            got,
            planned,
            "{label}: {} measured vs plan",
            category.name()
        );
        assert_eq!(report.predicted.get(category), planned, "{label}");
        row.push_str(&format!(" {got} / {planned} |"));
    }
    assert_eq!(
        measured.peak_total, plan.peak_total,
        "{label}: total at the peak, measured vs plan"
    );
    assert_eq!(
        plan.offload_staging, 0,
        "{label}: nothing to stage on a CPU"
    );
    assert!(measured.peak.get(Category::Activations) > 0, "{label}");
    row.push('\n');
    row
}

#[test]
fn measured_memory_is_the_plans_to_the_byte() {
    let mut table = String::from(
        "| run | total | params | gathered | master | grads | optimizer | buckets | step scratch | activations |\n",
    );
    table.push_str(&format!("|{}\n", "---|".repeat(10)));
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
        // A small initial scale, so that the steps apply (a skipped step never gathers the
        // parameters after the optimizer step; the plan describes an applied one).
        (
            "fp16",
            json!({"fp16": {"enabled": true, "initial_scale_power": 8}}),
        ),
    ] {
        for stage in 0..=3u8 {
            for world in [1u64, 2, 4] {
                let report = run(stage, world, &precision, &json!({}));
                table.push_str(&check(&format!("{name} stage {stage} W={world}"), &report));
            }
        }
    }
    let offload = json!({"offload_optimizer": {"device": "cpu"}});
    for stage in [2u8, 3] {
        let report = run(stage, 2, &json!({"bf16": {"enabled": true}}), &offload);
        table.push_str(&check(
            &format!("bf16 stage {stage} W=2 offload_optimizer cpu"),
            &report,
        ));
    }
    for stage in [1u8, 3] {
        let accumulating = json!({"bf16": {"enabled": true}, "gradient_accumulation_steps": 2});
        let report = run(stage, 2, &accumulating, &json!({}));
        table.push_str(&check(
            &format!("bf16 stage {stage} W=2 gradient accumulation 2"),
            &report,
        ));
    }
    eprintln!("measured / plan bytes per rank:\n{table}");
}

#[test]
fn checkpointed_memory_is_the_plans_to_the_byte() {
    use dsplan_planner::memory::{CpuArenaShape, Recompute, arena_bytes};
    let model = *choose_model(None, 5)
        .expect("tiny-gpt2")
        .config
        .gpt2()
        .expect("a GPT-2");
    let arena = |recompute| {
        arena_bytes(&CpuArenaShape {
            layers: model.n_layer as u64,
            hidden: model.n_embd as u64,
            heads: model.n_head as u64,
            intermediate: 4 * model.n_embd as u64,
            vocab: model.vocab_size as u64,
            batch: 2,
            seq_len: 64,
            recompute,
        })
    };
    let saved = arena(Recompute::Nothing) - arena(Recompute::EachLayer);
    assert!(saved > 0);
    let mut table = String::new();
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
        (
            "fp16",
            json!({"fp16": {"enabled": true, "initial_scale_power": 8}}),
        ),
    ] {
        let mut checkpointed = precision.clone();
        checkpointed["activation_checkpointing"] = json!({"cpu_checkpointing": true});
        for stage in 0..=3u8 {
            let label = format!("{name} stage {stage} W=2");
            let kept = run(stage, 2, &precision, &json!({}));
            let report = run(stage, 2, &checkpointed, &json!({}));
            table.push_str(&check(&format!("{label} checkpointing"), &report));
            let activations = |r: &TrainReport| r.memory[0].peak.get(Category::Activations);
            assert_eq!(
                activations(&kept) - activations(&report),
                saved,
                "{label}: the activations drop by the arena difference"
            );
            assert_eq!(
                kept.memory[0].peak_total - report.memory[0].peak_total,
                saved,
                "{label}: the arena lives through the peak"
            );
        }
    }
    eprintln!("measured / plan bytes per rank with checkpointing:\n{table}");
}

/// Stage 3 offload to NVMe into `dir`: the optimizer, and the parameters too when `params`.
fn nvme_offload(dir: &std::path::Path, params: Offloaded) -> Value {
    let mut zero = json!({
        // Several sub-groups, so that the swap buffers are the largest one's, not the shard's.
        "sub_group_size": 20000,
        "offload_optimizer": {"device": "nvme", "nvme_path": dir, "buffer_count": 4},
    });
    if params == Offloaded::OptimizerAndParams {
        // Some slices fit in max_in_cpu, the rest (wte among them) go to NVMe.
        zero["offload_param"] = json!({"device": "nvme", "nvme_path": dir,
            "max_in_cpu": 20000, "buffer_count": 3, "buffer_size": 20000});
    }
    zero
}

/// What goes to NVMe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Offloaded {
    Optimizer,
    OptimizerAndParams,
}

#[test]
fn nvme_offload_memory_and_files_are_the_plans_to_the_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut table = String::from(
        "| run | total | params | gathered | master | grads | optimizer | buckets | step scratch | activations | swap files / plan NVMe |\n",
    );
    table.push_str(&format!("|{}\n", "---|".repeat(11)));
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        for offloaded in [Offloaded::Optimizer, Offloaded::OptimizerAndParams] {
            for world in [1u64, 2] {
                let label = format!("{name} stage 3 W={world} {offloaded:?} on NVMe");
                let report = run(3, world, &precision, &nvme_offload(dir.path(), offloaded));
                let mut row = check(&label, &report);
                let nvme = report.nvme.as_ref().expect("NVMe report");
                assert_eq!(nvme.ranks.len(), world as usize, "{label}");
                assert!(nvme.plan_bytes > 0, "{label}");
                for usage in &nvme.ranks {
                    assert_eq!(usage.resident_bytes, nvme.plan_bytes, "{label}: NVMe bytes");
                    let params_swapped = usage.param_bytes > 0;
                    assert_eq!(
                        params_swapped,
                        offloaded == Offloaded::OptimizerAndParams,
                        "{label}: parameter slices on NVMe"
                    );
                }
                // The master and the states are on NVMe: nothing of them in memory but the
                // swap buffers.
                assert_eq!(report.plan_memory.peak.get(Category::Master), 0, "{label}");
                row.pop();
                row.push_str(&format!(
                    " {} / {} |\n",
                    nvme.ranks[0].resident_bytes, nvme.plan_bytes
                ));
                table.push_str(&row);
            }
        }
    }
    assert!(
        std::fs::read_dir(dir.path())
            .expect("listed")
            .next()
            .is_none(),
        "swap files left behind"
    );
    eprintln!("measured / plan bytes per rank, NVMe offload:\n{table}");
}
