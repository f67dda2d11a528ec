//! The configs a careful user still tripped on (issue 14): each rule's code, JSON pointer and
//! message, through `validate_source`, which `validate`, `plan`, `resolve`, `estimate` and
//! `run` share.

use dsplan_planner::diagnostics::{Code, Diagnostic, Severity};
use dsplan_planner::validate::{ValidateOptions, validate_source};

fn diagnose(text: &str) -> Vec<Diagnostic> {
    match validate_source("case.json", text.as_bytes(), ValidateOptions::default()) {
        Ok((_, found)) => found,
        Err(fatal) => fatal,
    }
}

/// The one diagnostic at `pointer`, which must have `code` and `severity`.
fn only_at(found: &[Diagnostic], pointer: &str, code: Code, severity: Severity) -> Diagnostic {
    let at: Vec<&Diagnostic> = found.iter().filter(|d| d.pointer == pointer).collect();
    assert_eq!(at.len(), 1, "{pointer}: {found:#?}");
    assert_eq!(
        (at[0].code, at[0].severity),
        (code, severity),
        "{:#?}",
        at[0]
    );
    assert!(at[0].line.is_some(), "located: {:#?}", at[0]);
    at[0].clone()
}

#[test]
fn muon_is_a_zero_supported_optimizer() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "optimizer": {"type": "Muon", "params": {"lr": 0.02, "momentum": 0.95}},
            "zero_optimization": {"stage": 2}}"#,
    );
    assert!(found.iter().all(|d| !d.is_error()), "{found:#?}");
    let lamb = diagnose(
        r#"{"train_batch_size": 8, "optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 2}}"#,
    );
    let refused = only_at(
        &lamb,
        "/optimizer/type",
        Code::IncompatibleSettings,
        Severity::Error,
    );
    assert!(
        refused
            .message
            .starts_with("ZeRO refuses the untested optimizer Lamb"),
        "{}",
        refused.message
    );
}

#[test]
fn an_integer_past_2_pow_53_is_out_of_range() {
    let found = diagnose(r#"{"train_micro_batch_size_per_gpu": 9007199254740993}"#);
    let out = only_at(
        &found,
        "/train_micro_batch_size_per_gpu",
        Code::OutOfRange,
        Severity::Error,
    );
    assert_eq!(
        out.message,
        "`train_micro_batch_size_per_gpu` must be at most 9007199254740992; found 9007199254740993"
    );
    let edge = diagnose(r#"{"train_micro_batch_size_per_gpu": 9007199254740992}"#);
    assert!(edge.iter().all(|d| d.code != Code::OutOfRange), "{edge:#?}");
}

#[test]
fn the_dynamic_scalers_window_and_floor_must_be_positive() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_window": 0, "min_loss_scale": -1}}"#,
    );
    let window = only_at(
        &found,
        "/fp16/loss_scale_window",
        Code::OutOfRange,
        Severity::Error,
    );
    assert!(
        window.message.starts_with(
            "`fp16.loss_scale_window` must be > 0 with dynamic loss scaling (loss_scale 0), found 0: DeepSpeed divides by it"
        ),
        "{}",
        window.message
    );
    let floor = only_at(
        &found,
        "/fp16/min_loss_scale",
        Code::OutOfRange,
        Severity::Error,
    );
    assert!(floor.message.contains("found -1"), "{}", floor.message);
    // A static scale does not read them: DeepSpeed accepts the file.
    let fixed = diagnose(
        r#"{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 128, "loss_scale_window": 0}}"#,
    );
    assert!(fixed.iter().all(|d| !d.is_error()), "{fixed:#?}");
}

#[test]
fn dynamic_knobs_next_to_a_static_scale_are_ignored() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": 1024, "initial_scale_power": 12, "hysteresis": 4}}"#,
    );
    for knob in ["initial_scale_power", "hysteresis"] {
        let ignored = only_at(
            &found,
            &format!("/fp16/{knob}"),
            Code::IgnoredSetting,
            Severity::Warning,
        );
        assert_eq!(
            ignored.message,
            format!(
                "`fp16.{knob}` is ignored: `loss_scale` 1024 fixes the scale, and only the dynamic loss scaler (loss_scale 0) reads `{knob}`"
            )
        );
    }
}

