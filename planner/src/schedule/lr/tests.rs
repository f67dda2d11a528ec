//! Hand-computed values of each scheduler, and DeepSpeed's refusals.

use super::*;
use serde_json::json;

fn build(type_name: &str, params: Value, base_lr: f64) -> (LrSchedule, Vec<ScheduleWarning>) {
    let map = params.as_object().cloned().expect("params object");
    LrSchedule::from_params(type_name, &map, base_lr).expect("DeepSpeed builds this scheduler")
}

fn refuse(type_name: &str, params: Value) -> ScheduleError {
    let map = params.as_object().cloned().expect("params object");
    LrSchedule::from_params(type_name, &map, 1e-3).expect_err("DeepSpeed refuses this scheduler")
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-15 * a.abs().max(b.abs())
}

#[track_caller]
fn assert_lrs(schedule: &LrSchedule, expected: &[(u64, f64)]) {
    for &(step, lr) in expected {
        let got = schedule.lr_at(step);
        assert!(close(got, lr), "step {step}: got {got}, expected {lr}");
    }
}

#[test]
fn warmup_linear_with_two_steps() {
    let (s, warnings) = build(
        "WarmupLR",
        json!({"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 2, "warmup_type": "linear"}),
        1e-3,
    );
    assert!(warnings.is_empty());
    // step 0: constructor value; step s: t = s - 1; γ = t/2 until t = 2.
    assert_lrs(
        &s,
        &[(0, 0.001), (1, 0.001), (2, 0.0055), (3, 0.01), (50, 0.01)],
    );
}

#[test]
fn warmup_log_is_a_ratio_of_logarithms() {
    let (s, _) = build(
        "WarmupLR",
        json!({"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 8}),
        1e-3,
    );
    // γ(t) = ln(t+1)/ln 8: t=1 → 1/3, t=3 → 2/3, t=7 → 1.
    assert_lrs(
        &s,
        &[
            (1, 0.0),
            (2, 0.01 / 3.0),
            (4, 0.02 / 3.0),
            (8, 0.01),
            (9, 0.01),
        ],
    );
}

#[test]
fn warmup_without_max_lr_climbs_to_the_optimizer_lr() {
    let (s, _) = build(
        "WarmupLR",
        json!({"warmup_num_steps": 4, "warmup_type": "linear"}),
        0.02,
    );
    assert_lrs(&s, &[(0, 0.0), (3, 0.01), (5, 0.02), (100, 0.02)]);
    // WarmupDecayLR's own default is 0.001, not the optimizer's lr.
    let (d, _) = build(
        "WarmupDecayLR",
        json!({"total_num_steps": 10, "warmup_num_steps": 4, "warmup_type": "linear"}),
        0.02,
    );
    assert_lrs(&d, &[(5, 0.001)]);
}

#[test]
fn warmup_of_one_step_is_stretched_to_two() {
    let (s, _) = build(
        "WarmupLR",
        json!({"warmup_min_lr": 0, "warmup_max_lr": 1.0, "warmup_num_steps": 1, "warmup_type": "linear"}),
        1e-3,
    );
    assert_lrs(&s, &[(1, 0.0), (2, 0.5), (3, 1.0)]);
}

#[test]
fn warmup_decay_reaches_min_lr_at_total_and_stays() {
    let (s, warnings) = build(
        "WarmupDecayLR",
        json!({"total_num_steps": 10, "warmup_min_lr": 0, "warmup_max_lr": 1.0,
               "warmup_num_steps": 5, "warmup_type": "linear"}),
        1e-3,
    );
    assert!(warnings.is_empty());
    // After warmup γ = max(0, (10 - t)/5).
    assert_lrs(&s, &[(5, 0.8), (6, 1.0), (8, 0.6), (11, 0.0), (13, 0.0)]);
}

#[test]
fn warmup_decay_warns_when_total_is_shorter_than_warmup() {
    let (_, warnings) = build(
        "WarmupDecayLR",
        json!({"total_num_steps": 5, "warmup_num_steps": 10}),
        1e-3,
    );
    assert_eq!(warnings.len(), 1);
    assert_eq!(
        warnings[0].message,
        "total_num_steps 5 is less than warmup_num_steps 10"
    );
}

#[test]
fn cosine_warms_up_then_follows_a_clamped_half_cosine() {
    let (s, _) = build(
        "WarmupCosineLR",
        json!({"total_num_steps": 10, "warmup_num_steps": 2, "warmup_type": "linear",
               "cos_min_ratio": 0.1}),
        2.0,
    );
    let at = |p: f64| 2.0 * (0.1 + 0.9 * (1.0 + (std::f64::consts::PI * p).cos()) / 2.0);
    assert_lrs(
        &s,
        &[
            (0, 0.0),
            (1, 0.0),
            (2, 1.0),
            (3, at(1.0 / 8.0)),
            (6, at(0.5)),
            (10, at(1.0)),
        ],
    );
    // Past total_num_steps the ratio stays at cos_min_ratio.
    assert_lrs(&s, &[(11, 0.2), (40, 0.2)]);
}

#[test]
fn cosine_unknown_warmup_type_falls_back_to_log_with_a_warning() {
    let (s, warnings) = build(
        "WarmupCosineLR",
        json!({"total_num_steps": 20, "warmup_num_steps": 8, "warmup_type": "cosine"}),
        1.0,
    );
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].param.as_deref(), Some("warmup_type"));
    assert_lrs(&s, &[(2, 1.0 / 3.0)]);
}

#[test]
fn one_cycle_triangle_momentum_and_decay() {
    let (s, _) = build(
        "OneCycle",
        json!({"cycle_min_lr": 0.1, "cycle_max_lr": 1.1, "cycle_first_step_size": 4,
               "decay_step_size": 2, "decay_lr_rate": 0.5}),
        1e-3,
    );
    // T = 8; scale factor at t: b = t+1, x = b/8; up to 0.5 then down.
    assert_lrs(&s, &[(0, 0.1), (1, 0.35), (4, 1.1), (6, 0.6), (8, 0.1)]);
    // Decay: k = t - 8 + 1, lr = 0.1/(1 + 0.5·k/2).
    assert_lrs(&s, &[(9, 0.08), (10, 0.1 / 1.5)]);
    assert_eq!(s.momentum_at(0), Some((0.8, 0.99)));
    let (beta1, beta2) = s.momentum_at(6).expect("momentum cycles");
    assert!(close(beta1, 0.85));
    assert_eq!(beta2, ONE_CYCLE_BETA2);
    assert_eq!(
        s.momentum_at(20),
        Some((0.9, 0.99)),
        "decay_mom_rate 0 keeps max"
    );
}

#[test]
fn one_cycle_stairs_hold_each_level() {
    let (s, _) = build(
        "OneCycle",
        json!({"cycle_min_lr": 0.0, "cycle_max_lr": 1.0, "cycle_first_step_size": 4,
               "cycle_first_stair_count": 2}),
        1e-3,
    );
    // b = 1 → floor(1·2/4)/2 = 0; b = 2, 3 → 0.5; b = 4 → 1; down: b = 5 → floor(3·2/4)/2 = 0.5.
    assert_lrs(
        &s,
        &[(1, 0.0), (2, 0.5), (3, 0.5), (4, 1.0), (5, 0.5), (7, 0.0)],
    );
}

#[test]
fn one_cycle_without_betas_keeps_momentum_alone() {
    let map = json!({"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3})
        .as_object()
        .cloned()
        .expect("object");
    let groups = OptimizerGroups {
        lrs: &[1e-3],
        betas: BetasSupport::NoBetas,
    };
    let (s, warnings) = LrSchedule::from_params_for("OneCycle", &map, groups).expect("built");
    assert_eq!(s.momentum_at(3), None);
    assert_eq!(warnings.len(), 1);
}

#[test]
fn range_test_continuous_and_staircase() {
    let (c, _) = build(
        "LRRangeTest",
        json!({"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 10}),
        1e-3,
    );
    assert_lrs(&c, &[(0, 0.01), (1, 0.011), (10, 0.02)]);
    let (s, _) = build(
        "LRRangeTest",
        json!({"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 10,
               "lr_range_test_step_rate": 2.0, "lr_range_test_staircase": true}),
        1e-3,
    );
    assert_lrs(&s, &[(9, 0.01), (10, 0.03), (20, 0.05)]);
}

#[test]
fn per_group_lists_are_followed_group_by_group() {
    let map = json!({"warmup_min_lr": [0.0, 0.1], "warmup_max_lr": [1.0, 0.5],
                     "warmup_num_steps": 4, "warmup_type": "linear"})
    .as_object()
    .cloned()
    .expect("object");
    let groups = OptimizerGroups {
        lrs: &[1.0, 0.5],
        betas: BetasSupport::Betas,
    };
    let (s, _) = LrSchedule::from_params_for("WarmupLR", &map, groups).expect("built");
    assert_eq!(s.lrs_at(3), vec![0.5, 0.30000000000000004]);
}

#[test]
fn resuming_keeps_the_optimizer_lr_until_the_first_step() {
    let (s, _) = build(
        "WarmupLR",
        json!({"warmup_min_lr": 0, "warmup_max_lr": 1.0, "warmup_num_steps": 10,
               "warmup_type": "linear", "last_batch_iteration": 4}),
        0.25,
    );
    assert_lrs(&s, &[(0, 0.25), (1, 0.5), (6, 1.0)]);
}

#[test]
fn refusals_name_the_parameter_and_match_deepspeed() {
    let e = refuse("WarmupLR", json!({"warmup_num_steps": 0}));
    assert_eq!(e.kind, ScheduleErrorKind::InvalidValue);
    assert_eq!(e.param.as_deref(), Some("warmup_num_steps"));
    assert_eq!(
        e.message,
        "warmup_num_steps must be a positive integer, got 0"
    );

    let e = refuse(
        "WarmupCosineLR",
        json!({"total_num_steps": 8, "warmup_num_steps": 10.0}),
    );
    assert_eq!(
        e.message,
        "warmup_num_steps must be a positive integer, got 10.0"
    );

    let e = refuse(
        "OneCycle",
        json!({"cycle_min_lr": 0, "cycle_max_lr": 1, "cycle_first_step_size": 0}),
    );
    assert_eq!(e.message, "cycle_first_step_size must be positive, got 0.0");

    let e = refuse("LRRangeTest", json!({"lr_range_test_step_size": 0}));
    assert_eq!(
        e.message,
        "lr_range_test_step_size must be a positive integer, got 0"
    );

    let e = refuse("WarmupLR", json!({"warmup_min_lr": [0.0, 1e-4]}));
    assert_eq!(e.kind, ScheduleErrorKind::GroupCountMismatch);
    assert_eq!(e.message, "expected 1 value for min_lr, got 2");

    let e = refuse("WarmupDecayLR", json!({"warmup_num_steps": 10}));
    assert_eq!(e.kind, ScheduleErrorKind::MissingParameter);
    assert_eq!(e.param.as_deref(), Some("total_num_steps"));

    let e = refuse("WarmupLR", json!({"warmup_max_lr": "1e-3"}));
    assert_eq!(e.kind, ScheduleErrorKind::WrongType);
}

#[test]
fn unknown_and_torch_scheduler_names() {
    let e = refuse("warmuplr", json!({}));
    assert_eq!(e.kind, ScheduleErrorKind::UnknownScheduler);
    assert_eq!(
        e.message,
        "DeepSpeed does not recognize LR scheduler warmuplr"
    );
    assert_eq!(e.suggestion.as_deref(), Some("WarmupLR"));
    assert_eq!(
        refuse("StepLR", json!({})).kind,
        ScheduleErrorKind::TorchScheduler
    );
}

#[test]
fn warmup_type_spelling_is_case_sensitive() {
    let (s, warnings) = build(
        "WarmupLR",
        json!({"warmup_max_lr": 1.0, "warmup_num_steps": 8, "warmup_type": "Linear"}),
        1e-3,
    );
    assert_eq!(
        warnings[0].message,
        "Using unknown warmup_type: Linear. The increasing function is set to default (log)"
    );
    assert_lrs(&s, &[(2, 1.0 / 3.0)]);
}
