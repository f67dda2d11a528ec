//! Tests of the config model as a whole: lenient integers through [`from_value`], `"auto"`
//! exactly at the Hugging Face keys, aliases, deprecated and removed keys, and the agreement
//! between the registry tables, the types and the schema.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::registry::{
    ALIASES, AUTO_KEYS, DEPRECATED_KEYS, NameMatching, REMOVED_FEATURES, Requirement,
    known_top_level_keys, optimizer_spec, scheduler_spec,
};
use super::*;
use crate::config::checkpoint::{CheckpointDataParallel, CheckpointWriterConfig};
use crate::config::misc::ModelInfoConfig;
use crate::config::monitors::CometMode;
use crate::config::parallel::CompilePass;
use crate::config::primitives::PositiveInt;

fn read(document: Value) -> Result<DsConfig, String> {
    from_value(&document)
}

#[test]
fn integral_floats_are_accepted_for_integer_fields() {
    let config = read(json!({
        "train_micro_batch_size_per_gpu": 4.0,
        "steps_per_print": 100000.0,
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 5e8,
            "stage3_max_live_parameters": 1e9,
            "sub_group_size": 1e14,
        }
    }))
    .expect("integral floats are integers");
    let zero = &config.zero_optimization;
    assert_eq!(
        zero.reduce_bucket_size.value().map(|v| v.get()),
        Some(500_000_000)
    );
    assert_eq!(zero.max_live_parameters.get(), 1_000_000_000);
    assert_eq!(zero.sub_group_size.get(), 100_000_000_000_000);
    assert_eq!(
        config.steps_per_print.map(NonNegativeInt::get),
        Some(100_000)
    );
}

#[test]
fn fractional_values_are_rejected_with_their_section() {
    let error = read(json!({"zero_optimization": {"allgather_bucket_size": 2.5}}))
        .expect_err("2.5 is not an integer");
    assert!(error.contains("zero_optimization"), "{error}");
    assert!(error.contains("fractional"), "{error}");
    let error = read(json!({"fp16": {"enabled": true, "min_loss_scale": 0.5}}))
        .expect_err("0.19.8 refuses a fractional min_loss_scale");
    assert!(error.starts_with("`fp16`"), "{error}");
    assert!(
        read(json!({"train_batch_size": 0})).is_err(),
        "batch sizes are positive"
    );
    assert!(read(json!({"zero_optimization": {"reduce_bucket_size": 0}})).is_err());
}

#[test]
fn closed_sections_reject_unknown_keys_and_the_top_level_ignores_them() {
    let error = read(json!({"fp16": {"enabled": true, "opt_level": "O2"}})).expect_err("opt_level");
    assert!(error.contains("opt_level"), "{error}");
    let error = read(json!({"compile": {"disable": false}})).expect_err("compile.disable");
    assert!(error.contains("disable"), "{error}");
    let error = read(json!({"bf16": {"enabled": true, "loss_scale": 0}})).expect_err("bf16");
    assert!(error.contains("loss_scale"), "{error}");
    assert!(read(json!({"zero_optimization": {"overlap_com": true}})).is_err());
    // The top level ignores what it does not read, as DeepSpeed does; dictionary-lookup
    // sections refuse a typo, which DeepSpeed would silently ignore.
    read(json!({"cuda_visible_devices": 0})).expect("DeepSpeed ignores it");
    let error = read(json!({"activation_checkpointing": {"partition_activation": true}}))
        .expect_err("a typo in a dictionary-lookup section");
    assert!(error.contains("partition_activation"), "{error}");
}