#[test]
fn without_zero_the_gradients_accumulate_in_the_model_dtype_or_deepspeed_raises() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "fp32"}}"#,
    );
    let mix = only_at(
        &found,
        "/data_types/grad_accum_dtype",
        Code::IncompatibleSettings,
        Severity::Error,
    );
    assert!(mix.message.contains("unsupported mix"), "{}", mix.message);
    for fine in [
        r#"{"train_batch_size": 8, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bfloat16"}}"#,
        r#"{"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}}"#,
        r#"{"train_batch_size": 8, "data_types": {"grad_accum_dtype": "float"}}"#,
    ] {
        assert!(
            diagnose(fine)
                .iter()
                .all(|d| d.pointer != "/data_types/grad_accum_dtype"),
            "{fine}"
        );
    }
}

#[test]
fn an_alias_and_its_canonical_name_with_different_values_conflict() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 3,
            "param_persistence_threshold": 1000, "stage3_param_persistence_threshold": 2000,
            "max_live_parameters": 5, "stage3_max_live_parameters": 5.0}}"#,
    );
    let clash = only_at(
        &found,
        "/zero_optimization/param_persistence_threshold",
        Code::ConflictingSpellings,
        Severity::Error,
    );
    assert_eq!(
        clash.message,
        "`param_persistence_threshold` is `stage3_param_persistence_threshold` written twice with different values: `param_persistence_threshold` = 1000 and `stage3_param_persistence_threshold` = 2000; DeepSpeed silently keeps one of them"
    );
    assert!(
        found.iter().all(|d| d.code != Code::ConflictingSpellings
            || d.pointer != "/zero_optimization/max_live_parameters"),
        "equal values are no conflict: {found:#?}"
    );
}

#[test]
fn typos_in_the_sections_deepspeed_reads_key_by_key_are_unknown_keys() {
    for (section, typo, meant) in [
        (
            "activation_checkpointing",
            "partition_activation",
            "partition_activations",
        ),
        ("aio", "queue_dept", "queue_depth"),
        ("checkpoint", "load_univeral", "load_universal"),
        ("flops_profiler", "enable", "enabled"),
        ("torch_autocast", "enable", "enabled"),
        ("data_types", "grad_accum_dtyp", "grad_accum_dtype"),
        ("autotuning", "enabeld", "enabled"),
        ("autotuning.model_info", "num_layer", "num_layers"),
        ("timers", "throughputs", "throughput"),
        ("checkpoint.writer", "decouple", "decoupled"),
        ("optimizer", "param", "params"),
        ("scheduler", "parms", "params"),
        ("expert_parallel", "autoep_sise", "autoep_size"),
    ] {
        let section_pointer = format!("/{}", section.replace('.', "/"));
        let mut document = serde_json::json!({"train_batch_size": 8});
        let mut at = &mut document;
        for part in section.split('.') {
            at = &mut at[part];
        }
        at[typo] = serde_json::json!(true);
        let found = diagnose(&serde_json::to_string_pretty(&document).expect("JSON"));
        let unknown = only_at(
            &found,
            &format!("{section_pointer}/{typo}"),
            Code::UnknownKey,
            Severity::Error,
        );
        assert_eq!(
            unknown.message,
            format!("unknown key `{typo}` in `{section}`"),
            "{unknown:#?}"
        );
        assert_eq!(
            unknown.help.as_deref(),
            Some(format!("did you mean `{meant}`?").as_str()),
            "{unknown:#?}"
        );
    }
}

#[test]
fn impossible_numeric_values_are_reported_with_their_reason() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "gradient_clipping": -1,
            "optimizer": {"type": "AdamW", "params": {"lr": -0.001, "betas": [0.9, 1.0], "eps": -1e-8, "weight_decay": -0.1}}}"#,
    );
    for (pointer, severity, start) in [
        (
            "/optimizer/params/lr",
            Severity::Error,
            "`optimizer.params.lr` is -0.001, but it must be at least 0: DeepSpeed's optimizers use it as given",
        ),
        (
            "/optimizer/params/betas/1",
            Severity::Error,
            "`optimizer.params.betas.1` is 1, but it must be in [0, 1): Adam's moment decay",
        ),
        (
            "/optimizer/params/eps",
            Severity::Error,
            "`optimizer.params.eps` is -0.00000001, but it must be at least 0",
        ),
        (
            "/optimizer/params/weight_decay",
            Severity::Warning,
            "`optimizer.params.weight_decay` is -0.1, but it must be at least 0: a negative decay grows every weight",
        ),
        (
            "/gradient_clipping",
            Severity::Warning,
            "`gradient_clipping` is -1, but it must be at least 0: DeepSpeed clips only when it is above 0",
        ),
    ] {
        let diagnostic = only_at(&found, pointer, Code::OutOfRange, severity);
        assert!(
            diagnostic.message.starts_with(start),
            "{}",
            diagnostic.message
        );
        assert!(
            diagnostic
                .help
                .as_deref()
                .is_some_and(|h| h.starts_with("DeepSpeed 0.19.8 uses it in deepspeed/")),
            "{diagnostic:#?}"
        );
    }
    assert!(
        found
            .iter()
            .all(|d| d.pointer != "/optimizer/params/betas/0"),
        "0.9 is fine: {found:#?}"
    );
}

