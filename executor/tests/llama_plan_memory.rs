//! The Llama family's measured peak memory per rank against the `dsplan-cpu` plan (the
//! `tiny-llama` preset, GQA, untied embeddings), fp32 and bf16, ZeRO stages 0-3, world sizes 1
//! and 2: the activation arena equals the plan's to the byte (`planner::memory::cpu_arena_llama`
//! sizes it, the model checks its layout fills it). The other categories are printed, not
//! asserted: the plan's CPU units (`planner::plan::cpu_units`) still schedule the embedding's
//! gradient from the head's backward on, as for GPT-2's tied head, while an untied Llama
//! allocates it at the end of backward, so the plan's gradient peak is one embedding larger.
//! Prints the table with `--nocapture`.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::train::{
    DataChoice, TrainReport, TrainSettings, TrainSpec, choose_model, train,
};
use serde_json::{Value, json};

fn run(stage: u8, world: u64, precision: &Value) -> TrainReport {
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
    let settings = TrainSettings::from_config(&config, world as usize).expect("config");
    let model = choose_model(Some("tiny-llama"), 5).expect("tiny-llama");
    let spec = TrainSpec {
        settings,
        model: model.config,
        initial_params: model.params,
        data: DataChoice::Bundled {
            order: WindowOrder::Sequential,
        },
        seq_len: 32,
        steps: 2,
        world: world as usize,
    };
    train(&spec, &|_| {}).expect("training runs")
}

#[test]
fn measured_memory_is_the_plans_to_the_byte() {
    let mut table = String::new();
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        for stage in 0..=3u8 {
            for world in [1u64, 2] {
                let label = format!("{name} stage {stage} W={world}");
                let report = run(stage, world, &precision);
                let measured = report.memory[0];
                let plan = report.plan_memory;
                table.push_str(&format!(
                    "| {label} | {} / {} |",
                    measured.peak_total, plan.peak_total
                ));
                for &(category, _) in &report.correspondence {
                    let (got, planned) = (measured.peak.get(category), plan.peak.get(category));
                    table.push_str(&format!(" {} {got} / {planned} |", category.name()));
                }
                table.push('\n');
                let activations = Category::Activations;
                assert!(measured.peak.get(activations) > 0, "{label}");
                assert_eq!(
                    measured.peak.get(activations),
                    plan.peak.get(activations),
                    "{label}: activation arena measured vs plan"
                );
            }
        }
    }
    eprintln!("measured / plan bytes per rank:\n{table}");
}
