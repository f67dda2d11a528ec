//! The whole validator on arbitrary input: it never panics, every diagnostic it returns is
//! located, and huge inputs finish in bounded time.

use std::time::{Duration, Instant};

use dsplan_planner::validate::{ValidateOptions, validate_source};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Keys that matter to the rules, mixed with noise, so random documents reach deep code paths.
const KEYS: &[&str] = &[
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "stage",
    "offload_param",
    "offload_optimizer",
    "device",
    "nvme_path",
    "fp16",
    "bf16",
    "bfloat16",
    "enabled",
    "optimizer",
    "scheduler",
    "type",
    "params",
    "lr",
    "betas",
    "stage3_max_live_parameters",
    "cpu_offload",
    "reduce_bucket_size",
    "auto",
    "x",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e20f64..1e20).prop_map(|f| json!(f)),
        prop::sample::select(vec!["auto", "cpu", "nvme", "Adam", "WarmupLR", "2", ""])
            .prop_map(|s| json!(s)),
    ]
}

fn document() -> impl Strategy<Value = Value> {
    let value = leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|members| {
                Value::Object(
                    members
                        .into_iter()
                        .map(|(k, v)| (k.to_string(), v))
                        .collect::<Map<_, _>>(),
                )
            }),
        ]
    });
    prop::collection::vec((prop::sample::select(KEYS), value), 0..8).prop_map(|members| {
        Value::Object(
            members
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_documents_never_panic_and_are_located(doc in document(), world in prop::option::of(1u64..64)) {
        let text = serde_json::to_string_pretty(&doc).expect("serialisable");
        let (_, found) = validate_source("random.json", text.as_bytes(), ValidateOptions { world_size: world })
            .expect("a JSON object always parses");
        for diagnostic in &found {
            prop_assert!(diagnostic.line.is_some() && diagnostic.column.is_some(), "{diagnostic:?}");
        }
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = validate_source("bytes.json", &bytes, ValidateOptions::default());
    }
}

#[test]
fn five_megabytes_finish_in_bounded_time() {
    let deep = format!("{{\"a\":{}", "[".repeat(5 << 20));
    let wide: String = {
        let members: Vec<String> = (0..200_000).map(|i| format!("\"key_{i}\": {i}")).collect();
        format!("{{{}}}", members.join(","))
    };
    for (name, text) in [("deep", deep), ("wide", wide)] {
        let start = Instant::now();
        let outcome = validate_source(name, text.as_bytes(), ValidateOptions::default());
        let elapsed = start.elapsed();
        eprintln!("{name}: {} bytes in {elapsed:?}", text.len());
        match outcome {
            Ok((_, found)) => assert!(!found.is_empty()),
            Err(fatal) => assert_eq!(fatal.len(), 1),
        }
        assert!(elapsed < Duration::from_secs(60), "{name} took {elapsed:?}");
    }
}
