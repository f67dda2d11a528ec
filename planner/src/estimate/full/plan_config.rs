//! The config and workload the full estimate compiles its plan with.
//!
//! From `dsplan estimate --config` the document itself is compiled, with the values this
//! command settled written in: the micro-batch and accumulation steps ([`TrainingShape`],
//! `--micro-batch`), the precision (`--precision`), and every `"auto"` left at a key that does
//! not change memory (learning rate, betas, scheduler, clipping, ...) dropped (the keys that do
//! change memory were refused by [`super::read_config`] unless a flag filled them). A
//! [`TrainingSetup`] built in code (tests, `TrainingSetup::new`) is written out as the config
//! DeepSpeed would read the same way ([`setup_document`]).

use serde_json::{Map, Value, json};

use super::setup::{TrainingSetup, TrainingShape};
use crate::config::registry::AUTO_KEYS;
use crate::config::{OffloadDevice, ZeroStage};
use crate::memory::{Precision, states_per_param};
use crate::plan::{AllGatherIntoTensor, PlanBackend, Workload};

/// The plan's workload for `setup` and `shape`.
pub fn workload(setup: &TrainingSetup, shape: &TrainingShape) -> Workload {
    Workload {
        sequence_length: Some(shape.seq_len),
        checkpointing: shape.checkpointing,
        checkpoint_placement: shape.checkpoint_placement,
        attention: shape.attention,
        zero_init: setup.zero_init,
        all_gather_into_tensor: AllGatherIntoTensor::Available,
        backend: PlanBackend::DeepspeedGpu,
    }
}

/// `document` with the batch keys of `shape` and `setup` over `world` ranks, the setup's
/// precision, and no `"auto"` left.
pub fn plan_document(
    document: &Value,
    setup: &TrainingSetup,
    shape: &TrainingShape,
    world: u64,
) -> Value {
    let mut document = document.clone();
    for pointer in AUTO_KEYS {
        if document.pointer(pointer).and_then(Value::as_str) == Some("auto") {
            remove(&mut document, pointer);
        }
    }
    if let Some(top) = document.as_object_mut() {
        let accumulation = setup.gradient_accumulation_steps.max(1);
        top.insert(
            "train_micro_batch_size_per_gpu".into(),
            json!(shape.micro_batch),
        );
        top.insert("gradient_accumulation_steps".into(), json!(accumulation));
        top.insert(
            "train_batch_size".into(),
            json!(
                shape
                    .micro_batch
                    .saturating_mul(accumulation)
                    .saturating_mul(world)
            ),
        );
        top.remove("bfloat16");
        for (section, on) in [
            ("fp16", setup.precision == Precision::Fp16),
            ("bf16", setup.precision == Precision::Bf16),
        ] {
            let entry = top
                .entry(section)
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(object) = entry.as_object_mut() {
                object.insert("enabled".into(), json!(on));
            } else {
                *entry = json!({"enabled": on});
            }
        }
    }
    document
}

/// Removes the key at `pointer`.
fn remove(document: &mut Value, pointer: &str) {
    let Some((parent, key)) = pointer.rsplit_once('/') else {
        return;
    };
    if let Some(Value::Object(object)) = document.pointer_mut(parent) {
        object.remove(key);
    }
}

