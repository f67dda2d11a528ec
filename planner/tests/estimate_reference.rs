//! Every row DeepSpeed 0.19.8 produced for `estimate_zero2/zero3_model_states_mem_needs`
//! (`../shared/reference/estimate.json`), and every printed `_all_cold` table, reproduced
//! exactly. Skips (passes) when `../shared` is absent.
//!
//! The printed texts were captured on Python 3.11, where DeepSpeed spells the offload device
//! `OffloadDeviceEnum.cpu`; they are compared byte for byte with [`EnumSpelling::Qualified`],
//! and again after replacing that spelling with `cpu ` (DeepSpeed's documented, Python <= 3.10
//! form) against [`EnumSpelling::Padded`], the form dsplan prints.

use dsplan_planner::estimate::{
    BufferFactor, EnumSpelling, OffloadDevice, Topology, Zero3Options, ZeroInit,
    estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs,
    zero2_all_cold_text, zero3_all_cold_text,
};
use serde_json::Value;
use std::path::PathBuf;

fn reference() -> Option<Value> {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/estimate.json"
    ));
    if !path.exists() {
        eprintln!("skipping: ../shared not found ({})", path.display());
        return None;
    }
    let text = std::fs::read_to_string(&path).expect("estimate.json is readable");
    Some(serde_json::from_str(&text).expect("estimate.json is JSON"))
}

fn uint(row: &Value, key: &str) -> u64 {
    row[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is an unsigned integer in {row}"))
}

fn flag(row: &Value, key: &str) -> bool {
    row[key]
        .as_bool()
        .unwrap_or_else(|| panic!("`{key}` is a boolean in {row}"))
}

fn device(offloaded: bool) -> OffloadDevice {
    if offloaded {
        OffloadDevice::Cpu
    } else {
        OffloadDevice::None
    }
}

fn hardware(row: &Value) -> Topology {
    Topology::new(uint(row, "num_gpus_per_node"), uint(row, "num_nodes")).expect("valid hardware")
}

fn factor(row: &Value) -> BufferFactor {
    let value = row["additional_buffer_factor"]
        .as_f64()
        .expect("factor is a number");
    BufferFactor::new(value).expect("valid factor")
}

fn rows<'a>(doc: &'a Value, key: &str) -> &'a Vec<Value> {
    doc[key]
        .as_array()
        .unwrap_or_else(|| panic!("`{key}` is an array"))
}