#[test]
fn defaults_are_deepspeed_0_19_8s() {
    let config = read(json!({})).expect("an empty config is valid");
    assert_eq!(config.gradient_clipping, AutoOr::Value(1.0));
    assert_eq!(config.steps_per_print, None);
    let zero = &config.zero_optimization;
    assert_eq!(zero.stage, ZeroStage::Disabled);
    assert_eq!(
        zero.prefetch_bucket_size.value().map(|v| v.get()),
        Some(50_000_000)
    );
    assert_eq!(zero.sub_group_size.get(), 1_000_000_000);
    assert!(!zero.overlap_comm_resolved());
    let stage3 = read(json!({"zero_optimization": {"stage": 3}})).expect("stage 3");
    assert!(stage3.zero_optimization.overlap_comm_resolved());
    let offload = read(json!({"zero_optimization": {"offload_param": {}}})).expect("offload");
    let param = offload.zero_optimization.offload_param.expect("present");
    assert_eq!(param.device, OffloadDevice::None);
    assert!(param.pin_memory);
    assert!(config.bf16.check_grad_overflow);
    assert_eq!(config.flops_profiler.top_modules.get(), 1);
}

#[test]
fn the_default_config_survives_a_round_trip() {
    let written = serde_json::to_value(DsConfig::default()).expect("serialise");
    assert_eq!(
        read(written.clone()).expect("read back"),
        DsConfig::default()
    );
    let full = serde_json::to_value(full_config()).expect("serialise");
    assert_eq!(read(full).expect("read back"), full_config());
}

#[test]
fn legacy_boolean_zero_section_means_stage_one() {
    let config = read(json!({"zero_optimization": true, "allgather_size": 2e8})).expect("legacy");
    assert_eq!(config.zero_optimization.stage, ZeroStage::OptimizerStates);
    assert_eq!(
        config.zero_optimization.allgather_bucket_size.get(),
        200_000_000
    );
    let off = read(json!({"zero_optimization": false})).expect("legacy off");
    assert_eq!(off.zero_optimization.stage, ZeroStage::Disabled);
}

#[test]
fn auto_is_accepted_exactly_at_the_hugging_face_keys() {
    let document = serde_json::to_value(full_config()).expect("serialise");
    let mut leaves = Vec::new();
    collect_leaves(&document, String::new(), &mut leaves);
    let leaf_set: BTreeSet<&str> = leaves.iter().map(String::as_str).collect();
    for key in AUTO_KEYS {
        assert!(
            leaf_set.contains(key),
            "{key} is not covered by the test document"
        );
    }
    let mut accepted = BTreeSet::new();
    for pointer in &leaves {
        let mut changed = document.clone();
        *changed.pointer_mut(pointer).expect("leaf exists") = json!("auto");
        if read(changed).is_ok() {
            accepted.insert(pointer.as_str());
        }
    }
    let mut expected: BTreeSet<&str> = AUTO_KEYS.iter().copied().collect();
    expected.extend(DEEPSPEED_OWN_AUTO);
    expected.extend(FREE_STRINGS);
    assert_eq!(accepted, expected);
}

#[test]
fn auto_under_a_second_spelling_is_refused() {
    assert!(read(json!({"zero_optimization": {"stage3_prefetch_bucket_size": "auto"}})).is_ok());
    let error = read(json!({"zero_optimization": {"prefetch_bucket_size": "auto"}}))
        .expect_err("HF fills only the stage3_ spelling");
    assert!(error.contains("stage3_prefetch_bucket_size"), "{error}");
    assert!(read(json!({"bfloat16": {"enabled": "auto"}})).is_err());
    assert!(read(json!({"bf16": {"enabled": "auto"}})).is_ok());
}

#[test]
fn the_schema_allows_auto_exactly_at_the_hugging_face_keys() {
    let schema = schema();
    let mut found = BTreeSet::new();
    auto_pointers(&schema, &schema, String::new(), 0, &mut found);
    let expected: BTreeSet<String> = AUTO_KEYS.iter().map(|k| (*k).to_string()).collect();
    assert_eq!(found, expected);
}

#[test]
fn every_alias_reads_like_its_canonical_spelling_and_is_in_the_schema() {
    let schema = schema();
    for alias in ALIASES {
        let sample = alias_sample(alias.canonical);
        let build = |key: &str| {
            let mut section = Map::new();
            section.insert(key.to_string(), sample.clone());
            let mut top = Map::new();
            top.insert(alias.parent[1..].to_string(), Value::Object(section));
            Value::Object(top)
        };
        let by_alias = read(build(alias.alias)).expect("alias spelling");
        let by_name = read(build(alias.canonical)).expect("canonical spelling");
        assert_eq!(by_alias, by_name, "{} vs {}", alias.alias, alias.canonical);
        assert_ne!(
            by_name,
            DsConfig::default(),
            "{}: sample is the default",
            alias.canonical
        );
        let section = section_schema(&schema, alias.parent);
        for key in [alias.alias, alias.canonical] {
            assert!(section["properties"].get(key).is_some(), "{key} missing");
        }
    }
}

