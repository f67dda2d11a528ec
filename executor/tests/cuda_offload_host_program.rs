//! ZeRO-Offload's CUDA program (`cuda::train::offload`) on the host interpreter: the optimizer
//! moved to the host gives the bits of the program without offload (the host AdamW is the
//! fused kernel's `adamw_element`, the copies are exact or round as the 16-bit copy-out
//! does, so bit-equality is expected, not a tolerance), and the speculative stepping equals
//! the exact one, also on steps it had to undo.

use dsplan_executor::cuda::check::step::small_model;
use dsplan_executor::cuda::train::host::{HostRun, run_rank_models_on_host};
use dsplan_executor::cuda::train::rank_models;
use dsplan_executor::data::WindowOrder;
use dsplan_executor::train::{
    CheckpointOptions, DataChoice, TrainSettings, TrainSpec, compile_cuda_plan,
};
use serde_json::{Value, json};

/// Two steps of two micro-steps at `world` ranks, ZeRO `stage`, with `extra` keys of the config.
fn spec(stage: u8, world: usize, offload: Value, extra: Value) -> TrainSpec {
    let model = small_model().expect("the small model");
    let params = dsplan_executor::model::init_params(
        &model,
        &dsplan_executor::model::ParamLayout::new(&model),
        11,
    );
    let mut config = json!({
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "eps": 1e-6, "weight_decay": 0.01}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50_000},
    });
    if !offload.is_null() {
        config["zero_optimization"]["offload_optimizer"] = offload;
    }
    if let (Some(object), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        object.extend(extra.clone());
    }
    TrainSpec {
        settings: TrainSettings::from_config(&config, world).expect("settings"),
        model: model.into(),
        initial_params: params,
        data: DataChoice::Bundled {
            order: WindowOrder::Shuffled { seed: 7 },
        },
        seq_len: 64,
        steps: 2,
        world,
    }
}

fn run(spec: &TrainSpec) -> HostRun {
    let plan = compile_cuda_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .expect("the CUDA plan");
    let models = rank_models(spec, &plan).unwrap_or_else(|e| panic!("programs: {e}"));
    run_rank_models_on_host(spec, &plan, &models, &CheckpointOptions::default(), &|_| {})
        .unwrap_or_else(|e| panic!("the host interpreter: {e}"))
}

fn assert_same(what: &str, a: &HostRun, b: &HostRun) {
    for (x, y) in a.report.steps.iter().zip(&b.report.steps) {
        assert_eq!(x.loss.to_bits(), y.loss.to_bits(), "{what}: loss");
        assert_eq!(x.grad_norm, y.grad_norm, "{what}: norm");
    }
    assert_eq!(
        a.report.final_params, b.report.final_params,
        "{what}: parameters"
    );
}

#[test]
fn offload_equals_no_offload_bit_for_bit_at_stages_1_to_3_in_fp32_and_bf16() {
    for (precision, extra) in [
        ("fp32", json!({})),
        ("bf16", json!({"bf16": {"enabled": true}})),
    ] {
        for (stage, world) in [(1u8, 1usize), (2, 2), (3, 2), (1, 2)] {
            let what = format!("{precision} stage {stage} W = {world}");
            let plain = run(&spec(stage, world, Value::Null, extra.clone()));
            let off = run(&spec(stage, world, json!({"device": "cpu"}), extra.clone()));
            assert_ne!(
                off.report.final_params,
                spec(1, 1, Value::Null, json!({})).initial_params
            );
            assert_same(&what, &plain, &off);
        }
    }
}

#[test]
fn speculative_equals_exact_without_rollback_and_after_forced_rollbacks() {
    for (clip, rolled) in [(1e9, false), (1e-4, true)] {
        let extra = json!({"gradient_clipping": clip});
        let exact = run(&spec(2, 2, json!({"device": "cpu"}), extra.clone()));
        let speculative = run(&spec(
            2,
            2,
            json!({"device": "cpu", "super_offload": true}),
            extra,
        ));
        assert_same(&format!("clip {clip}"), &exact, &speculative);
        let expected = if rolled { vec![2, 2] } else { vec![0, 0] };
        assert_eq!(speculative.rollbacks, expected, "clip {clip}: rollbacks");
    }
}