#[test]
fn pipeline_keys_deepspeed_never_reads_are_typos_or_ignored() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "pipeline": {"pipe_partitoned": false, "chunks": 4, "stages": "auto"}}"#,
    );
    let typo = only_at(
        &found,
        "/pipeline/pipe_partitoned",
        Code::UnknownKey,
        Severity::Error,
    );
    assert_eq!(typo.message, "unknown key `pipe_partitoned` in `pipeline`");
    assert_eq!(
        typo.help.as_deref(),
        Some("did you mean `pipe_partitioned`?")
    );
    let own = only_at(
        &found,
        "/pipeline/chunks",
        Code::IgnoredSetting,
        Severity::Warning,
    );
    assert_eq!(
        own.message,
        "`pipeline.chunks` is not a DeepSpeed key; DeepSpeed ignores it"
    );
    assert!(found.iter().all(|d| d.pointer != "/pipeline/stages"));
}

#[test]
fn scheduler_bucket_and_aio_values_that_cannot_work_are_reported() {
    let cases: &[(&str, &str, Severity, &str)] = &[
        (
            r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": -0.1}}}"#,
            "/scheduler/params/warmup_min_lr",
            Severity::Error,
            "`scheduler.params.warmup_min_lr` is -0.1, but it must be at least 0: the warm-up starts at this rate",
        ),
        (
            r#"{"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": [0.1, -0.2]}}}"#,
            "/scheduler/params/warmup_max_lr/1",
            Severity::Error,
            "`scheduler.params.warmup_max_lr.1` is -0.2, but it must be at least 0",
        ),
        (
            r#"{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_min_ratio": -0.5}}}"#,
            "/scheduler/params/warmup_min_ratio",
            Severity::Error,
            "`scheduler.params.warmup_min_ratio` is -0.5, but it must be at least 0",
        ),
        (
            r#"{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "warmup_min_ratio": 2}}}"#,
            "/scheduler/params/warmup_min_ratio",
            Severity::Warning,
            "`scheduler.params.warmup_min_ratio` is 2, but it must be at most 1: the warm-up starts above",
        ),
        (
            r#"{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "cos_min_ratio": -0.1}}}"#,
            "/scheduler/params/cos_min_ratio",
            Severity::Warning,
            "`scheduler.params.cos_min_ratio` is -0.1, but it must be at least 0: the cosine aims below 0",
        ),
        (
            r#"{"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 10, "cos_min_ratio": 1.5}}}"#,
            "/scheduler/params/cos_min_ratio",
            Severity::Warning,
            "`scheduler.params.cos_min_ratio` is 1.5, but it must be at most 1",
        ),
        (
            r#"{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": -1e-4, "cycle_max_lr": 1e-3}}}"#,
            "/scheduler/params/cycle_min_lr",
            Severity::Error,
            "`scheduler.params.cycle_min_lr` is -0.0001, but it must be at least 0",
        ),
        (
            r#"{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": -1e-3}}}"#,
            "/scheduler/params/cycle_max_lr",
            Severity::Error,
            "`scheduler.params.cycle_max_lr` is -0.001, but it must be at least 0",
        ),
        (
            r#"{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "decay_lr_rate": -0.5}}}"#,
            "/scheduler/params/decay_lr_rate",
            Severity::Error,
            "`scheduler.params.decay_lr_rate` is -0.5, but it must be at least 0: after the cycle",
        ),
        (
            r#"{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_min_mom": 1.0}}}"#,
            "/scheduler/params/cycle_min_mom",
            Severity::Error,
            "`scheduler.params.cycle_min_mom` is 1, but it must be in [0, 1): it becomes the optimizer's beta1",
        ),
        (
            r#"{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_max_mom": -0.9}}}"#,
            "/scheduler/params/cycle_max_mom",
            Severity::Error,
            "`scheduler.params.cycle_max_mom` is -0.9, but it must be in [0, 1)",
        ),
        (
            r#"{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": -1e-3}}}"#,
            "/scheduler/params/lr_range_test_min_lr",
            Severity::Error,
            "`scheduler.params.lr_range_test_min_lr` is -0.001, but it must be at least 0",
        ),
        (
            r#"{"scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_rate": -2}}}"#,
            "/scheduler/params/lr_range_test_step_rate",
            Severity::Error,
            "`scheduler.params.lr_range_test_step_rate` is -2, but it must be at least 0: the factor",
        ),
        (
            r#"{"zero_optimization": {"stage": 3, "sub_group_size": 0}}"#,
            "/zero_optimization/sub_group_size",
            Severity::Warning,
            "`zero_optimization.sub_group_size` is 0, but it must be above 0: every parameter becomes its own optimizer sub-group",
        ),
        (
            r#"{"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 0}}"#,
            "/zero_optimization/stage3_max_live_parameters",
            Severity::Warning,
            "`zero_optimization.stage3_max_live_parameters` is 0, but it must be above 0: the prefetch budget",
        ),
        (
            r#"{"zero_optimization": {"stage": 3, "max_live_parameters": 0}}"#,
            "/zero_optimization/max_live_parameters",
            Severity::Warning,
            "`zero_optimization.max_live_parameters` is 0, but it must be above 0",
        ),
        (
            r#"{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 0}}}"#,
            "/zero_optimization/offload_param/buffer_count",
            Severity::Error,
            "`zero_optimization.offload_param.buffer_count` is 0, but it must be above 0: the parameter swapper has no buffer",
        ),
        (
            r#"{"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_size": 0}}}"#,
            "/zero_optimization/offload_param/buffer_size",
            Severity::Error,
            "`zero_optimization.offload_param.buffer_size` is 0, but it must be above 0",
        ),
        (
            r#"{"aio": {"block_size": 0}}"#,
            "/aio/block_size",
            Severity::Error,
            "`aio.block_size` is 0, but it must be above 0: each transfer is cut into num_bytes / block_size requests",
        ),
        (
            r#"{"aio": {"queue_depth": 0}}"#,
            "/aio/queue_depth",
            Severity::Error,
            "`aio.queue_depth` is 0, but it must be above 0: the submit loop advances by queue_depth",
        ),
        (
            r#"{"aio": {"intra_op_parallelism": 0}}"#,
            "/aio/intra_op_parallelism",
            Severity::Error,
            "`aio.intra_op_parallelism` is 0, but it must be above 0",
        ),
    ];
    for (config, pointer, severity, start) in cases {
        let mut document: serde_json::Value = serde_json::from_str(config).expect("JSON");
        document["train_batch_size"] = serde_json::json!(8);
        let found = diagnose(&serde_json::to_string_pretty(&document).expect("JSON"));
        let diagnostic = only_at(&found, pointer, Code::OutOfRange, *severity);
        assert!(
            diagnostic.message.starts_with(start),
            "{pointer}: {}",
            diagnostic.message
        );
        let help = diagnostic.help.as_deref().unwrap_or_default();
        assert!(
            help.starts_with("DeepSpeed 0.19.8 uses it in deepspeed/")
                || help.starts_with("DeepSpeed 0.19.8 uses it in csrc/"),
            "{pointer}: {help}"
        );
        assert!(help.contains(".py:") || help.contains(".cpp:"), "{help}");
    }
}

#[test]
fn stage3_and_nvme_knobs_are_not_checked_where_deepspeed_does_not_use_them() {
    let found = diagnose(
        r#"{"train_batch_size": 8, "zero_optimization": {"stage": 2, "sub_group_size": 0,
            "offload_param": {"device": "cpu", "buffer_count": 0}}}"#,
    );
    assert!(
        found.iter().all(|d| d.code != Code::OutOfRange),
        "{found:#?}"
    );
}
