//! The combinations Megatron-LM and DeepSpeed refuse at start-up, refused here first, each
//! naming the flag to change.
//!
//! | rule | refused by |
//! |---|---|
//! | GPUs a multiple of `t × p × u` | Megatron `arguments.py` ("world size is not divisible by total_model_size") |
//! | heads, query groups, FFN width split over `t` | `TransformerConfig`, `ColumnParallelLinear`'s `divide` |
//! | layers split over `p` (and `p × vpp`) | `arguments.py` |
//! | interleaving needs `p > 1` and whole groups of `p` micro-batches | `arguments.py`, `schedules.py` |
//! | sequence parallelism needs `t > 1` | Megatron disables it with a warning; dsplan refuses (no silent change) |
//! | Ulysses splits heads and sequence; not with Megatron's SP; not in Megatron-LM | Megatron-DeepSpeed's `--ds-sequence-parallel-size` |
//! | global batch a multiple of `micro × d` | `num_microbatches_calculator.py` |
//! | ZeRO-2/3 with `p > 1`; ZeRO-3 with AutoTP | DeepSpeed's PipelineEngine; AutoTP training |
//! | a vocabulary that cannot be padded or split | `vocab_utils.py`; a checkpoint's fixed embedding |

use super::error::{FlagNames, ParallelError, ParallelErrors};
use super::layout::{
    Job, Layout, PipelineSchedule, Recompute, RecomputeMethod, Runtime, SequenceParallel,
};
use crate::config::ZeroStage;

/// The data-parallel degree of `world` GPUs split `t × p × u` ways, or why it does not divide.
pub fn data_degree(
    world: u64,
    tensor: u64,
    pipeline: u64,
    ulysses: u64,
    names: &FlagNames,
) -> Result<u64, ParallelError> {
    let model = tensor.saturating_mul(pipeline).saturating_mul(ulysses);
    if world == 0 {
        return Err(ParallelError::new(
            &names.world,
            "no GPUs",
            "give at least one GPU",
        ));
    }
    if model == 0 || !world.is_multiple_of(model) {
        let parts = if ulysses > 1 {
            format!("t × p × sp = {tensor} × {pipeline} × {ulysses} = {model}")
        } else {
            format!("t × p = {tensor} × {pipeline} = {model}")
        };
        return Err(ParallelError::new(
            &names.world,
            format!(
                "{world} GPUs cannot be split into data-parallel replicas of {parts} GPUs (the world size must be t × p × d)"
            ),
            format!(
                "use a multiple of {model} GPUs, or change {} / {}",
                names.tensor, names.pipeline
            ),
        ));
    }
    Ok(world / model)
}

