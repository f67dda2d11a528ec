//! The workload the full estimate compiles its plan with, and the config of a
//! [`TrainingSetup`] built in code.
//!
//! `dsplan estimate --config` compiles the resolved config itself
//! ([`super::config_reading`]). A setup built in code (`recommend`'s candidates' costs, tests,
//! `TrainingSetup::new`) is written out as the config DeepSpeed would read the same way
//! ([`setup_document`]), batch keys and precision included.

use serde_json::{Map, Value, json};

use super::setup::{TrainingSetup, TrainingShape};
use crate::config::{DsConfig, OffloadDevice, ZeroStage};
use crate::memory::{Precision, states_per_param};
use crate::plan::{PlanBackend, Workload};

/// The plan's workload for `setup` and `shape` on DeepSpeed's GPUs, running `config`.
pub fn workload(config: &DsConfig, setup: &TrainingSetup, shape: &TrainingShape) -> Workload {
    Workload {
        sequence_length: Some(shape.seq_len),
        checkpointing: shape.checkpointing,
        checkpoint_placement: shape.checkpoint_placement,
        attention: shape.attention,
        zero_init: setup.zero_init,
        ..Workload::for_backend(PlanBackend::DeepspeedGpu, config)
    }
}

/// The config DeepSpeed would read as `setup`, with the batch keys of `shape` over `world`
/// ranks.
pub fn setup_document(setup: &TrainingSetup, shape: &TrainingShape, world: u64) -> Value {
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
    let accumulation = setup.gradient_accumulation_steps.max(1);
    let mut document = json!({
        "train_micro_batch_size_per_gpu": shape.micro_batch,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": shape
            .micro_batch
            .saturating_mul(accumulation)
            .saturating_mul(world),
        "fp16": {"enabled": setup.precision == Precision::Fp16},
        "bf16": {"enabled": setup.precision == Precision::Bf16},
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
            document["bf16"]["bf16_master_weights_and_grads"] = json!(true);
            document["bf16"]["bf16_optimizer_states"] = json!(reduced_states);
        }
        Precision::Fp16 if reduced_master => {
            document["fp16"]["fp16_master_weights_and_grads"] = json!(true);
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
    use crate::estimate::Topology;
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
        let reading = read_config(
            &setup_document(&setup, &shape, 8),
            Topology::new(8, 1).expect("valid"),
            None,
            &Overrides::default(),
        )
        .expect("reads");
        assert_eq!(reading.setup, setup);
        assert_eq!(reading.micro_batch, 2);
    }
}