#[test]
fn deprecated_keys_are_accepted_and_marked() {
    let schema = schema();
    for entry in DEPRECATED_KEYS {
        let property = &section_schema(&schema, entry.parent)["properties"][entry.old];
        let marked = property.get("deprecated") == Some(&json!(true))
            || property["anyOf"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b.get("deprecated") == Some(&json!(true))));
        assert!(
            marked,
            "{}/{} is not marked deprecated",
            entry.parent, entry.old
        );
    }
    let config = read(json!({
        "bfloat16": {"enabled": true},
        "zero_optimization": {
            "cpu_offload": true,
            "cpu_offload_param": true,
            "cpu_offload_use_pin_memory": true,
            "stage3_gather_fp16_weights_on_model_save": true,
        },
        "aio": {"thread_count": 2},
    }))
    .expect("deprecated keys still parse");
    assert_eq!(config.zero_optimization.cpu_offload, Some(true));
    assert!(config.bfloat16.is_some());
}

#[test]
fn removed_features_are_refused_with_deepspeeds_message() {
    let schema = schema();
    for feature in REMOVED_FEATURES {
        let mut section = Map::new();
        section.insert(feature.key.to_string(), json!({}));
        let document = if feature.parent.is_empty() {
            Value::Object(section)
        } else {
            let mut doc = json!({});
            let mut at = &mut doc;
            for token in feature.parent.split('/').skip(1) {
                at = at
                    .as_object_mut()
                    .expect("object")
                    .entry(token)
                    .or_insert_with(|| json!({}));
            }
            *at = Value::Object(section);
            doc
        };
        let error = read(document).expect_err(feature.key);
        assert!(error.contains(feature.message), "{error}");
        let property = &section_schema(&schema, feature.parent)["properties"][feature.key];
        assert_eq!(property["allOf"], json!([false]), "{}", feature.key);
    }
    assert!(!known_top_level_keys().iter().any(|k| k == "amp"));
}

#[test]
fn registry_lookups_follow_deepspeeds_matching_rules() {
    let adamw = optimizer_spec("adamw").expect("DeepSpeed names ignore case");
    assert_eq!(adamw.name, "AdamW");
    assert!(adamw.params.contains(&"adam_w_mode"));
    assert!(adamw.params.contains(&"torch_adam"));
    assert_eq!(optimizer_spec("sgd"), None, "torch.optim names are exact");
    assert_eq!(
        optimizer_spec("SGD").map(|s| s.matching),
        Some(NameMatching::Exact)
    );
    let decay = scheduler_spec("WarmupDecayLR").expect("scheduler");
    let required: Vec<&str> = decay
        .params
        .iter()
        .filter(|p| p.requirement == Requirement::Required)
        .map(|p| p.name)
        .collect();
    assert_eq!(required, ["total_num_steps"]);
    assert_eq!(
        scheduler_spec("warmuplr"),
        None,
        "scheduler names are case-sensitive"
    );
    let keys = known_top_level_keys();
    for key in [
        "zero_optimization",
        "bfloat16",
        "gradient_clipping",
        "tensor_parallel",
    ] {
        assert!(keys.iter().any(|k| k == key), "{key}");
    }
    assert!(!keys.iter().any(|k| k == "$schema"));
}

