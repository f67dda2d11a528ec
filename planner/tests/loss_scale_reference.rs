//! Every trace of `reference/loss_scaler.json` (DeepSpeed 0.19.8's `DynamicLossScaler` driven
//! by scripted overflow patterns): scale before and after, skip and hysteresis at every step,
//! exactly, and the raise at the minimum scale at the same step with the same message. Also the
//! fp16 validation probes that concern the scaler's values.
//!
//! The reference lives in `../shared` next to the workspace (or where `DSPLAN_SHARED_DIR`
//! points); without it the test says so and passes.

use std::path::PathBuf;

use dsplan_planner::schedule::loss_scale::{
    AtMinimum, DynamicLossScaler, Fp16ScaleSettings, Fp16Wrapper, LossScaleErrorKind, LossScaler,
};
use serde_json::Value;

fn shared_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("DSPLAN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")));
    dir.is_dir().then_some(dir)
}

fn load() -> Option<Value> {
    let Some(shared) = shared_dir() else {
        eprintln!("skipping: ../shared not found");
        return None;
    };
    let text = std::fs::read_to_string(shared.join("reference/loss_scaler.json"))
        .expect("reference/loss_scaler.json is readable");
    Some(serde_json::from_str(&text).expect("reference is JSON"))
}

fn int(value: &Value, key: &str) -> i64 {
    value[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} is an integer"))
}

#[test]
fn every_loss_scaler_trace_matches_deepspeed() {
    let Some(doc) = load() else { return };
    let sequences = doc["sequences"].as_array().expect("sequences");
    let (mut rows_checked, mut raised, mut clamped) = (0usize, 0usize, 0usize);
    for (index, sequence) in sequences.iter().enumerate() {
        let config = &sequence["config"];
        let args = &sequence["scaler_args"];
        let label = format!("#{index} {} {config}", sequence["pattern"]);
        let settings = Fp16ScaleSettings {
            loss_scale: 0.0,
            initial_scale_power: int(config, "initial_scale_power"),
            loss_scale_window: int(config, "loss_scale_window") as u64,
            hysteresis: int(config, "hysteresis"),
            consecutive_hysteresis: config["consecutive_hysteresis"].as_bool().expect("bool"),
            min_loss_scale: config["min_loss_scale"].as_f64().expect("number"),
        };
        assert_eq!(
            settings.initial_scale(),
            args["init_scale"].as_f64().expect("init_scale"),
            "{label}"
        );
        let mut scaler = if sequence["raise_error_at_min_scale"].as_bool() == Some(false) {
            clamped += 1;
            LossScaler::Dynamic(
                DynamicLossScaler::new(
                    settings.initial_scale(),
                    settings.loss_scale_window,
                    settings.min_loss_scale,
                    settings.hysteresis,
                    settings.consecutive_hysteresis,
                    AtMinimum::Clamp,
                    Fp16Wrapper::Zero,
                )
                .expect("valid scaler"),
            )
        } else {
            LossScaler::fp16(&settings, Fp16Wrapper::Zero).expect("valid settings")
        };

        let overflows: Vec<bool> = sequence["overflow"]
            .as_array()
            .expect("overflow pattern")
            .iter()
            .map(|o| o.as_bool().expect("bool"))
            .collect();
        let rows = sequence["rows"].as_array().expect("rows");
        let error = sequence.get("error").filter(|e| !e.is_null());
        let stop = error.map(|e| int(e, "at_step") as usize);
        assert_eq!(
            rows.len(),
            stop.unwrap_or(overflows.len()),
            "{label}: row count"
        );

        for (step, row) in rows.iter().enumerate() {
            let row = row.as_array().expect("row");
            let overflow = row[1].as_bool().expect("overflow");
            assert_eq!(overflow, overflows[step], "{label} step {step}");
            let before = row[2].as_f64().expect("scale_before");
            let after = row[3].as_f64().expect("scale_after");
            let skipped = row[4].as_bool().expect("skipped");
            let hysteresis_after = row[5].as_i64().expect("hysteresis_after");
            assert_eq!(scaler.scale(), before, "{label} step {step}: scale before");
            let outcome = scaler
                .update(overflow)
                .unwrap_or_else(|e| panic!("{label} step {step}: unexpected error {e}"));
            assert_eq!(
                outcome.next_scale(),
                after,
                "{label} step {step}: scale after"
            );
            assert_eq!(scaler.scale(), after, "{label} step {step}: scale after");
            assert_eq!(
                !outcome.is_applied(),
                skipped,
                "{label} step {step}: skipped"
            );
            let LossScaler::Dynamic(dynamic) = &scaler else {
                panic!("{label}: dynamic scaler expected")
            };
            assert_eq!(
                dynamic.hysteresis(),
                hysteresis_after,
                "{label} step {step}: hysteresis"
            );
            rows_checked += 1;
        }

        if let (Some(error), Some(stop)) = (error, stop) {
            let before = scaler.scale();
            let failure = scaler
                .update(overflows[stop])
                .expect_err("DeepSpeed raises here");
            assert!(
                matches!(failure.kind, LossScaleErrorKind::AtMinimumScale { scale } if scale == before),
                "{label}"
            );
            assert_eq!(
                failure.message,
                error["message"].as_str().expect("message"),
                "{label}"
            );
            raised += 1;
        }
    }
    eprintln!(
        "loss_scaler.json: {} traces ({clamped} clamping, {raised} raising at the minimum), \
         {rows_checked} steps matched exactly",
        sequences.len()
    );
}

