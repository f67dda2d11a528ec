//! Every diagnostic code `dsplan validate` can emit, each produced by a small config of our own.
//! A new code without a case here fails [`every_code_has_a_case`].

use dsplan_planner::diagnostics::{Code, Severity};
use dsplan_planner::validate::{ValidateOptions, validate_source};

/// (code, config bytes, world size, pointer the diagnostic must name).
const CASES: &[(Code, &str, Option<u64>, &str)] = &[
    (Code::EmptyFile, "  \n", None, ""),
    (
        Code::SyntaxError,
        r#"{"train_batch_size": 8 "steps_per_print": 1}"#,
        None,
        "/train_batch_size",
    ),
    (Code::TooDeep, "", None, "/a/a/a"), // built in the test: 200 nested objects; pointer prefix
    (
        Code::NumberOutOfRange,
        r#"{"train_batch_size": 1e400}"#,
        None,
        "/train_batch_size",
    ),
    (Code::RootNotObject, "[1, 2]", None, ""),
    (
        Code::DuplicateKey,
        r#"{"train_batch_size": 8, "train_batch_size": 16}"#,
        None,
        "/train_batch_size",
    ),
    (
        Code::NonStrictJson,
        "{\"train_batch_size\": 8, // comment\n}",
        None,
        "",
    ),
    (
        Code::UnknownKey,
        r#"{"train_batch_size": 8, "zero_optimization": {"overlap_com": true}}"#,
        None,
        "/zero_optimization/overlap_com",
    ),
    (
        Code::UnusedTopLevelKey,
        r#"{"train_batch_size": 8, "my_project_setting": 1}"#,
        None,
        "/my_project_setting",
    ),
    (
        Code::WrongType,
        r#"{"train_batch_size": 8, "steps_per_print": "10"}"#,
        None,
        "/steps_per_print",
    ),
    (
        Code::NonIntegral,
        r#"{"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 2.5}}"#,
        None,
        "/zero_optimization/reduce_bucket_size",
    ),
    (
        Code::OutOfRange,
        r#"{"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": -5}}"#,
        None,
        "/zero_optimization/reduce_bucket_size",
    ),
    (
        Code::InvalidEnumValue,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 4}}"#,
        None,
        "/zero_optimization/stage",
    ),
    (
        Code::AutoNotAllowed,
        r#"{"train_batch_size": 8, "zero_optimization": {"sub_group_size": "auto"}}"#,
        None,
        "/zero_optimization/sub_group_size",
    ),
    (
        Code::UnknownOptimizer,
        r#"{"train_batch_size": 8, "optimizer": {"type": "AdamX"}}"#,
        None,
        "/optimizer/type",
    ),
    (
        Code::UnknownOptimizerParam,
        r#"{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"beta": [0.9, 0.99]}}}"#,
        None,
        "/optimizer/params/beta",
    ),
    (
        Code::UnknownScheduler,
        r#"{"train_batch_size": 8, "scheduler": {"type": "WarmupLinearLR"}}"#,
        None,
        "/scheduler/type",
    ),
    (
        Code::UnknownSchedulerParam,
        r#"{"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}}"#,
        None,
        "/scheduler/params/warmup_steps",
    ),
    (
        Code::MissingKey,
        r#"{"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {}}}"#,
        None,
        "/scheduler/params/total_num_steps",
    ),
    (
        Code::NeedsResolution,
        r#"{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"}"#,
        None,
        "/train_batch_size",
    ),
    (
        Code::BatchSizeMismatch,
        r#"{"train_batch_size": 20000, "train_micro_batch_size_per_gpu": 20, "gradient_accumulation_steps": 100}"#,
        Some(8),
        "/train_batch_size",
    ),
    (
        Code::BatchSizeMissing,
        r#"{"gradient_accumulation_steps": 4}"#,
        Some(8),
        "",
    ),
    (
        Code::BatchSizeNotPositive,
        r#"{"train_batch_size": 8, "gradient_accumulation_steps": 0}"#,
        None,
        "/gradient_accumulation_steps",
    ),
    (
        Code::ConflictingPrecision,
        r#"{"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}}"#,
        None,
        "/bf16/enabled",
    ),
    (
        Code::IneffectiveAtStage,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}"#,
        None,
        "/zero_optimization/offload_param",
    ),
    (
        Code::NvmeWithoutPath,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true, "offload_param": {"device": "nvme"}}}"#,
        None,
        "/zero_optimization/offload_param/device",
    ),
    (
        Code::RemovedFeature,
        r#"{"train_batch_size": 8, "sparse_attention": {"mode": "fixed"}}"#,
        None,
        "/sparse_attention",
    ),
    (
        Code::DeprecatedKey,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true}}"#,
        None,
        "/zero_optimization/cpu_offload",
    ),
    (
        Code::DeprecatedAndReplacement,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 2, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}}"#,
        None,
        "/zero_optimization/cpu_offload",
    ),
    (
        Code::EmptyModelSave,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 3}}"#,
        None,
        "/zero_optimization",
    ),
    (
        Code::IncompatibleSettings,
        r#"{"train_batch_size": 8, "prescale_gradients": true, "zero_optimization": {"stage": 2}}"#,
        None,
        "/prescale_gradients",
    ),
    (
        Code::IgnoredSetting,
        r#"{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 128, "hysteresis": 4}}"#,
        None,
        "/fp16/hysteresis",
    ),
    (
        Code::ConflictingSpellings,
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 100, "stage3_prefetch_bucket_size": 200}}"#,
        None,
        "/zero_optimization/prefetch_bucket_size",
    ),
];