#[test]
fn typed_scheduler_parameters_match_the_registry() {
    let typed: BTreeSet<String> = schema()["$defs"]["SchedulerParams"]["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .cloned()
        .collect();
    for spec in registry::SCHEDULERS {
        for param in spec.params {
            assert!(typed.contains(param.name), "{}.{}", spec.name, param.name);
        }
    }
}

/// Pointers where a DeepSpeed-native `"auto"` (not the Trainer's) is a valid value.
const DEEPSPEED_OWN_AUTO: &[&str] = &[
    "/zero_optimization/zenflow/select_strategy",
    "/zero_optimization/zenflow/select_interval",
    "/zero_optimization/zenflow/update_interval",
    "/data_types/keep_in_fp32_modules",
];

/// Free-text fields, where `"auto"` is just a string.
const FREE_STRINGS: &[&str] = &[
    "/$schema",
    "/optimizer/type",
    "/scheduler/type",
    "/zero_optimization/offload_param/nvme_path",
    "/zero_optimization/offload_optimizer/nvme_path",
    "/zero_optimization/leaf_module/classes",
    "/zero_optimization/leaf_module/names",
    "/zero_optimization/leaf_module/name_suffixes",
    "/tensor_parallel/preset_model",
    "/flops_profiler/output_file",
    "/tensorboard/output_path",
    "/tensorboard/job_name",
    "/csv_monitor/output_path",
    "/csv_monitor/job_name",
    "/wandb/group",
    "/wandb/team",
    "/wandb/project",
    "/comet/project",
    "/comet/workspace",
    "/comet/api_key",
    "/comet/experiment_name",
    "/comet/experiment_key",
    "/autotuning/results_dir",
    "/autotuning/exps_dir",
    "/autotuning/metric_path",
    "/autotuning/model_info_path",
];

/// A config with every optional field present, so that every typed leaf can be probed.
fn full_config() -> DsConfig {
    let mut config = DsConfig {
        schema: Some("https://example.invalid/ds_config.schema.json".into()),
        train_batch_size: PositiveInt::new(32).map(AutoOr::Value),
        train_micro_batch_size_per_gpu: PositiveInt::new(4).map(AutoOr::Value),
        gradient_accumulation_steps: PositiveInt::new(8).map(AutoOr::Value),
        communication_data_type: Some(CommDataType::Bf16),
        bfloat16: Some(LegacyBf16Config::default()),
        allgather_size: Some(NonNegativeInt(1000)),
        sequence_parallel_size: Some(NonNegativeInt(1)),
        weight_quantization: Some(WeightQuantizationConfig::default()),
        steps_per_print: Some(NonNegativeInt(10)),
        log_level: Some(LogLevel::Info),
        comms_logger: Some(CommsLoggerConfig::default()),
        vocabulary_size: Some(NonNegativeInt(50_304)),
        ..DsConfig::default()
    };
    config.optimizer = Some(OptimizerConfig {
        kind: Some("AdamW".into()),
        params: OptimizerParams {
            lr: Some(AutoOr::Value(1e-4)),
            betas: Some(AutoOr::Value([0.9, 0.95])),
            eps: Some(AutoOr::Value(1e-8)),
            weight_decay: Some(AutoOr::Value(0.1)),
            bias_correction: Some(true),
            adam_w_mode: Some(true),
            torch_adam: Some(false),
            fp32_optimizer_states: Some(true),
            other: Map::new(),
        },
        legacy_fusion: false,
    });
    let steps = |n| PositiveInt::new(n).map(AutoOr::Value);
    config.scheduler = Some(SchedulerConfig {
        kind: Some("WarmupDecayLR".into()),
        params: SchedulerParams {
            warmup_min_lr: Some(AutoOr::Value(LearningRate::Single(0.0))),
            warmup_max_lr: Some(AutoOr::Value(LearningRate::Single(1e-4))),
            warmup_num_steps: steps(100),
            warmup_type: Some(WarmupType::Linear),
            total_num_steps: Some(AutoOr::Value(NonNegativeInt(1000))),
            warmup_min_ratio: Some(0.0),
            cos_min_ratio: Some(1e-4),
            cycle_min_lr: Some(1e-5),
            cycle_max_lr: Some(1e-3),
            decay_lr_rate: Some(0.0),
            cycle_first_step_size: Some(NonNegativeInt(100)),
            cycle_second_step_size: Some(NonNegativeInt(100)),
            cycle_first_stair_count: Some(NonNegativeInt(0)),
            cycle_second_stair_count: Some(NonNegativeInt(0)),
            decay_step_size: Some(NonNegativeInt(0)),
            cycle_momentum: Some(true),
            cycle_min_mom: Some(0.8),
            cycle_max_mom: Some(0.9),
            decay_mom_rate: Some(0.0),
            lr_range_test_min_lr: Some(LearningRate::PerGroup(vec![1e-3])),
            lr_range_test_step_size: Some(NonNegativeInt(2000)),
            lr_range_test_step_rate: Some(1.0),
            lr_range_test_staircase: Some(false),
            last_batch_iteration: Some(Integer(-1)),
            other: Map::new(),
        },
    });
    let zero = &mut config.zero_optimization;
    zero.stage = ZeroStage::Weights;
    zero.overlap_comm = Some(true);
    zero.offload_param = Some(OffloadParamConfig {
        nvme_path: Some("/local_nvme".into()),
        ..OffloadParamConfig::default()
    });
    zero.offload_optimizer = Some(OffloadOptimizerConfig {
        nvme_path: Some("/local_nvme".into()),
        ..OffloadOptimizerConfig::default()
    });
    zero.zenflow = Some(ZenflowConfig {
        steps_per_epoch: Some(NonNegativeInt(100)),
        ..ZenflowConfig::default()
    });
    zero.cpu_offload_param = Some(false);
    zero.cpu_offload_use_pin_memory = Some(false);
    zero.cpu_offload = Some(false);
    zero.model_persistence_threshold = Some(NonNegativeInt(1 << 40));
    zero.stage3_gather_fp16_weights_on_model_save = Some(false);
    config.torch_autocast.dtype = Some(DtypeName::Bf16);
    config.torch_autocast.lower_precision_safe_modules =
        Some(vec!["torch.nn.modules.linear.Linear".into()]);
    config.data_types.grad_accum_dtype = Some(DtypeName::Fp32);
    config.data_types.param_dtype = Some(DtypeName::Bf16);
    config.data_types.buffer_dtype = Some(DtypeName::Fp32);
    config.activation_checkpointing.number_checkpoints = Some(NonNegativeInt(4));
    config.tensor_parallel.vocab_parallel_lm_head = Some(false);
    config.tensor_parallel.preset_model = Some("llama".into());
    config.compile.passes = Some(vec![CompilePass::Z3]);
    config.checkpoint.writer = Some(CheckpointWriterConfig {
        data_parallel: Some(CheckpointDataParallel::Replica),
        ..CheckpointWriterConfig::default()
    });
    config.aio.thread_count = Some(NonNegativeInt(1));
    config.flops_profiler.output_file = Some("flops.txt".into());
    config.wandb.group = Some("g".into());
    config.wandb.team = Some("t".into());
    config.comet = CometConfig {
        project: Some("p".into()),
        workspace: Some("w".into()),
        api_key: Some("k".into()),
        experiment_name: Some("n".into()),
        experiment_key: Some("0123456789abcdef0123456789abcdef".into()),
        online: Some(true),
        mode: Some(CometMode::GetOrCreate),
        ..CometConfig::default()
    };
    config.autotuning.metric_path = Some("metric.json".into());
    config.autotuning.model_info = Some(ModelInfoConfig {
        profile: false,
        num_params: Some(NonNegativeInt(1000)),
        hidden_size: Some(NonNegativeInt(64)),
        num_layers: Some(NonNegativeInt(2)),
    });
    config.autotuning.model_info_path = Some("model_info.json".into());
    config.autotuning.max_train_batch_size = Some(NonNegativeInt(64));
    config
}

/// Every scalar (and every array, as a whole) in `value`, as JSON pointers.
fn collect_leaves(value: &Value, pointer: String, out: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (key, member) in members {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                collect_leaves(member, format!("{pointer}/{escaped}"), out);
            }
        }
        _ => out.push(pointer),
    }
}

