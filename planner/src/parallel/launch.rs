//! How to launch a job: a `ds_config.json` and the Megatron-DeepSpeed `pretrain_gpt.py` flags
//! of the same layout.
//!
//! The config carries the batch triangle, the precision, the ZeRO stage and the layout in the
//! sections dsplan reads back ([`super::deepspeed_sections`]): `tensor_parallel.autotp_size`,
//! `pipeline.stages`, `sequence_parallel_size`, and `activation_checkpointing` under full
//! recomputation. The flags are Megatron-LM's names, with Megatron-DeepSpeed's `--deepspeed
//! --zero-stage` and `--ds-sequence-parallel-size`; `dsplan estimate --megatron-args` reads
//! them back to the same job. Under Megatron-DeepSpeed the layout comes from the flags; the
//! config's layout sections are what AutoTP and the PipelineEngine read.

use serde_json::{Map, Value, json};

use super::layout::{
    DropoutUse, Job, PipelineSchedule, Recompute, RecomputeMethod, Runtime, SequenceParallel,
};
use super::shape::{LinearBias, Mlp, Norm, Positions, VocabPadding};
use crate::config::ZeroStage;
use crate::memory::{AttentionKernel, Precision};
use crate::model::Embeddings;

fn zero_stage(job: &Job) -> ZeroStage {
    match job.training.runtime {
        Runtime::DeepSpeed { zero, .. } => zero,
        Runtime::MegatronLm { optimizer } => match optimizer {
            super::layout::OptimizerSharding::Replicated => ZeroStage::Disabled,
            super::layout::OptimizerSharding::Distributed => ZeroStage::OptimizerStates,
        },
    }
}

/// The job's `ds_config.json`.
pub fn ds_config(job: &Job) -> Value {
    let mut config = Map::new();
    let layout = &job.layout;
    config.insert("train_batch_size".into(), json!(job.batch.global_batch));
    config.insert(
        "train_micro_batch_size_per_gpu".into(),
        json!(job.batch.micro_batch),
    );
    config.insert(
        "gradient_accumulation_steps".into(),
        json!(job.micro_batches()),
    );
    match job.training.precision {
        Precision::Bf16 => {
            config.insert("bf16".into(), json!({"enabled": true}));
        }
        Precision::Fp16 => {
            config.insert("fp16".into(), json!({"enabled": true}));
        }
        Precision::Fp32 => {}
    }
    config.insert(
        "zero_optimization".into(),
        json!({"stage": zero_stage(job).number()}),
    );
    if layout.tensor > 1 {
        config.insert(
            "tensor_parallel".into(),
            json!({"autotp_size": layout.tensor}),
        );
    }
    if layout.pipeline > 1 {
        config.insert("pipeline".into(), json!({"stages": layout.pipeline}));
    }
    if let SequenceParallel::Ulysses { degree } = layout.sequence {
        config.insert("sequence_parallel_size".into(), json!(degree));
    }
    if let Recompute::Full { .. } = job.training.recompute {
        config.insert("activation_checkpointing".into(), json!({}));
    }
    Value::Object(config)
}

/// The job's `pretrain_gpt.py` flags (Megatron-DeepSpeed under a DeepSpeed runtime).
pub fn megatron_flags(job: &Job) -> String {
    let shape = &job.shape;
    let layout = &job.layout;
    let mut flags = vec![
        format!("--num-layers {}", shape.layers),
        format!("--hidden-size {}", shape.hidden),
        format!("--ffn-hidden-size {}", shape.ffn_hidden),
        format!("--num-attention-heads {}", shape.heads),
    ];
    if shape.kv_channels * shape.heads != shape.hidden {
        flags.push(format!("--kv-channels {}", shape.kv_channels));
    }
    if shape.query_groups != shape.heads {
        flags.push(format!(
            "--group-query-attention --num-query-groups {}",
            shape.query_groups
        ));
    }
    if shape.mlp == Mlp::SwiGlu {
        flags.push("--swiglu".into());
    }
    if shape.norm == Norm::RmsNorm {
        flags.push("--normalization RMSNorm".into());
    }
    match shape.bias {
        LinearBias::All => {}
        LinearBias::QkvOnly => flags.push("--disable-bias-linear --add-qkv-bias".into()),
        LinearBias::None => flags.push("--disable-bias-linear".into()),
    }
    match shape.positions {
        Positions::Learned { rows } => flags.push(format!("--max-position-embeddings {rows}")),
        Positions::Rotary => flags.push("--position-embedding-type rope".into()),
    }
    if shape.embeddings == Embeddings::Untied {
        flags.push("--untie-embeddings-and-output-weights".into());
    }
    flags.push(format!("--vocab-size {}", shape.vocab));
    match shape.padding {
        VocabPadding::DivisibleBy { divisible_by: 128 } => {}
        VocabPadding::DivisibleBy { divisible_by } => {
            flags.push(format!("--make-vocab-size-divisible-by {divisible_by}"))
        }
        // A checkpoint's vocabulary (already a multiple of t): Megatron keeps it as it is.
        VocabPadding::Fixed => flags.push("--make-vocab-size-divisible-by 1".into()),
    }
    flags.push(format!("--seq-length {}", job.batch.seq_len));
    flags.push(format!("--micro-batch-size {}", job.batch.micro_batch));
    flags.push(format!("--global-batch-size {}", job.batch.global_batch));
    flags.push(format!("--tensor-model-parallel-size {}", layout.tensor));
    flags.push(format!(
        "--pipeline-model-parallel-size {}",
        layout.pipeline
    ));
    if let PipelineSchedule::Interleaved { virtual_stages } = layout.schedule {
        flags.push(format!(
            "--num-virtual-stages-per-pipeline-rank {virtual_stages}"
        ));
    }
    match layout.sequence {
        SequenceParallel::Off => {}
        SequenceParallel::Megatron => flags.push("--sequence-parallel".into()),
        SequenceParallel::Ulysses { degree } => {
            flags.push(format!("--ds-sequence-parallel-size {degree}"))
        }
    }
    match job.training.recompute {
        Recompute::None => {}
        Recompute::Selective => flags.push("--recompute-granularity selective".into()),
        Recompute::Full { method, layers } => flags.push(format!(
            "--recompute-granularity full --recompute-method {} --recompute-num-layers {layers}",
            match method {
                RecomputeMethod::Uniform => "uniform",
                RecomputeMethod::Block => "block",
            }
        )),
    }
    match job.training.precision {
        Precision::Bf16 => flags.push("--bf16".into()),
        Precision::Fp16 => flags.push("--fp16".into()),
        Precision::Fp32 => {}
    }
    if job.training.dropout.hidden == DropoutUse::Skipped {
        flags.push("--hidden-dropout 0".into());
    }
    if job.training.dropout.attention == DropoutUse::Skipped {
        flags.push("--attention-dropout 0".into());
    }
    if job.training.attention == AttentionKernel::Eager {
        flags.push("--attention-backend unfused".into());
    }
    match job.training.runtime {
        Runtime::DeepSpeed { zero, .. } => flags.push(format!(
            "--deepspeed --deepspeed_config ds_config.json --zero-stage {}",
            zero.number()
        )),
        Runtime::MegatronLm { optimizer } => {
            if optimizer == super::layout::OptimizerSharding::Distributed {
                flags.push("--use-distributed-optimizer".into());
            }
        }
    }
    flags.join(" ")
}
