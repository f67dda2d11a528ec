//! ZeRO stages 0-3 at world size 2 against real DeepSpeed 0.19.8 runs of the same training
//! (`reference/gpt2/deepspeed_zero`): the fixture GPT-2, the fixture batches, AdamW
//! (`torch_adam`), clipping 1.0; plus gradient accumulation, WarmupDecayLR, bf16 and the
//! FusedAdam-CPU runs. Per step: the global mean loss, the learning rate and (stages 1-3) the
//! pre-clip gradient norm; at the end: every parameter. Prints the measured differences.
//! Skips without `../shared`.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use dsplan_executor::data::WindowOrder;
use dsplan_executor::io::safetensors::load_pretrained;
use dsplan_executor::model::ParamLayout;
use dsplan_executor::train::{DataChoice, TrainReport, TrainSettings, TrainSpec, train};
use serde_json::{Value, json};
use support::{Loaded, gpt2_reference, is_key_bias, read_tensors};

const STEPS: u64 = 20;

/// fp32 runs: max |Δ| of the final parameters, key-bias entries excluded. DeepSpeed's own
/// fp32 runs sit within 5.8e-6 of single-process torch, and torch f32 within 8.1e-6 of f64
/// (README precision notes): twice the f32/f64 distance.
const FP32_PARAM_TOL: f64 = 1.6e-5;
/// fp32 runs: the key third of `c_attn.bias` is rounding noise around 0 (|p| <= 4.6e-6 in
/// torch); absolute tolerance.
const KEY_BIAS_TOL: f64 = 5e-5;
/// fp32 runs: relative difference of each step's loss and gradient norm.
const FP32_STEP_REL_TOL: f64 = 1e-5;
/// FusedAdam runs: DeepSpeed's CPU kernel rounds differently from torch's AdamW (6.4e-6 from
/// the torch emulation, README); we implement torch's order, so allow that on top.
const FUSED_PARAM_TOL: f64 = FP32_PARAM_TOL + 1e-5;
/// bf16: DeepSpeed's model computes in bf16 (activations too), ours in f32 with bf16
/// parameters and gradients, so the two bf16 runs round differently at every step. DeepSpeed's
/// bf16 run ends 2.65e-3 (key bias excluded) and 1.13e-2 (key bias) from torch's fp32 run;
/// allow twice that between the two bf16 runs.
const BF16_PARAM_TOL: f64 = 5.3e-3;
/// bf16: key-bias entries, absolute.
const BF16_KEY_BIAS_TOL: f64 = 2.3e-2;
/// bf16: each step's loss, absolute (DeepSpeed bf16 vs torch f32 differ by up to 6e-4).
const BF16_LOSS_TOL: f64 = 1.5e-3;

/// One reference run to reproduce.
struct Case {
    run: &'static str,
    stage: u8,
    micro_batch: u64,
    grad_accum: u64,
    scheduler: bool,
    bf16: bool,
    fused: bool,
}

const fn case(run: &'static str, stage: u8) -> Case {
    Case {
        run,
        stage,
        micro_batch: 2,
        grad_accum: 1,
        scheduler: false,
        bf16: false,
        fused: false,
    }
}

/// The run's DeepSpeed config, as the reference README lists it.
fn config(case: &Case) -> Value {
    let mut config = json!({
        "train_batch_size": 4,
        "train_micro_batch_size_per_gpu": case.micro_batch,
        "gradient_accumulation_steps": case.grad_accum,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
            "torch_adam": !case.fused}},
        "zero_optimization": {"stage": case.stage},
        "fp16": {"enabled": false},
        "bf16": {"enabled": case.bf16},
        "steps_per_print": 1_000_000,
        "wall_clock_breakdown": false,
    });
    if case.stage == 3 {
        config["zero_optimization"]["stage3_param_persistence_threshold"] = json!(0);
    }
    if case.scheduler {
        config["scheduler"] = json!({"type": "WarmupDecayLR", "params": {
            "total_num_steps": 20, "warmup_min_lr": 0.0, "warmup_max_lr": 0.001,
            "warmup_num_steps": 5, "warmup_type": "linear"}});
    }
    config
}

fn run(reference: &Path, case: &Case) -> (TrainReport, ParamLayout, usize) {
    let (model, params) = load_pretrained(&reference.join("forward_backward")).expect("fixture");
    let settings = TrainSettings::from_config(&config(case), 2).expect("config");
    let spec = TrainSpec {
        settings,
        model: model.into(),
        initial_params: params,
        data: DataChoice::File {
            path: reference.join("adamw_trajectory/batches.safetensors"),
            order: WindowOrder::Sequential,
        },
        seq_len: 31,
        steps: STEPS,
        world: 2,
    };
    let report = train(&spec, &|_| {}).expect("training runs");
    (report, ParamLayout::new(&model), model.n_embd)
}

/// (max |Δ| excluding key-bias entries, max |Δ| of key-bias entries).
fn param_diff(
    ours: &[f32],
    layout: &ParamLayout,
    reference: &BTreeMap<String, Loaded>,
    n_embd: usize,
) -> (f64, f64) {
    let (mut rest, mut key_bias) = (0.0f64, 0.0f64);
    for entry in layout.table().entries() {
        let values = entry.span.of(ours);
        let theirs = &reference[&entry.name].floats;
        for (i, (&o, &r)) in values.iter().zip(theirs).enumerate() {
            let d = (f64::from(o) - r).abs();
            if is_key_bias(&entry.name, i, n_embd) {
                key_bias = key_bias.max(d);
            } else {
                rest = rest.max(d);
            }
        }
    }
    (rest, key_bias)
}