/// Config pointers whose schema has a `{"const": "auto"}` branch.
fn auto_pointers(
    root: &Value,
    node: &Value,
    pointer: String,
    depth: usize,
    out: &mut BTreeSet<String>,
) {
    assert!(depth < 12, "schema too deep at {pointer}");
    let node = follow(root, node);
    if let Some(branches) = node.get("anyOf").and_then(Value::as_array) {
        for branch in branches {
            if branch.get("const") == Some(&json!("auto")) {
                out.insert(pointer.clone());
            } else {
                auto_pointers(root, branch, pointer.clone(), depth + 1, out);
            }
        }
    }
    if let Some(properties) = node.get("properties").and_then(Value::as_object) {
        for (key, property) in properties {
            auto_pointers(root, property, format!("{pointer}/{key}"), depth + 1, out);
        }
    }
}

fn follow<'a>(root: &'a Value, mut node: &'a Value) -> &'a Value {
    while let Some(reference) = node.get("$ref").and_then(Value::as_str) {
        node = root
            .pointer(reference.trim_start_matches('#'))
            .expect("references resolve");
    }
    node
}

/// The object schema of the config section at `pointer`.
fn section_schema<'a>(schema: &'a Value, pointer: &str) -> &'a Value {
    let path = schema::object_schema_path(schema, pointer).expect("section exists");
    schema.pointer(&path).expect("path resolves")
}

