//! Resolution end to end on small configs: the Trainer's rules, provenance, severities and the
//! materialised defaults.

use serde_json::{Value, json};

use super::*;
use crate::diagnostics::Severity;

fn env(world_size: u64) -> Environment {
    Environment {
        world_size: Some(world_size),
        ..Environment::default()
    }
}

fn hf_config() -> Value {
    json!({
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}
    })
}

fn given_env() -> Environment {
    let mut env = env(8);
    let args = &mut env.training_args;
    args.per_device_train_batch_size = Arg::given(2, ArgOrigin::Flag);
    args.gradient_accumulation_steps = Arg::given(4, ArgOrigin::Flag);
    args.learning_rate = Arg::given(2e-5, ArgOrigin::Flag);
    args.warmup_steps = Arg::given(WarmupSteps::Ratio(0.03), ArgOrigin::Flag);
    args.bf16 = Arg::given(true, ArgOrigin::Flag);
    args.num_training_steps = Some(Arg::given(5000, ArgOrigin::Flag));
    env.hidden_size = HiddenSizeLookup::Known(HiddenSize::from_flag(4096));
    env
}

/// No `"auto"` left, except DeepSpeed's own `data_types.keep_in_fp32_modules: "auto"` (a
/// DeepSpeed value meaning "ask transformers", not something to fill).
fn no_auto_left(value: &Value) -> bool {
    match value {
        Value::String(s) => s != "auto",
        Value::Array(items) => items.iter().all(no_auto_left),
        Value::Object(map) => map
            .iter()
            .all(|(key, member)| key == "keep_in_fp32_modules" || no_auto_left(member)),
        _ => true,
    }
}

#[test]
fn fills_every_auto_with_the_trainers_values_and_says_where_from() {
    let resolved = resolve(&hf_config(), &given_env()).expect("resolves");
    let c = &resolved.config;
    assert!(no_auto_left(c), "{c:#}");
    assert_eq!(c["train_batch_size"], json!(64));
    assert_eq!(c["optimizer"]["params"]["lr"], json!(2e-5));
    assert_eq!(c["optimizer"]["params"]["betas"], json!([0.9, 0.999]));
    assert_eq!(c["gradient_clipping"], json!(1.0));
    assert_eq!(c["scheduler"]["params"]["warmup_num_steps"], json!(150));
    assert_eq!(c["scheduler"]["params"]["total_num_steps"], json!(5000));
    assert_eq!(c["scheduler"]["params"]["warmup_type"], json!("log"));
    assert_eq!(c["bf16"]["enabled"], json!(true));
    let zero = &c["zero_optimization"];
    assert_eq!(zero["reduce_bucket_size"], json!(16_777_216));
    // int(0.9 * 4096 * 4096) = int(15099494.4): a float here is what DeepSpeed >= 0.15 refuses.
    assert_eq!(zero["stage3_prefetch_bucket_size"], json!(15_099_494));
    assert_eq!(zero["stage3_param_persistence_threshold"], json!(40_960));
    assert_eq!(zero["overlap_comm"], json!(true));

    let origin = |p: &str| resolved.provenance.get(p).cloned().expect(p);
    assert_eq!(
        origin("/optimizer/params/lr"),
        Provenance::Flag {
            name: "learning_rate".into(),
            given_by: "--learning-rate".into()
        }
    );
    assert_eq!(
        origin("/optimizer/params/eps"),
        Provenance::TrainingArgDefault {
            name: "adam_epsilon".into(),
            value: "1e-08".into()
        }
    );
    match origin("/scheduler/params/warmup_num_steps") {
        Provenance::AutoRule { formula, .. } => assert_eq!(
            formula,
            "max(1, ceil(num_training_steps × warmup_steps)) = max(1, ceil(5000 × 0.03)) = 150"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        origin("/zero_optimization/stage"),
        Provenance::File {
            pointer: "/zero_optimization/stage".into()
        }
    );
    assert!(matches!(
        origin("/zero_optimization/overlap_comm"),
        Provenance::DeepSpeedDefault { note: Some(_) }
    ));
    assert_eq!(
        origin("/zero_optimization/contiguous_gradients"),
        Provenance::deepspeed_default()
    );
    assert!(
        resolved.provenance.len() > 80,
        "every value is traced: {}",
        resolved.provenance.len()
    );
    let schedule = resolved.schedule.as_ref().expect("a DeepSpeed scheduler");
    assert_eq!(schedule.schedule.lr_at(0), 0.0);
    assert_eq!(
        resolved,
        resolve(&hf_config(), &given_env()).expect("again")
    );
}

#[test]
fn every_mismatch_is_reported_with_the_flag_to_change() {
    let config = json!({
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}}
    });
    let mut env = env(2);
    env.training_args.per_device_train_batch_size = Arg::given(8, ArgOrigin::Flag);
    env.training_args.learning_rate = Arg::given(3e-5, ArgOrigin::Flag);
    let errors = resolve(&config, &env).expect_err("mismatches");
    let mismatches: Vec<(&str, Severity)> = errors
        .iter()
        .filter(|d| d.code == Code::AutoMismatch)
        .map(|d| (d.pointer.as_str(), d.severity))
        .collect();
    assert_eq!(
        mismatches,
        [
            ("/train_micro_batch_size_per_gpu", Severity::Error),
            ("/gradient_clipping", Severity::Warning),
            ("/optimizer/params/lr", Severity::Error),
            ("/optimizer/params/betas", Severity::Warning),
        ]
    );
    let lr = &errors[2];
    assert!(
        lr.message
            .starts_with("ds optimizer.params.lr=0.001 vs hf learning_rate=3e-05"),
        "{}",
        lr.message
    );
    assert_eq!(
        lr.help.as_deref(),
        Some("pass --learning-rate 0.001, or set `optimizer.params.lr` to \"auto\"")
    );
    let betas = errors[3].help.as_deref().unwrap_or_default();
    assert!(
        betas.contains("--adam-beta1 0.9 --adam-beta2 0.95"),
        "{betas}"
    );
}