#[test]
fn every_zero2_row_matches() {
    let Some(doc) = reference() else { return };
    let rows = rows(&doc, "zero2");
    assert_eq!(rows.len(), 456);
    let mut mismatches = Vec::new();
    for row in rows {
        let needs = estimate_zero2_model_states_mem_needs(
            uint(row, "total_params"),
            hardware(row),
            device(flag(row, "cpu_offload")),
            factor(row),
        )
        .expect("fits in u64");
        let expected = (uint(row, "cpu_mem_bytes"), uint(row, "gpu_mem_bytes"));
        if (needs.cpu_bytes, needs.gpu_bytes) != expected {
            mismatches.push(format!(
                "{row}: got ({}, {})",
                needs.cpu_bytes, needs.gpu_bytes
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} ZeRO-2 rows differ:\n{}",
        mismatches.len(),
        rows.len(),
        mismatches.join("\n")
    );
}

#[test]
fn every_zero3_row_matches() {
    let Some(doc) = reference() else { return };
    let rows = rows(&doc, "zero3");
    assert_eq!(rows.len(), 1824);
    let mut mismatches = Vec::new();
    for row in rows {
        let options = Zero3Options {
            offload_optimizer: device(flag(row, "cpu_offload")),
            offload_param: device(flag(row, "cpu_offload_params")),
            zero_init: if flag(row, "zero_init") {
                ZeroInit::Enabled
            } else {
                ZeroInit::Disabled
            },
        };
        let needs = estimate_zero3_model_states_mem_needs(
            uint(row, "total_params"),
            uint(row, "largest_layer_params"),
            hardware(row),
            options,
            factor(row),
        )
        .expect("fits in u64");
        let expected = (
            uint(row, "cpu_mem_bytes"),
            uint(row, "gpu_mem_bytes"),
            uint(row, "largest_layer_memory_bytes"),
        );
        let got = (
            needs.cpu_bytes,
            needs.gpu_bytes,
            needs.largest_layer_memory_bytes,
        );
        if got != expected {
            mismatches.push(format!("{row}: got {got:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} ZeRO-3 rows differ:\n{}",
        mismatches.len(),
        rows.len(),
        mismatches.join("\n")
    );
}

#[test]
fn every_printed_table_matches() {
    let Some(doc) = reference() else { return };
    let printed = rows(&doc, "printed");
    assert_eq!(printed.len(), 12);
    for case in printed {
        let args = &case["args"];
        let function = case["function"].as_str().expect("function name");
        let expected = case["text"].as_str().expect("printed text");
        let render = |spelling| {
            let hardware = hardware(args);
            let factor = factor(args);
            let total = uint(args, "total_params");
            match function {
                "estimate_zero2_model_states_mem_needs_all_cold" => {
                    zero2_all_cold_text(total, hardware, factor, spelling)
                }
                "estimate_zero3_model_states_mem_needs_all_cold" => zero3_all_cold_text(
                    total,
                    uint(args, "largest_layer_params"),
                    hardware,
                    factor,
                    spelling,
                ),
                other => panic!("unexpected function {other}"),
            }
            .expect("fits in u64")
        };
        // Byte for byte with DeepSpeed's Python 3.11 output.
        assert_eq!(
            render(EnumSpelling::Qualified),
            expected,
            "{function} {args}"
        );
        // The documented spelling, which dsplan prints: only the enum rendering differs.
        let documented = expected.replace("OffloadDeviceEnum.cpu", "cpu ");
        assert_ne!(
            documented, expected,
            "the reference text spells the enum the Python 3.11 way"
        );
        assert_eq!(
            render(EnumSpelling::Padded),
            documented,
            "{function} {args}"
        );
    }
}

/// The reference GPT-2 fixture (a real `save_pretrained` output of transformers 5.23) counted
/// from its safetensors header, from its config.json and as the `tiny-gpt2` preset.
#[test]
fn gpt2_fixture_counts_agree_across_sources() {
    use dsplan_planner::model::{LmHead, ModelSource, load};
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/gpt2/forward_backward"
    ));
    if !dir.exists() {
        eprintln!("skipping: ../shared not found ({})", dir.display());
        return;
    }
    let checkpoint =
        load(dir.to_str().expect("utf-8 path"), LmHead::Include).expect("readable fixture");
    assert!(
        matches!(&checkpoint.source, ModelSource::Safetensors { files, .. } if files.len() == 1)
    );
    assert_eq!(checkpoint.total_params, 120_576);
    assert!(
        checkpoint.notes.is_empty(),
        "config.json agrees with the header: {:?}",
        checkpoint.notes
    );
    let config = load(
        dir.join("config.json").to_str().expect("utf-8 path"),
        LmHead::Include,
    )
    .expect("config");
    let preset = load("tiny-gpt2", LmHead::Include).expect("preset");
    for other in [&config, &preset] {
        assert_eq!(other.total_params, checkpoint.total_params);
        assert_eq!(other.largest_layer, checkpoint.largest_layer);
    }
    // With width 64 and a 4x MLP, `c_fc` (64 x 256 + 256) outweighs the 256 x 64 embedding.
    assert_eq!(checkpoint.largest_layer.params, 16_640);
}

/// The ZeRO-3 table DeepSpeed's `memory.rst` prints for `AutoModel.from_pretrained("t5-3b")`
/// on one node of 8 GPUs (`_all_live`), from the `t5-3b` preset. Needs no `../shared`.
#[test]
fn t5_3b_preset_reproduces_deepspeeds_documented_live_table() {
    use dsplan_planner::model::{LmHead, load};
    let spec = load("t5-3b", LmHead::Exclude).expect("preset");
    let hardware = Topology::new(8, 1).expect("valid");
    let text = zero3_all_cold_text(
        spec.total_params,
        spec.largest_layer.params,
        hardware,
        BufferFactor::default(),
        EnumSpelling::Padded,
    )
    .expect("fits");
    let documented = "\
Estimated memory needed for params, optim states and gradients for a:
HW: Setup with 1 node, 8 GPUs per node.
SW: Model with 2851M total params, 32M largest layer params.
  per CPU  |  per GPU |   Options
   71.71GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1
  127.48GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0
   63.74GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=1
  127.48GB |   0.79GB | offload_param=none, offload_optimizer=cpu , zero_init=0
    1.47GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=1
  127.48GB |   6.10GB | offload_param=none, offload_optimizer=none, zero_init=0
";
    assert_eq!(text, documented);
    // The documented ZeRO-2 table predates PR #5099 (no-offload GPU was 4P + 16P/N then);
    // its offload row is unchanged: 127.48GB | 5.31GB.
    let zero2 = zero2_all_cold_text(
        spec.total_params,
        hardware,
        BufferFactor::default(),
        EnumSpelling::Padded,
    )
    .expect("fits");
    assert!(
        zero2.contains("  127.48GB |   5.31GB | offload_optimizer=cpu \n"),
        "{zero2}"
    );
}