/// The config DeepSpeed would read as `setup` (batch keys and precision are written by
/// [`plan_document`]).
pub fn setup_document(setup: &TrainingSetup) -> Value {
    let zero = &setup.zero;
    let pin = |pinning: super::rows::Pinning| pinning == super::rows::Pinning::Pinned;
    let mut section = json!({
        "stage": zero.stage.number(),
        "contiguous_gradients": zero.contiguous_gradients,
        "overlap_comm": zero.overlap_comm,
        "reduce_bucket_size": zero.reduce_bucket_size,
        "allgather_bucket_size": zero.allgather_bucket_size,
        "stage3_prefetch_bucket_size": zero.prefetch_bucket_size,
        "stage3_max_live_parameters": zero.max_live_parameters,
        "stage3_param_persistence_threshold": zero.param_persistence_threshold,
        "sub_group_size": zero.sub_group_size,
    });
    if let Some(limit) = zero.model_persistence_threshold {
        section["stage3_model_persistence_threshold"] = json!(limit);
    }
    let device = |device: OffloadDevice| match device {
        OffloadDevice::None => "none",
        OffloadDevice::Cpu => "cpu",
        OffloadDevice::Nvme => "nvme",
    };
    if zero.stage != ZeroStage::Disabled && zero.offload_optimizer.device.is_offloaded() {
        let offload = &zero.offload_optimizer;
        section["offload_optimizer"] = json!({
            "device": device(offload.device),
            "pin_memory": pin(offload.pinning),
            "buffer_count": offload.buffer_count,
            "ratio": offload.ratio,
        });
        if offload.device == OffloadDevice::Nvme {
            section["offload_optimizer"]["nvme_path"] = json!("/local_nvme");
        }
    }
    if zero.stage == ZeroStage::Weights && zero.offload_param.device.is_offloaded() {
        let offload = &zero.offload_param;
        section["offload_param"] = json!({
            "device": device(offload.device),
            "pin_memory": pin(offload.pinning),
            "buffer_count": offload.buffer_count,
            "buffer_size": offload.buffer_size,
            "max_in_cpu": offload.max_in_cpu,
        });
        if offload.device == OffloadDevice::Nvme {
            section["offload_param"]["nvme_path"] = json!("/local_nvme");
        }
    }
    let mut document = json!({
        "zero_optimization": section,
        "optimizer": optimizer_section(setup),
    });
    let element = setup.precision.element_bytes();
    if setup.grad_bytes != element {
        let dtype = match (setup.grad_bytes, setup.precision) {
            (4, _) => "fp32",
            (_, Precision::Fp16) => "fp16",
            _ => "bf16",
        };
        document["data_types"] = json!({"grad_accum_dtype": dtype});
    }
    let reduced_master = setup.precision.is_mixed() && setup.master_bytes == 2;
    let reduced_states = setup.optimizer.state_bytes == 2;
    match setup.precision {
        Precision::Bf16 if reduced_master => {
            document["bf16"] = json!({
                "bf16_master_weights_and_grads": true,
                "bf16_optimizer_states": reduced_states,
            });
        }
        Precision::Fp16 if reduced_master => {
            document["fp16"] = json!({"fp16_master_weights_and_grads": true});
            if reduced_states {
                document["optimizer"]["params"]["fp32_optimizer_states"] = json!(false);
            }
        }
        _ => {}
    }
    document
}

/// An optimizer section whose state count is the setup's: its own name when the name gives
/// that count, else a known optimizer with that many states.
fn optimizer_section(setup: &TrainingSetup) -> Value {
    let optimizer = &setup.optimizer;
    let wanted = optimizer.states_per_param;
    let plain = Map::new();
    let mut with_momentum = Map::new();
    with_momentum.insert("momentum".into(), json!(0.9));
    for params in [plain, with_momentum] {
        if states_per_param(&optimizer.name, &params) == Some(wanted) {
            return json!({"type": optimizer.name, "params": params});
        }
    }
    let stand_in = match wanted {
        0 => "SGD",
        1 => "Lion",
        _ => "AdamW",
    };
    json!({"type": stand_in, "params": {}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Hardware;
    use crate::estimate::full::{Overrides, read_config};

    #[test]
    fn a_setup_reads_back_as_itself() {
        let mut setup = TrainingSetup::new(Precision::Bf16, ZeroStage::Weights);
        setup.zero.offload_optimizer.device = OffloadDevice::Nvme;
        setup.zero.offload_optimizer.ratio = 0.5;
        setup.zero.offload_param.device = OffloadDevice::Cpu;
        setup.zero.model_persistence_threshold = Some(1_000);
        setup.gradient_accumulation_steps = 4;
        let shape = TrainingShape {
            seq_len: 128,
            micro_batch: 2,
            checkpointing: crate::memory::Checkpointing::None,
            checkpoint_placement: crate::memory::CheckpointPlacement::Gpu,
            attention: crate::memory::AttentionKernel::Eager,
        };
        let document = plan_document(&setup_document(&setup), &setup, &shape, 8);
        let reading = read_config(
            &document,
            Hardware::new(8, 1).expect("valid"),
            None,
            &Overrides::default(),
        )
        .expect("reads");
        assert_eq!(reading.setup, setup);
        assert_eq!(reading.micro_batch, 2);
    }

    #[test]
    fn unresolved_keys_that_do_not_change_memory_are_dropped() {
        let setup = TrainingSetup::new(Precision::Fp16, ZeroStage::Gradients);
        let shape = TrainingShape {
            seq_len: 128,
            micro_batch: 4,
            checkpointing: crate::memory::Checkpointing::None,
            checkpoint_placement: crate::memory::CheckpointPlacement::Gpu,
            attention: crate::memory::AttentionKernel::Eager,
        };
        let document = json!({
            "train_batch_size": "auto",
            "gradient_clipping": "auto",
            "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
            "bf16": {"enabled": "auto"},
        });
        let written = plan_document(&document, &setup, &shape, 2);
        assert_eq!(written["train_batch_size"], 8);
        assert!(written.get("gradient_clipping").is_none());
        assert!(written["optimizer"]["params"].get("lr").is_none());
        assert_eq!(written["fp16"]["enabled"], true);
        assert_eq!(written["bf16"]["enabled"], false);
    }
}
