//! Model-state bytes of one GPU: parameters, gradients, fp32 master weights and Adam states,
//! with the gradient buffers and step temporaries of each runtime.
//!
//! With `P` parameters on the GPU, `D` the sharding degree (`d`, times `u` under Ulysses),
//! `e` bytes per element (2 for bf16/fp16):
//!
//! | runtime | persistent (after a step) | during backward | during the step |
//! |---|---|---|---|
//! | Megatron-LM | `e·P` params, `4·P` fp32 `main_grad` buffer, `4·P` master and `8·P` Adam (both `÷D` with `--use-distributed-optimizer`; no master in fp32) | — | — |
//! | DeepSpeed ZeRO-0, bf16 (`BF16_Optimizer`) | `2·P` params, `4·P` fp32 gradient accumulation, `12·P/D` master and Adam | `2·P` 16-bit gradients | — |
//! | DeepSpeed ZeRO-0, fp16/fp32 | `e·P` params, `12·P` (fp32: `8·P`) | `e·P` gradients | `4·P` fp32 gradients (fp16) |
//! | DeepSpeed ZeRO-1 | `e·P` params, `12·P/D` | `e·P` gradients, one reduce bucket | `4·P/D` fp32 gradient partition |
//! | DeepSpeed ZeRO-2 | `e·P` params, `12·P/D` | `e·P/D` gradient partition, two reduce buckets | `4·P/D` |
//! | DeepSpeed ZeRO-3 | `e·P/D` params, `12·P/D` | `e·P/D` gradients, gathered layers | `4·P/D` |
//!
//! Megatron-LM's grad buffer is fp32 under bf16 (`accumulate_allreduce_grads_in_fp32`, set by
//! `--bf16`) and persists between steps, which is what Megatron's CI measures after a step.

use serde::Serialize;

use super::layout::{Job, OptimizerSharding, Runtime};
use crate::config::ZeroStage;
use crate::memory::Precision;

/// Model-state bytes of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StateBytes {
    /// Parameters in the model dtype (the rank's share under ZeRO-3).
    pub parameters: u64,
    /// Gradients that persist between steps (Megatron's fp32 buffer, BF16_Optimizer's fp32
    /// accumulation).
    pub persistent_gradients: u64,
    /// fp32 master weights.
    pub master: u64,
    /// Optimizer states (Adam's two moments, fp32).
    pub optimizer: u64,
    /// Gradients alive during backward only (16-bit gradients, reduce buckets).
    pub backward_gradients: u64,
    /// Temporaries of the optimizer step (fp32 gradient partitions).
    pub step_temporaries: u64,
    /// ZeRO-3: parameters gathered around the layer being computed.
    pub gathered: u64,
}

impl StateBytes {
    /// What stays allocated after a step.
    pub fn persistent(&self) -> u64 {
        self.parameters + self.persistent_gradients + self.master + self.optimizer
    }
}

/// The model states of `params` parameters (largest weight `largest`) on one GPU of `job`.
pub fn state_bytes(job: &Job, params: u64, largest: u64) -> StateBytes {
    let e = job.training.precision.element_bytes();
    let mixed = job.training.precision != Precision::Fp32;
    let shards = job.layout.sharding_degree().max(1);
    let master_per_param = if mixed { 4 } else { 0 };
    match job.training.runtime {
        Runtime::MegatronLm { optimizer } => {
            let divisor = match optimizer {
                OptimizerSharding::Replicated => 1,
                OptimizerSharding::Distributed => shards,
            };
            StateBytes {
                parameters: e * params,
                persistent_gradients: 4 * params,
                master: master_per_param * params / divisor,
                optimizer: 8 * params / divisor,
                backward_gradients: 0,
                step_temporaries: 0,
                gathered: 0,
            }
        }
        Runtime::DeepSpeed {
            zero,
            reduce_bucket,
        } => {
            let bucket = e * reduce_bucket.min(params);
            let partition = params.div_ceil(shards);
            match zero {
                ZeroStage::Disabled if job.training.precision == Precision::Bf16 => StateBytes {
                    parameters: 2 * params,
                    persistent_gradients: 4 * params,
                    master: 4 * partition,
                    optimizer: 8 * partition,
                    backward_gradients: 2 * params,
                    step_temporaries: 0,
                    gathered: 0,
                },
                ZeroStage::Disabled => StateBytes {
                    parameters: e * params,
                    persistent_gradients: 0,
                    master: master_per_param * params,
                    optimizer: 8 * params,
                    backward_gradients: e * params,
                    step_temporaries: if mixed { 4 * params } else { 0 },
                    gathered: 0,
                },
                ZeroStage::OptimizerStates => StateBytes {
                    parameters: e * params,
                    persistent_gradients: 0,
                    master: master_per_param * partition,
                    optimizer: 8 * partition,
                    backward_gradients: e * params + bucket,
                    step_temporaries: 4 * partition,
                    gathered: 0,
                },
                ZeroStage::Gradients => StateBytes {
                    parameters: e * params,
                    persistent_gradients: 0,
                    master: master_per_param * partition,
                    optimizer: 8 * partition,
                    backward_gradients: e * partition + 2 * bucket,
                    step_temporaries: 4 * partition,
                    gathered: 0,
                },
                ZeroStage::Weights => StateBytes {
                    parameters: e * partition,
                    persistent_gradients: 0,
                    master: master_per_param * partition,
                    optimizer: 8 * partition,
                    backward_gradients: e * partition + bucket,
                    step_temporaries: 4 * partition,
                    gathered: 2 * e * largest,
                },
            }
        }
    }
}
