//! The Llama family's measured peak memory per rank against the `dsplan-cpu` plan (the
//! `tiny-llama` preset, GQA, untied embeddings), fp32 and bf16, ZeRO stages 0-3, world sizes 1
//! and 2: every category's peak and the peak total equal the plan's to the byte. The arena is
//! `planner::memory::cpu_arena_llama`'s (the model checks its layout fills it); the untied
//! embedding's gradient lives only over its own backward ticks, after every layer
//! (`planner::plan::cpu_units`). With activation checkpointing (an `activation_checkpointing`
//! section) the arena keeps each layer's output and one shared working set: measured = plan
//! again, and the activations' peak and the total drop by exactly the planned arena difference.
//! Prints the tables with `--nocapture`.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::Category;
use dsplan_executor::model::ModelConfig;
use dsplan_executor::train::{
    DataChoice, TrainReport, TrainSettings, TrainSpec, choose_model, train,
};
use dsplan_planner::memory::{LlamaArenaShape, Recompute, llama_arena_elements};
use serde_json::{Value, json};

const SEQ_LEN: usize = 32;
const MICRO_BATCH: u64 = 2;

fn run(stage: u8, world: u64, precision: &Value) -> TrainReport {
    let mut config = json!({
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
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
        seq_len: SEQ_LEN,
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
        row.push_str(&format!(" {} {got} / {planned} |", category.name()));
    }
    assert_eq!(
        measured.peak_total, plan.peak_total,
        "{label}: total at the peak, measured vs plan"
    );
    assert!(measured.peak.get(Category::Activations) > 0, "{label}");
    row.push('\n');
    row
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
                let report = run(stage, world, &precision);
                table.push_str(&check(&format!("{name} stage {stage} W={world}"), &report));
            }
        }
    }
    eprintln!("measured / plan bytes per rank:\n{table}");
}

#[test]
fn checkpointed_memory_is_the_plans_to_the_byte() {
    let ModelConfig::Llama(model) = choose_model(Some("tiny-llama"), 5)
        .expect("tiny-llama")
        .config
    else {
        panic!("tiny-llama is a Llama-family model");
    };
    let n = |x: usize| x as u64;
    let arena = |recompute| {
        4 * llama_arena_elements(&LlamaArenaShape {
            layers: n(model.num_hidden_layers),
            hidden: n(model.hidden_size),
            heads: n(model.num_attention_heads),
            kv_heads: n(model.num_key_value_heads),
            head_dim: n(model.head_dim),
            intermediate: n(model.intermediate_size),
            vocab: n(model.vocab_size),
            batch: MICRO_BATCH,
            seq_len: n(SEQ_LEN),
            recompute,
        })
    };
    let saved = arena(Recompute::Nothing) - arena(Recompute::EachLayer);
    assert!(saved > 0);
    let mut table = String::new();
    for (name, precision) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        let mut checkpointed = precision.clone();
        checkpointed["activation_checkpointing"] = json!({"partition_activations": true});
        for stage in 0..=3u8 {
            let label = format!("{name} stage {stage} W=2");
            let kept = run(stage, 2, &precision);
            let report = run(stage, 2, &checkpointed);
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
    eprintln!(
        "arena {} B kept, {} B recomputed; measured / plan bytes per rank with checkpointing:\n{table}",
        arena(Recompute::Nothing),
        arena(Recompute::EachLayer)
    );
}