/// Codes other layers emit, each with the test that covers it.
const COVERED_ELSEWHERE: &[(Code, &str)] = &[
    (
        Code::UnreadableFile,
        "tests/validate_cli.rs: a missing file exits 2",
    ),
    (
        Code::NotUtf8,
        "not_utf8_is_reported below (bytes, not text)",
    ),
    (
        Code::AutoMismatch,
        "planner/tests/resolve_hf_auto.rs: the Trainer's mismatch lines, word for word",
    ),
    (
        Code::UnresolvableAuto,
        "planner/src/resolve/tests.rs and tests/resolve_cli.rs",
    ),
    (
        Code::NormalisedString,
        "planner/src/resolve/tests.rs and tests/resolve_cli.rs",
    ),
];

fn diagnose(bytes: &[u8], world_size: Option<u64>) -> Vec<dsplan_planner::Diagnostic> {
    match validate_source("case.json", bytes, ValidateOptions { world_size }) {
        Ok((_, found)) => found,
        Err(fatal) => fatal,
    }
}

#[test]
fn every_case_produces_its_code_at_its_pointer() {
    for &(code, text, world_size, pointer) in CASES {
        let bytes = if code == Code::TooDeep {
            format!("{}{}", "{\"a\":".repeat(200), "}".repeat(200)).into_bytes()
        } else {
            text.as_bytes().to_vec()
        };
        let found = diagnose(&bytes, world_size);
        assert!(
            found.iter().any(|d| d.code == code
                && (d.pointer == pointer
                    || (code == Code::TooDeep && d.pointer.starts_with(pointer)))),
            "{code}: expected at {pointer:?} for {text}; got {:?}",
            found
                .iter()
                .map(|d| (d.code.as_str(), &d.pointer))
                .collect::<Vec<_>>()
        );
        let located = found
            .iter()
            .filter(|d| d.code == code)
            .all(|d| d.line.is_some() && d.column.is_some());
        assert!(located, "{code}: every diagnostic carries line and column");
    }
}

#[test]
fn every_code_has_a_case() {
    for code in Code::ALL {
        let covered = CASES.iter().any(|(c, ..)| c == code)
            || COVERED_ELSEWHERE.iter().any(|(c, _)| c == code);
        assert!(covered, "no test case produces `{code}`");
    }
}

#[test]
fn not_utf8_is_reported() {
    let found = diagnose(b"{\"train_batch_size\": \"\xff\"}", None);
    assert_eq!(found[0].code, Code::NotUtf8);
}

#[test]
fn a_clean_config_has_no_diagnostics() {
    let text = r#"{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}}"#;
    let found = diagnose(text.as_bytes(), Some(8));
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn severities_follow_the_contract() {
    let warning = diagnose(br#"{"train_batch_size": 8, "my_key": 1}"#, None);
    assert_eq!(warning[0].severity, Severity::Warning);
    let info = diagnose(br#"{"train_batch_size": "auto"}"#, None);
    assert!(
        info.iter().all(|d| d.severity == Severity::Info),
        "{info:?}"
    );
}