#[test]
fn defaults_alone_only_warn_and_the_file_wins() {
    let config = json!({"train_batch_size": 32, "gradient_clipping": 0.5,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}});
    let resolved = resolve(&config, &env(8)).expect("plain DeepSpeed config");
    assert_eq!(resolved.config["gradient_clipping"], json!(0.5));
    assert_eq!(
        resolved.config["optimizer"]["params"]["adam_w_mode"],
        json!(true)
    );
    assert_eq!(
        resolved.config["optimizer"]["params"]["weight_decay"],
        json!(0.0)
    );
    assert!(
        resolved
            .diagnostics
            .iter()
            .filter(|d| d.code == Code::AutoMismatch)
            .all(|d| d.severity == Severity::Warning)
    );
    assert_eq!(resolved.batch.train_micro_batch_size_per_gpu, 4);
    assert!(matches!(
        resolved.provenance["/train_micro_batch_size_per_gpu"],
        Provenance::BatchDerivation { .. }
    ));
}

#[test]
fn a_quoted_number_is_normalised_instead_of_a_mismatch_8_vs_8() {
    let config = json!({"train_micro_batch_size_per_gpu": "8"});
    let mut env = env(1);
    env.training_args.per_device_train_batch_size = Arg::given(8, ArgOrigin::Flag);
    let resolved = resolve(&config, &env).expect("resolves");
    let codes: Vec<Code> = resolved.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, [Code::NormalisedString]);
    assert_eq!(resolved.batch.train_batch_size, 8);
}

#[test]
fn unresolvable_autos_name_the_flag_that_fills_them() {
    let errors = resolve(&hf_config(), &env(8)).expect_err("no hidden size, no step count");
    let unresolvable: Vec<(&str, &str)> = errors
        .iter()
        .filter(|d| d.code == Code::UnresolvableAuto)
        .map(|d| (d.pointer.as_str(), d.help.as_deref().unwrap_or_default()))
        .collect();
    let pointers: Vec<&str> = unresolvable.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        pointers,
        [
            "/zero_optimization/reduce_bucket_size",
            "/zero_optimization/stage3_prefetch_bucket_size",
            "/zero_optimization/stage3_param_persistence_threshold",
            "/scheduler/params/total_num_steps",
        ]
    );
    assert!(unresolvable[0].1.contains("--hidden-size"));
    assert!(unresolvable[3].1.contains("--num-training-steps"));
    // Default warm-up 0 needs no step count: max(1, 0) = 1.
    assert!(!pointers.contains(&"/scheduler/params/warmup_num_steps"));
}

#[test]
fn zero3_bucket_autos_below_stage_3_fall_back_to_deepspeeds_defaults() {
    let config = json!({"train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto", "stage3_gather_16bit_weights_on_model_save": "auto"}});
    let mut env = env(1);
    env.hidden_size = HiddenSizeLookup::Known(HiddenSize::from_flag(1024));
    let resolved = resolve(&config, &env).expect("resolves");
    let zero = &resolved.config["zero_optimization"];
    assert_eq!(zero["reduce_bucket_size"], json!(1_048_576));
    assert_eq!(zero["stage3_prefetch_bucket_size"], json!(50_000_000));
    assert_eq!(
        zero["stage3_gather_16bit_weights_on_model_save"],
        json!(false)
    );
    assert_eq!(zero["overlap_comm"], json!(false));
    assert!(matches!(
        &resolved.provenance["/zero_optimization/stage3_prefetch_bucket_size"],
        Provenance::DeepSpeedDefault { note: Some(note) } if note.contains("stage 3")
    ));
}

#[test]
fn deprecated_spellings_are_rewritten_and_traced_to_the_old_key() {
    let config = json!({"train_batch_size": 8,
        "zero_optimization": {"stage": 2, "cpu_offload": true, "max_live_parameters": 1e8}});
    let resolved = resolve(&config, &env(1)).expect("resolves");
    let zero = &resolved.config["zero_optimization"];
    assert_eq!(zero["offload_optimizer"]["device"], json!("cpu"));
    assert_eq!(zero["offload_optimizer"]["pin_memory"], json!(true));
    assert!(zero.get("cpu_offload").is_none());
    assert_eq!(zero["stage3_max_live_parameters"], json!(100_000_000));
    let origin = |p: &str| resolved.provenance[p].clone();
    assert_eq!(
        origin("/zero_optimization/offload_optimizer/device"),
        Provenance::File {
            pointer: "/zero_optimization/cpu_offload".into()
        }
    );
    assert_eq!(
        origin("/zero_optimization/stage3_max_live_parameters"),
        Provenance::File {
            pointer: "/zero_optimization/max_live_parameters".into()
        }
    );
}

#[test]
fn deepspeed_refusals_stay_refusals() {
    let both = json!({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}});
    let errors = resolve(&both, &env(1)).expect_err("fp16 and bf16");
    assert!(errors.iter().any(|d| d.code == Code::ConflictingPrecision));
    let indivisible = json!({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4});
    let errors = resolve(&indivisible, &env(1)).expect_err("10 is not 4 × k");
    assert!(errors.iter().any(|d| d.code == Code::BatchSizeMismatch));
    let no_world = Environment::default();
    let errors = resolve(&json!({"train_batch_size": "auto"}), &no_world).expect_err("ws");
    assert!(
        errors[0]
            .help
            .as_deref()
            .unwrap_or_default()
            .contains("--world-size")
    );
}
