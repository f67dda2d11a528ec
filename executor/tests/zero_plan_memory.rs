//! Each rank's measured peak memory against the plan's prediction (`planner::plan::compile`,
//! its buffer list over the step's ticks), per category, for ZeRO stages 0-3 at world sizes 1,
//! 2 and 4 on the tiny GPT-2, in fp32 and bf16:
//!
//! * the categories the executor allocates exactly as the plan lists them (parameters and
//!   persistent parameters, master weights, optimizer states, and below stage 3 the fp32
//!   gradient partition of the step) are equal to the byte;
//! * every other category is documented (`zero::predict::correspondence`) and its measured
//!   peak equals the executor's own figure computed from the plan's layout, partitions,
//!   buckets and fetch units (`zero::predict::predict_peaks`), to the byte.
//!
//! Prints the table (measured / plan, bytes) with `--nocapture`.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::{ParamLayout, init_params};
use dsplan_executor::train::{
    DataChoice, TrainReport, TrainSettings, TrainSpec, choose_model, train,
};
use dsplan_planner::config::ZeroStage;
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
    let model = choose_model(None, 5).expect("tiny-gpt2").config;
    let spec = TrainSpec {
        settings,
        model,
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

/// The categories that must equal the plan at `stage`.
fn must_agree(stage: ZeroStage, sixteen_bit: bool) -> Vec<Category> {
    let mut same = vec![Category::Params, Category::Master, Category::Optimizer];
    // Stage 3 and BF16_Optimizer (16-bit without ZeRO) count their step buffers differently;
    // `correspondence` gives the reason.
    let bf16_optimizer = stage == ZeroStage::Disabled && sixteen_bit;
    if stage != ZeroStage::Weights && !bf16_optimizer {
        same.push(Category::StepScratch);
    }
    same
}

#[test]
fn measured_memory_is_the_plans_where_the_buffers_are_the_plans() {
    let mut table = String::from(
        "| dtype | stage | W | total | params | gathered | master | grads | optimizer | buckets | step scratch | activations |\n",
    );
    table.push_str(&format!("|{}\n", "---|".repeat(12)));
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        for stage in 0..=3u8 {
            for world in [1u64, 2, 4] {
                let report = run(stage, world, &precision);
                let what = format!("{name} stage {stage} W={world}");
                for rank in &report.memory {
                    assert_eq!(rank, &report.memory[0], "{what}: ranks hold the same");
                }
                let measured = report.memory[0];
                let plan = report.plan_memory;
                let zero_stage = match stage {
                    0 => ZeroStage::Disabled,
                    1 => ZeroStage::OptimizerStates,
                    2 => ZeroStage::Gradients,
                    _ => ZeroStage::Weights,
                };
                let mut row = format!(
                    "| {name} | {stage} | {world} | {} / {} |",
                    measured.peak_total, plan.peak_total
                );
                for &(category, relation) in &report.correspondence {
                    let (got, planned) = (measured.peak.get(category), plan.peak.get(category));
                    assert_eq!(
                        got,
                        report.predicted.get(category),
                        "{what}: {} measured vs the executor's figure",
                        category.name()
                    );
                    if relation.is_same() {
                        assert_eq!(got, planned, "{what}: {} vs plan", category.name());
                    } else {
                        assert!(!relation.reason().is_empty(), "{what}");
                    }
                    if must_agree(zero_stage, name != "fp32").contains(&category) {
                        assert!(relation.is_same(), "{what}: {}", category.name());
                    }
                    let mark = if relation.is_same() { "" } else { "*" };
                    row.push_str(&format!(" {got} / {planned}{mark} |"));
                }
                table.push_str(&row);
                table.push('\n');
            }
        }
    }
    eprintln!("measured / plan bytes per rank (* = differs by design):\n{table}");
}