/// A value for the key `canonical` that differs from its default.
fn alias_sample(canonical: &str) -> Value {
    match canonical {
        "stage3_gather_16bit_weights_on_model_save"
        | "stage3_use_all_reduce_for_fetch_params"
        | "stage3_allgather_sequential"
        | "replace_with_kernel_inject" => json!(true),
        "tensor_parallel" => json!({"tp_size": 2}),
        _ => json!(12_345),
    }
}

#[test]
fn a_refused_config_names_the_nested_key_to_blame() {
    let document = json!({
        "train_batch_size": 8,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": -5, "overlap_comm": true}
    });
    assert!(super::from_value(&document).is_err());
    assert_eq!(
        super::refused_pointer(&document),
        "/zero_optimization/reduce_bucket_size"
    );
    assert_eq!(
        super::refused_pointer(&json!({"train_batch_size": 0})),
        "/train_batch_size"
    );
    assert_eq!(super::refused_pointer(&json!({"train_batch_size": 8})), "");
}

#[test]
fn a_refused_config_is_blamed_at_any_depth() {
    let document = json!({
        "train_batch_size": 8,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "buffer_count": -1}}
    });
    assert!(super::from_value(&document).is_err());
    assert_eq!(
        super::refused_pointer(&document),
        "/zero_optimization/offload_optimizer/buffer_count"
    );
    let deeper = json!({"autotuning": {"model_info": {"num_layers": "many"}}});
    assert!(super::from_value(&deeper).is_err());
    assert_eq!(
        super::refused_pointer(&deeper),
        "/autotuning/model_info/num_layers"
    );
}

#[test]
fn the_sections_deepspeed_reads_key_by_key_refuse_unknown_keys_in_the_typed_parse_too() {
    for (document, key) in [
        (json!({"autotuning": {"enabld": true}}), "enabld"),
        (
            json!({"autotuning": {"model_info": {"num_layer": 2}}}),
            "num_layer",
        ),
        (
            json!({"timers": {"throughput": {"enabled": true}, "throughputs": {}}}),
            "throughputs",
        ),
        (
            json!({"checkpoint": {"writer": {"decouple": true}}}),
            "decouple",
        ),
        (
            json!({"optimizer": {"type": "AdamW", "param": {"lr": 0.1}}}),
            "param",
        ),
        (
            json!({"scheduler": {"type": "WarmupLR", "parms": {}}}),
            "parms",
        ),
        (
            json!({"expert_parallel": {"enabled": true, "autoep_sise": 2}}),
            "autoep_sise",
        ),
    ] {
        let error = super::from_value(&document).expect_err("unknown key");
        assert!(error.contains(key), "{error}");
    }
    let ep = super::from_value(&json!({"expert_parallel": {"enabled": true, "expert_w3": null}}))
        .expect("known keys");
    assert_eq!(ep.expert_parallel.expert_w3, Some(serde_json::Value::Null));
    assert_eq!(
        serde_json::to_value(ep).expect("serialises")["expert_parallel"],
        json!({"enabled": true, "expert_w3": null})
    );
}