fn max_rel(ours: impl Iterator<Item = f64>, theirs: &[f64]) -> f64 {
    ours.zip(theirs)
        .map(|(o, r)| (o - r).abs() / r.abs().max(1e-30))
        .fold(0.0, f64::max)
}

fn max_abs(ours: impl Iterator<Item = f64>, theirs: &[f64]) -> f64 {
    ours.zip(theirs)
        .map(|(o, r)| (o - r).abs())
        .fold(0.0, f64::max)
}

/// Runs `case`, prints its differences, checks them against the tolerances.
fn check(case: &Case) {
    let Some(reference) = gpt2_reference() else {
        return;
    };
    let dir = reference.join("deepspeed_zero");
    let (report, layout, n_embd) = run(&reference, case);
    let trajectory = read_tensors(&dir.join(format!("trajectory_{}.safetensors", case.run)));
    let final_model = read_tensors(&dir.join(format!("final_model_{}.safetensors", case.run)));

    let losses = report.steps.iter().map(|s| s.loss);
    let loss_rel = max_rel(losses.clone(), &trajectory["global_mean_loss"].floats);
    let loss_abs = max_abs(losses, &trajectory["global_mean_loss"].floats);
    let lr_abs = max_abs(report.steps.iter().map(|s| s.lr), &trajectory["lr"].floats);
    let norm_rel = trajectory.get("grad_norm").map(|norms| {
        max_rel(
            report.steps.iter().map(|s| s.grad_norm.unwrap_or(f64::NAN)),
            &norms.floats,
        )
    });
    let (params, key_bias) = param_diff(&report.final_params, &layout, &final_model, n_embd);
    eprintln!(
        "{:20} loss max rel {loss_rel:.2e} (abs {loss_abs:.2e}) | grad-norm max rel {} | lr max abs {lr_abs:.1e} | final params max|Δ| {params:.3e} excl. key bias, key bias {key_bias:.3e}",
        case.run,
        norm_rel.map_or("n/a".to_string(), |r| format!("{r:.2e}")),
    );

    assert_eq!(
        lr_abs, 0.0,
        "{}: the lr must follow the scheduler exactly",
        case.run
    );
    assert!(
        report
            .steps
            .iter()
            .all(|s| !s.skipped && s.loss_scale == 1.0)
    );
    if case.bf16 {
        assert!(loss_abs < BF16_LOSS_TOL, "{}: loss {loss_abs:e}", case.run);
        assert!(params < BF16_PARAM_TOL, "{}: params {params:e}", case.run);
        assert!(
            key_bias < BF16_KEY_BIAS_TOL,
            "{}: key bias {key_bias:e}",
            case.run
        );
        let torch = read_tensors(&reference.join("adamw_trajectory/final_model.safetensors"));
        let (vs_torch, vs_torch_key_bias) =
            param_diff(&report.final_params, &layout, &torch, n_embd);
        eprintln!(
            "{:20} final params vs torch fp32: max|Δ| {vs_torch:.3e} excl. key bias, key bias {vs_torch_key_bias:.3e}",
            case.run
        );
        return;
    }
    assert!(
        loss_rel < FP32_STEP_REL_TOL,
        "{}: loss {loss_rel:e}",
        case.run
    );
    if let Some(norm_rel) = norm_rel {
        assert!(
            norm_rel < FP32_STEP_REL_TOL,
            "{}: grad norm {norm_rel:e}",
            case.run
        );
    }
    let tolerance = if case.fused {
        FUSED_PARAM_TOL
    } else {
        FP32_PARAM_TOL
    };
    assert!(params < tolerance, "{}: params {params:e}", case.run);
    assert!(
        key_bias < KEY_BIAS_TOL,
        "{}: key bias {key_bias:e}",
        case.run
    );
}

#[test]
fn stage0_matches_deepspeed() {
    check(&case("stage0", 0));
}

#[test]
fn stage1_matches_deepspeed() {
    check(&case("stage1", 1));
}

#[test]
fn stage2_matches_deepspeed() {
    check(&case("stage2", 2));
}

#[test]
fn stage3_matches_deepspeed() {
    check(&case("stage3", 3));
}

#[test]
fn fused_adam_runs_match_within_their_kernel_rounding() {
    for (run, stage) in [
        ("stage0_fusedadam", 0),
        ("stage1_fusedadam", 1),
        ("stage2_fusedadam", 2),
        ("stage3_fusedadam", 3),
    ] {
        check(&Case {
            fused: true,
            ..case(run, stage)
        });
    }
}

#[test]
fn stage2_gradient_accumulation_matches_deepspeed() {
    check(&Case {
        micro_batch: 1,
        grad_accum: 2,
        ..case("stage2_ga2", 2)
    });
}

#[test]
fn stage2_warmup_decay_matches_deepspeed() {
    check(&Case {
        scheduler: true,
        ..case("stage2_warmupdecay", 2)
    });
}

#[test]
fn stage2_bf16_matches_deepspeed_within_bf16_rounding() {
    check(&Case {
        bf16: true,
        ..case("stage2_bf16", 2)
    });
}