/// Every refusal of `job` at once.
pub fn check(job: &Job) -> Result<(), ParallelErrors> {
    let mut found = Vec::new();
    let names = &job.names;
    let shape = &job.shape;
    let Layout {
        tensor: t,
        pipeline: p,
        schedule,
        sequence,
        data: d,
    } = job.layout;
    let mut refuse = |flag: &str, message: String, help: String| {
        found.push(ParallelError::new(flag, message, help));
    };
    if t == 0 || p == 0 || d == 0 {
        refuse(
            &names.tensor,
            "parallel degrees must be at least 1".into(),
            "give positive degrees".into(),
        );
        return Err(ParallelErrors(found));
    }
    if !shape.heads.is_multiple_of(t) {
        refuse(
            &names.tensor,
            format!(
                "{} attention heads do not split over {t} tensor-parallel ranks",
                shape.heads
            ),
            format!("use a tensor-parallel degree that divides {}", shape.heads),
        );
    }
    let groups = shape.query_groups;
    if !groups.is_multiple_of(t) && !t.is_multiple_of(groups) {
        refuse(
            &names.tensor,
            format!(
                "{groups} query groups (key/value heads) must be a multiple or a divisor of the tensor-parallel degree {t}"
            ),
            "use a tensor-parallel degree that divides the query groups or is a multiple of them"
                .into(),
        );
    }
    if !shape.ffn_hidden.is_multiple_of(t) {
        refuse(
            &names.tensor,
            format!(
                "the MLP width {} does not split over {t} tensor-parallel ranks",
                shape.ffn_hidden
            ),
            format!(
                "use a tensor-parallel degree that divides {}",
                shape.ffn_hidden
            ),
        );
    }
    if let Err(error) = shape.padded_vocab(t, &names.vocab_padding) {
        found.push(error);
    }
    if !shape.layers.is_multiple_of(p) {
        found.push(ParallelError::new(
            &names.pipeline,
            format!(
                "{} layers do not split over {p} pipeline stages",
                shape.layers
            ),
            format!("use a pipeline degree that divides {}", shape.layers),
        ));
    }
    let micro_batches = job.batch.micro_batches(d);
    if let PipelineSchedule::Interleaved { virtual_stages } = schedule {
        if p < 2 {
            found.push(ParallelError::new(
                &names.virtual_stages,
                "the interleaved schedule needs a pipeline of at least 2 stages",
                format!("drop {} or raise {}", names.virtual_stages, names.pipeline),
            ));
        } else if shape.layers.is_multiple_of(p)
            && !(shape.layers / p).is_multiple_of(virtual_stages)
        {
            found.push(ParallelError::new(
                &names.virtual_stages,
                format!(
                    "{} layers per pipeline stage do not split into {virtual_stages} virtual stages",
                    shape.layers / p
                ),
                "choose a number of layers per virtual stage that divides the layers per stage",
            ));
        }
        if p >= 2 && (micro_batches < p || !micro_batches.is_multiple_of(p)) {
            found.push(ParallelError::new(
                &names.global_batch,
                format!(
                    "the interleaved schedule runs micro-batches in groups of the pipeline size {p}; {micro_batches} micro-batches per step do not make whole groups"
                ),
                format!(
                    "use a global batch of a multiple of micro-batch × d × p = {}",
                    job.batch.micro_batch * d * p
                ),
            ));
        }
    }
    match sequence {
        SequenceParallel::Off => {}
        SequenceParallel::Megatron => {
            if t < 2 {
                found.push(ParallelError::new(
                    &names.sequence,
                    "Megatron's sequence parallelism splits the sequence over the tensor-parallel ranks, and there is only one (Megatron-LM would turn it off with a warning)",
                    format!("drop {} or raise {} above 1", names.sequence, names.tensor),
                ));
            } else if !job.batch.seq_len.is_multiple_of(t) {
                found.push(ParallelError::new(
                    &names.sequence,
                    format!(
                        "the sequence of {} tokens does not split over {t} ranks",
                        job.batch.seq_len
                    ),
                    "use a sequence length that is a multiple of the tensor-parallel degree",
                ));
            }
        }
        SequenceParallel::Ulysses { degree } => {
            if let Runtime::MegatronLm { .. } = job.training.runtime {
                found.push(ParallelError::new(
                    &names.sequence,
                    "DeepSpeed-Ulysses sequence parallelism is not part of Megatron-LM (its context parallelism is not modelled)",
                    "use Megatron-DeepSpeed (--zero-stage) or a ds_config with sequence_parallel_size",
                ));
            }
            if degree == 0 || !(shape.heads / t).is_multiple_of(degree) {
                found.push(ParallelError::new(
                    &names.sequence,
                    format!(
                        "Ulysses exchanges attention heads over {degree} ranks; {} heads per tensor-parallel rank do not split that way",
                        shape.heads / t
                    ),
                    "use a sequence-parallel degree that divides the heads per tensor-parallel rank",
                ));
            } else if !job.batch.seq_len.is_multiple_of(degree) {
                found.push(ParallelError::new(
                    &names.sequence,
                    format!(
                        "the sequence of {} tokens does not split over {degree} ranks",
                        job.batch.seq_len
                    ),
                    "use a sequence length that is a multiple of the sequence-parallel degree",
                ));
            }
        }
    }
    let per_step = job.batch.micro_batch.saturating_mul(d);
    if job.batch.micro_batch == 0 || job.batch.global_batch == 0 {
        found.push(ParallelError::new(
            &names.micro_batch,
            "batch sizes must be at least 1",
            "give positive batch sizes",
        ));
    } else if !job.batch.global_batch.is_multiple_of(per_step) {
        found.push(ParallelError::new(
            &names.global_batch,
            format!(
                "a global batch of {} is not a multiple of micro-batch × d = {} × {d} = {per_step}",
                job.batch.global_batch, job.batch.micro_batch
            ),
            format!("use a multiple of {per_step}"),
        ));
    }
    if let Runtime::DeepSpeed { zero, .. } = job.training.runtime {
        if p > 1 && zero >= ZeroStage::Gradients {
            found.push(ParallelError::new(
                &names.sharding,
                format!("ZeRO stage {} is incompatible with pipeline parallelism (DeepSpeed's PipelineEngine asserts)", zero.number()),
                format!("use ZeRO stage 0 or 1 with {} above 1", names.pipeline),
            ));
        }
        if t > 1 && zero == ZeroStage::Weights {
            found.push(ParallelError::new(
                &names.sharding,
                "ZeRO stage 3 is not supported with tensor parallelism (AutoTP trains with ZeRO 0-2)",
                format!("use ZeRO stage 0-2 with {} above 1", names.tensor),
            ));
        }
    }
    if let Recompute::Full { method, layers } = job.training.recompute {
        let per_chunk = shape.layers / p / schedule.chunks().max(1);
        if layers == 0 {
            found.push(ParallelError::new(
                &names.recompute,
                "full recomputation of 0 layers",
                "give --recompute-num-layers of at least 1",
            ));
        } else if method == RecomputeMethod::Block && layers > per_chunk && per_chunk > 0 {
            found.push(ParallelError::new(
                &names.recompute,
                format!(
                    "block recomputation of {layers} layers, but each model chunk holds {per_chunk}"
                ),
                format!("use --recompute-num-layers of at most {per_chunk}"),
            ));
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(ParallelErrors(found))
    }
}
