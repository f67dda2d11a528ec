//! fp16 training: the loss scale each step reports follows DeepSpeed's state machine
//! (`planner::schedule::loss_scale`) through real overflows, overflowing steps are skipped
//! without touching the parameters or the learning-rate scheduler, and the learning rate of
//! every step is the scheduler's value after the applied steps before it.

use dsplan_executor::data::WindowOrder;
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::model::{Gpt2Config, ParamLayout, init_params};
use dsplan_executor::train::{DataChoice, TrainReport, TrainSettings, TrainSpec, train};
use dsplan_executor::zero::{Dtype, MixedPrecision};
use dsplan_planner::config::ZeroStage;
use serde_json::{Value, json};

const MODEL: Gpt2Config = Gpt2Config {
    vocab_size: 256,
    n_positions: 32,
    n_embd: 32,
    n_layer: 2,
    n_head: 2,
    layer_norm_epsilon: 1e-5,
};

fn settings(stage: u8, fp16: Value) -> TrainSettings {
    let config = json!({
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 1.0,
        "fp16": fp16,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "weight_decay": 0.01}},
        "scheduler": {"type": "WarmupDecayLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": 1e-3, "warmup_num_steps": 4,
            "total_num_steps": 40, "warmup_type": "linear"}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 3000},
    });
    TrainSettings::from_config(&config, 2).expect("config")
}

fn run(settings: TrainSettings, steps: u64) -> (TrainReport, Vec<f32>) {
    let initial = init_params(&MODEL, &ParamLayout::new(&MODEL), 11);
    let spec = TrainSpec {
        settings,
        model: MODEL.into(),
        initial_params: initial.clone(),
        data: DataChoice::Bundled {
            order: WindowOrder::Sequential,
        },
        seq_len: 16,
        steps,
        world: 2,
    };
    (train(&spec, &|_| {}).expect("training runs"), initial)
}

/// Replays the run's metrics through the planner's scaler and schedule.
fn check_against_planner(settings: &TrainSettings, steps: &[StepMetrics]) {
    let mut scaler = settings
        .precision()
        .loss_scaler(settings.stage)
        .expect("scaler");
    let schedule = settings.training.schedule.as_ref().expect("schedule");
    let mut applied = 0u64;
    for line in steps {
        assert_eq!(line.loss_scale, scaler.scale(), "step {}", line.step);
        assert_eq!(line.lr, schedule.lr_at(applied), "step {}", line.step);
        let outcome = scaler.update(line.skipped).expect("scale above minimum");
        assert_eq!(outcome.is_applied(), !line.skipped);
        assert_eq!(line.grad_norm.is_none(), line.skipped, "step {}", line.step);
        if !line.skipped {
            applied += 1;
        }
    }
}

#[test]
fn dynamic_scale_with_hysteresis_and_growth_follows_deepspeed() {
    for stage in [0u8, 1, 2, 3] {
        let settings = settings(
            stage,
            json!({"enabled": true, "initial_scale_power": 24, "loss_scale_window": 4,
                   "hysteresis": 2, "min_loss_scale": 1}),
        );
        let (report, _) = run(settings.clone(), 24);
        let skipped = report.steps.iter().filter(|s| s.skipped).count();
        let scales: Vec<f64> = report.steps.iter().map(|s| s.loss_scale).collect();
        eprintln!("stage {stage}: {skipped} skipped; scales {scales:?}");
        assert!(skipped >= 2, "2^24 must overflow fp16 gradients at first");
        assert!(
            skipped < report.steps.len(),
            "the scale must come down to something usable"
        );
        assert!(
            scales.windows(2).any(|w| w[1] > w[0]),
            "a window of 4 clean steps must double the scale"
        );
        assert_eq!(report.applied_steps, (report.steps.len() - skipped) as u64);
        check_against_planner(&settings, &report.steps);
        let last = report.steps.last().expect("steps");
        assert!(last.loss < report.steps[0].loss, "training makes progress");
    }
}

#[test]
fn deepspeeds_default_scaler_starts_at_two_to_the_32() {
    let settings = settings(2, json!({"enabled": true}));
    let (report, _) = run(settings.clone(), 20);
    assert_eq!(report.steps[0].loss_scale, 2f64.powi(32));
    check_against_planner(&settings, &report.steps);
}

#[test]
fn a_skipped_step_leaves_the_parameters_alone() {
    let settings = settings(3, json!({"enabled": true, "initial_scale_power": 30}));
    assert!(matches!(settings.precision(), MixedPrecision::Fp16 { .. }));
    assert_eq!(settings.stage, ZeroStage::Weights);
    let (report, initial) = run(settings, 1);
    assert!(report.steps[0].skipped, "2^30 overflows");
    assert_eq!(report.applied_steps, 0);
    let as_fp16: Vec<f32> = initial.iter().map(|&x| Dtype::F16.round(x)).collect();
    assert_eq!(report.final_params, as_fp16, "master weights untouched");
}

#[test]
fn a_static_scale_skips_overflows_without_moving() {
    let settings = settings(1, json!({"enabled": true, "loss_scale": 1e9}));
    let (report, _) = run(settings.clone(), 3);
    assert!(
        report
            .steps
            .iter()
            .all(|s| s.skipped && s.loss_scale == 1e9)
    );
    check_against_planner(&settings, &report.steps);
    let settings = self::settings(1, json!({"enabled": true, "loss_scale": 128}));
    let (report, _) = run(settings, 3);
    assert!(
        report
            .steps
            .iter()
            .all(|s| !s.skipped && s.loss_scale == 128.0)
    );
}
