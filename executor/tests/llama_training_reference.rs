//! The Llama family trained through the real training path (`train`: plan, ZeRO engine,
//! clipping, AdamW) against the reference runs (`reference/llama/{llama,qwen2,llama3_rope}`):
//!
//! * `adamw_trajectory`: 10 steps of `torch.optim.AdamW` + `clip_grad_norm_(1.0)` in one
//!   process (here: one rank, ZeRO disabled, the whole batch per step);
//! * `deepspeed_zero`: DeepSpeed 0.19.8 at world size 2, stages 0-3 (fp32) and stage 2 bf16.
//!
//! Per step: the loss and (where recorded) the pre-clip gradient norm; at the end: every
//! parameter. Tolerances: the READMEs give torch's own f32-vs-f64 distance after 10 steps
//! (1.8e-6 to 1.1e-5) and DeepSpeed's fp32 runs within 1.43x of it; allow 4x the largest,
//! 5e-5. bf16: DeepSpeed computes in bf16, we in f32 with bf16 parameters and gradients, so
//! the two bf16 runs round differently; DeepSpeed's bf16 run ends up to 1.07e-2 from torch fp32:
//! allow 2x that between the two. Prints the measured errors. Skips without `../shared`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dsplan_executor::data::WindowOrder;
use dsplan_executor::io::llama_pretrained::load_llama_pretrained;
use dsplan_executor::model::{ModelConfig, ModelLayout};
use dsplan_executor::train::{DataChoice, TrainReport, TrainSettings, TrainSpec, train};
use serde_json::{Value, json};
use support::{Loaded, llama_reference, read_tensors};

const STEPS: u64 = 10;
const MODELS: [&str; 3] = ["llama", "qwen2", "llama3_rope"];

/// fp32: max |Δ| of the final parameters.
const FP32_PARAM_TOL: f64 = 5e-5;
/// fp32: relative difference of each step's loss and pre-clip gradient norm.
const FP32_STEP_REL_TOL: f64 = 1e-5;
/// bf16: max |Δ| of the final parameters.
const BF16_PARAM_TOL: f64 = 2.2e-2;
/// bf16: each step's loss, absolute (DeepSpeed bf16 vs torch f32 differ by up to 6.7e-4).
const BF16_LOSS_TOL: f64 = 2e-3;

fn config(stage: Option<u8>, world: u64, bf16: bool) -> Value {
    let micro = 4 / world;
    let mut config = json!({
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
            "torch_adam": true}},
        "fp16": {"enabled": false},
        "bf16": {"enabled": bf16},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": false,
    });
    if let Some(stage) = stage {
        config["zero_optimization"] = json!({"stage": stage});
        if stage == 3 {
            config["zero_optimization"]["stage3_param_persistence_threshold"] = json!(0);
        }
    }
    config
}

fn run(reference: &Path, config: &Value, world: u64) -> (TrainReport, ModelLayout) {
    let (model, params) =
        load_llama_pretrained(&reference.join("forward_backward")).expect("fixture");
    let model = ModelConfig::Llama(model);
    let settings = TrainSettings::from_config(config, world as usize).expect("config");
    let spec = TrainSpec {
        settings,
        model,
        initial_params: params,
        data: DataChoice::File {
            path: reference.join("adamw_trajectory/batches.safetensors"),
            order: WindowOrder::Sequential,
        },
        seq_len: 31,
        steps: STEPS,
        world: world as usize,
    };
    let report = train(&spec, &|_| {}).expect("training runs");
    (report, model.layout())
}

fn param_diff(ours: &[f32], layout: &ModelLayout, reference: &BTreeMap<String, Loaded>) -> f64 {
    let mut worst = 0.0f64;
    for entry in layout.table().entries() {
        let theirs = &reference[&entry.name].floats;
        for (&o, &r) in entry.span.of(ours).iter().zip(theirs) {
            worst = worst.max((f64::from(o) - r).abs());
        }
    }
    worst
}

fn max_rel(ours: impl Iterator<Item = f64>, theirs: &[f64]) -> f64 {
    ours.zip(theirs)
        .map(|(o, r)| (o - r).abs() / r.abs().max(1e-30))
        .fold(0.0, f64::max)
}

