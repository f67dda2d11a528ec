//! The loss-scale state machine step by step on small hand-made sequences.

use super::*;

fn zero(settings: Fp16ScaleSettings) -> LossScaler {
    LossScaler::fp16(&settings, Fp16Wrapper::Zero).expect("valid settings")
}

fn drive(scaler: &mut LossScaler, overflows: &[bool]) -> Vec<f64> {
    overflows
        .iter()
        .map(|o| scaler.update(*o).expect("no error").next_scale())
        .collect()
}

#[test]
fn cold_start_doubles_on_the_window_plus_first_clean_update() {
    let mut scaler = zero(Fp16ScaleSettings {
        loss_scale_window: 3,
        ..Fp16ScaleSettings::default()
    });
    assert_eq!(scaler.scale(), 65536.0);
    let scales = drive(&mut scaler, &[false; 7]);
    // update index 3 and 6 double (stable interval 3 and 6).
    assert_eq!(
        scales,
        vec![
            65536.0, 65536.0, 65536.0, 131072.0, 131072.0, 131072.0, 262144.0
        ]
    );
}

#[test]
fn doubling_step_unscales_by_the_new_scale() {
    let mut scaler = zero(Fp16ScaleSettings {
        loss_scale_window: 1,
        initial_scale_power: 2,
        ..Fp16ScaleSettings::default()
    });
    assert_eq!(
        scaler.update(false).expect("ok"),
        StepOutcome::Applied {
            grad_scale: 4.0,
            unscale_by: 4.0
        }
    );
    assert_eq!(
        scaler.update(false).expect("ok"),
        StepOutcome::Applied {
            grad_scale: 4.0,
            unscale_by: 8.0
        }
    );
}

#[test]
fn hysteresis_absorbs_then_halves() {
    let mut scaler = zero(Fp16ScaleSettings {
        hysteresis: 3,
        initial_scale_power: 4,
        ..Fp16ScaleSettings::default()
    });
    let outcomes: Vec<StepOutcome> = (0..4)
        .map(|_| scaler.update(true).expect("above minimum"))
        .collect();
    assert_eq!(
        outcomes[0],
        StepOutcome::Skipped {
            grad_scale: 16.0,
            next_scale: 16.0,
            reason: SkipReason::HysteresisAbsorbed { remaining: 2 }
        }
    );
    assert_eq!(outcomes[2].next_scale(), 8.0);
    // Not refilled by the drop: the next overflow halves again.
    assert_eq!(outcomes[3].next_scale(), 4.0);
    assert!(outcomes.iter().all(|o| !o.is_applied()));
}

#[test]
fn consecutive_hysteresis_refills_on_every_clean_step() {
    let mut scaler = zero(Fp16ScaleSettings {
        hysteresis: 2,
        consecutive_hysteresis: true,
        initial_scale_power: 4,
        ..Fp16ScaleSettings::default()
    });
    let scales = drive(&mut scaler, &[true, false, true, false, true, true]);
    assert_eq!(scales, vec![16.0, 16.0, 16.0, 16.0, 16.0, 8.0]);
}

#[test]
fn overflow_at_the_minimum_raises_or_clamps() {
    let mut scaler = zero(Fp16ScaleSettings {
        hysteresis: 1,
        initial_scale_power: 1,
        min_loss_scale: 1.0,
        ..Fp16ScaleSettings::default()
    });
    assert_eq!(drive(&mut scaler, &[true]), vec![1.0]);
    let error = scaler.update(true).expect_err("at minimum");
    assert!(matches!(error.kind, LossScaleErrorKind::AtMinimumScale { scale } if scale == 1.0));

    let mut clamping = LossScaler::Dynamic(
        DynamicLossScaler::new(
            2.0,
            1000,
            1.0,
            1,
            false,
            AtMinimum::Clamp,
            Fp16Wrapper::Zero,
        )
        .expect("valid"),
    );
    assert_eq!(
        drive(&mut clamping, &[true, true, true]),
        vec![1.0, 1.0, 1.0]
    );
}

#[test]
fn fp16_optimizer_wrapper_ignores_hysteresis_and_clamps() {
    let settings = Fp16ScaleSettings {
        hysteresis: 4,
        initial_scale_power: 1,
        ..Fp16ScaleSettings::default()
    };
    let mut scaler = LossScaler::fp16(&settings, Fp16Wrapper::Fp16Optimizer).expect("valid");
    assert_eq!(drive(&mut scaler, &[true, true, true]), vec![1.0, 1.0, 1.0]);
}

#[test]
fn static_and_bf16_scales_never_move() {
    let mut fp16 = zero(Fp16ScaleSettings {
        loss_scale: 128.0,
        loss_scale_window: 0,
        ..Fp16ScaleSettings::default()
    });
    let outcome = fp16.update(true).expect("static");
    assert_eq!(
        outcome,
        StepOutcome::Skipped {
            grad_scale: 128.0,
            next_scale: 128.0,
            reason: SkipReason::FixedScale
        }
    );
    let mut bf16 = LossScaler::bf16(OverflowCheck::Ignore);
    assert!(bf16.update(true).expect("bf16").is_applied());
    assert!(
        !LossScaler::bf16(OverflowCheck::SkipStep)
            .update(true)
            .expect("bf16")
            .is_applied()
    );
    assert_eq!(LossScaler::full_precision().scale(), 1.0);
}

#[test]
fn deepspeed_fp16_config_checks() {
    let refuse = |settings: Fp16ScaleSettings, field: &str| {
        let error = LossScaler::fp16(&settings, Fp16Wrapper::Zero).expect_err("refused");
        assert!(
            matches!(error.kind, LossScaleErrorKind::InvalidSetting { field: f } if f == field),
            "{error}"
        );
    };
    refuse(
        Fp16ScaleSettings {
            loss_scale_window: 0,
            ..Default::default()
        },
        "loss_scale_window",
    );
    refuse(
        Fp16ScaleSettings {
            min_loss_scale: 0.0,
            ..Default::default()
        },
        "min_loss_scale",
    );
    refuse(
        Fp16ScaleSettings {
            loss_scale: -1.0,
            ..Default::default()
        },
        "loss_scale",
    );
    refuse(
        Fp16ScaleSettings {
            loss_scale: f64::INFINITY,
            ..Default::default()
        },
        "loss_scale",
    );
}