/// The probes whose inputs are plain typed values (booleans, integers, numbers); the others
/// (a bool or a fraction where an int is wanted, `"auto"`, unknown keys) concern JSON typing,
/// which the config layer checks.
#[test]
fn fp16_validation_probes_about_the_scaler_values() {
    let Some(doc) = load() else { return };
    let probes = doc["fp16_config_validation"].as_array().expect("probes");
    let (mut checked, mut typing_only) = (0, 0);
    for probe in probes {
        let input = probe["input"].as_object().expect("input");
        let typed = input.iter().all(|(key, value)| match key.as_str() {
            "enabled" | "consecutive_hysteresis" => value.is_boolean(),
            "loss_scale" => value.is_number(),
            "initial_scale_power" | "loss_scale_window" | "hysteresis" | "min_loss_scale" => {
                value.as_f64().is_some_and(|x| x.fract() == 0.0)
            }
            _ => false,
        });
        let enabled = input.get("enabled").and_then(Value::as_bool) == Some(true);
        if !typed || !enabled {
            typing_only += 1;
            continue;
        }
        let number =
            |key: &str, default: f64| input.get(key).and_then(Value::as_f64).unwrap_or(default);
        let settings = Fp16ScaleSettings {
            loss_scale: number("loss_scale", 0.0),
            initial_scale_power: number("initial_scale_power", 16.0) as i64,
            loss_scale_window: number("loss_scale_window", 1000.0) as u64,
            hysteresis: number("hysteresis", 2.0) as i64,
            consecutive_hysteresis: input
                .get("consecutive_hysteresis")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            min_loss_scale: number("min_loss_scale", 1.0),
        };
        let accepted = probe["accepted"].as_bool().expect("accepted");
        let result = LossScaler::fp16(&settings, Fp16Wrapper::Zero);
        assert_eq!(result.is_ok(), accepted, "probe {input:?}: {result:?}");
        if let Err(error) = &result {
            let message = probe["error"]["message"].as_str().expect("message");
            assert!(
                message.contains(&error.message),
                "probe {input:?}: {message} vs {error}"
            );
        } else {
            let args = &probe["dynamic_loss_scale_args"];
            assert_eq!(
                settings.initial_scale(),
                args["init_scale"].as_f64().expect("init")
            );
            if let Ok(LossScaler::Dynamic(scaler)) = &result {
                assert_eq!(scaler.scale(), args["init_scale"].as_f64().expect("init"));
                assert_eq!(
                    scaler.hysteresis(),
                    args["delayed_shift"].as_i64().expect("shift")
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 7, "the scaler-value probes are all recognised");
    eprintln!(
        "fp16 probes: {checked} about the scaler's values checked, {typing_only} about JSON typing left to the config layer"
    );
}