fn references() -> Vec<(&'static str, PathBuf)> {
    MODELS
        .iter()
        .filter_map(|&m| llama_reference(m).map(|dir| (m, dir)))
        .collect()
}

#[test]
fn adamw_trajectory_matches_torch() {
    for (name, reference) in references() {
        let (report, layout) = run(&reference, &config(None, 1, false), 1);
        let dir = reference.join("adamw_trajectory");
        let trajectory = read_tensors(&dir.join("trajectory.safetensors"));
        let final_model = read_tensors(&dir.join("final_model.safetensors"));
        let loss = max_rel(
            report.steps.iter().map(|s| s.loss),
            &trajectory["loss"].floats,
        );
        let norm = max_rel(
            report.steps.iter().map(|s| s.grad_norm.unwrap_or(f64::NAN)),
            &trajectory["grad_norm"].floats,
        );
        let params = param_diff(&report.final_params, &layout, &final_model);
        eprintln!(
            "{name:12} adamw_trajectory: loss max rel {loss:.2e} | grad-norm max rel {norm:.2e} | final params max|Δ| {params:.3e}"
        );
        assert_eq!(report.steps.len(), STEPS as usize);
        assert!(loss < FP32_STEP_REL_TOL, "{name}: loss {loss:e}");
        assert!(norm < FP32_STEP_REL_TOL, "{name}: grad norm {norm:e}");
        assert!(params < FP32_PARAM_TOL, "{name}: params {params:e}");
    }
}

fn check_zero(run_name: &str, stage: u8, bf16: bool) {
    for (name, reference) in references() {
        let (report, layout) = run(&reference, &config(Some(stage), 2, bf16), 2);
        let dir = reference.join("deepspeed_zero");
        let trajectory = read_tensors(&dir.join(format!("trajectory_{run_name}.safetensors")));
        let final_model = read_tensors(&dir.join(format!("final_model_{run_name}.safetensors")));
        let losses = report.steps.iter().map(|s| s.loss);
        let loss_rel = max_rel(losses.clone(), &trajectory["global_mean_loss"].floats);
        let loss_abs = losses
            .zip(&trajectory["global_mean_loss"].floats)
            .map(|(o, r)| (o - r).abs())
            .fold(0.0, f64::max);
        let norm_rel = trajectory.get("grad_norm").map(|norms| {
            max_rel(
                report.steps.iter().map(|s| s.grad_norm.unwrap_or(f64::NAN)),
                &norms.floats,
            )
        });
        let params = param_diff(&report.final_params, &layout, &final_model);
        eprintln!(
            "{name:12} {run_name:12} loss max rel {loss_rel:.2e} (abs {loss_abs:.2e}) | grad-norm max rel {} | final params max|Δ| {params:.3e}",
            norm_rel.map_or("n/a".to_string(), |r| format!("{r:.2e}")),
        );
        assert!(report.steps.iter().all(|s| !s.skipped));
        if bf16 {
            assert!(
                loss_abs < BF16_LOSS_TOL,
                "{name} {run_name}: loss {loss_abs:e}"
            );
            assert!(
                params < BF16_PARAM_TOL,
                "{name} {run_name}: params {params:e}"
            );
            continue;
        }
        assert!(
            loss_rel < FP32_STEP_REL_TOL,
            "{name} {run_name}: loss {loss_rel:e}"
        );
        if let Some(norm_rel) = norm_rel {
            assert!(
                norm_rel < FP32_STEP_REL_TOL,
                "{name} {run_name}: norm {norm_rel:e}"
            );
        }
        assert!(
            params < FP32_PARAM_TOL,
            "{name} {run_name}: params {params:e}"
        );
    }
}

#[test]
fn zero_stage0_matches_deepspeed() {
    check_zero("stage0", 0, false);
}

#[test]
fn zero_stage1_matches_deepspeed() {
    check_zero("stage1", 1, false);
}

#[test]
fn zero_stage2_matches_deepspeed() {
    check_zero("stage2", 2, false);
}

#[test]
fn zero_stage3_matches_deepspeed() {
    check_zero("stage3", 3, false);
}

#[test]
fn zero_stage2_bf16_matches_deepspeed() {
    check_zero("stage2_bf16", 2, true);
}
