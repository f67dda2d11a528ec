//! Megatron-LM's theoretical memory figures (`report_theoretical_memory` in
//! `megatron/training/theoretical_memory_usage.py`, read at commit d98e8a64), computed the way
//! that file computes them, in floating point, so a user can hold dsplan against the line in
//! their log: `Theoretical memory footprints: weight and optimizer=… MB, activation=… MB,
//! total=… MB`.
//!
//! What the calculator models (dense models; dsplan refuses MoE, MLA and MTP flags):
//! - the **most loaded model shard**, which is the first pipeline stage: its share of the
//!   transformer block (`1/p` of the layers, each split `1/t` except the layer norms), plus
//!   the word embedding (split `1/t`), plus the output layer when embeddings are untied and
//!   `p = 1`;
//! - **18 bytes per parameter** (bf16 weight, fp32 gradient, fp32 master, two fp32 Adam
//!   states), or `6 + 12/d` with the distributed optimizer, whatever the precision flags;
//! - **activations of the first stage** by Korthikanti et al. (2022) Table 2:
//!   `s·b·h·(18 + 4·ffn/h)` per layer when sequence parallelism and selective recompute are
//!   both on (divided by `t` at the end), else `s·b·h·(10 + 24/t)` per layer; times all `L`
//!   layers (the first stage holds `p` micro-batches of `L/p` layers); plus the embedding's
//!   input (8 bytes per token) and dropout mask for `p` micro-batches; times
//!   `1 + (p-1)/(p·vpp)` when interleaved; times `min(1, m/p)` with fewer micro-batches than
//!   stages; plus the output layer and loss (`p = 1` only); the second formula adds 5 %.
//!
//! What it leaves out: every stage but the first (the last stage's output layer, logits and
//! loss when `p > 1`), full recompute (it counts full recompute as no recompute), attention
//! scores of non-flash attention, the FFN width and grouped-query attention in the second
//! formula, biases and learned position embeddings, the 16-bit weight-gradient and loss
//! temporaries, communication buffers, ZeRO-2/3, CUDA context and the allocator's
//! fragmentation. dsplan's `full` estimate ([`super::stages`]) covers those.

use serde::Serialize;

use super::error::ParallelError;
use super::layout::{
    Job, OptimizerSharding, PipelineSchedule, Recompute, Runtime, SequenceParallel,
};
use super::shape::{Mlp, Norm};
use crate::config::ZeroStage;
use crate::model::Embeddings;

/// Bytes in Megatron's "MB".
pub const BYTES_PER_MB: f64 = 1024.0 * 1024.0;

/// The arguments `report_theoretical_memory` reads, by Megatron's names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CalculatorInputs {
    /// `num_layers`.
    pub num_layers: u64,
    /// `hidden_size`.
    pub hidden_size: u64,
    /// `num_attention_heads`.
    pub num_attention_heads: u64,
    /// `num_query_groups` (equal to the heads without grouped-query attention).
    pub num_query_groups: u64,
    /// `kv_channels`.
    pub kv_channels: u64,
    /// `ffn_hidden_size`.
    pub ffn_hidden_size: u64,
    /// `padded_vocab_size`.
    pub padded_vocab_size: u64,
    /// `swiglu`.
    pub mlp: Mlp,
    /// `normalization`.
    pub normalization: Norm,
    /// `untie_embeddings_and_output_weights`.
    pub embeddings: Embeddings,
    /// `tensor_model_parallel_size`.
    pub tensor_model_parallel_size: u64,
    /// `pipeline_model_parallel_size`.
    pub pipeline_model_parallel_size: u64,
    /// `virtual_pipeline_model_parallel_size` (`None` without interleaving).
    pub virtual_pipeline_model_parallel_size: Option<u64>,
    /// `data_parallel_size`.
    pub data_parallel_size: u64,
    /// `use_distributed_optimizer`.
    pub optimizer: OptimizerSharding,
    /// `seq_length`.
    pub seq_length: u64,
    /// `micro_batch_size`.
    pub micro_batch_size: u64,
    /// `sequence_parallel`.
    pub sequence_parallel: bool,
    /// `recompute_granularity == 'selective'`.
    pub selective_recompute: bool,
    /// `get_num_microbatches()`.
    pub num_microbatches: u64,
}

/// Which activation formula applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ActivationFormula {
    /// Sequence parallelism with selective recompute: `compute_activation_memory`.
    WithSequenceParallel,
    /// Anything else: `compute_activation_memory_without_sp` (5 % added).
    WithoutSequenceParallel,
}

/// Megatron-LM's figures, in bytes and in its MB (2^20 bytes).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalculatorReport {
    /// The arguments used.
    pub inputs: CalculatorInputs,
    /// The formula used for activations.
    pub formula: ActivationFormula,
    /// Weights and optimizer of the most loaded shard, bytes.
    pub weight_and_optimizer_bytes: f64,
    /// Activations of the first stage, bytes.
    pub activation_bytes: f64,
    /// Weights and optimizer, MB.
    pub weight_and_optimizer_mb: f64,
    /// Activations, MB.
    pub activation_mb: f64,
    /// The sum, MB.
    pub total_mb: f64,
    /// The line Megatron-LM prints.
    pub printed: String,
}

impl CalculatorInputs {
    /// The calculator's arguments for `job`. A DeepSpeed runtime maps to the distributed
    /// optimizer from ZeRO-1 up; Ulysses sequence parallelism has no Megatron-LM equivalent.
    pub fn from_job(job: &Job) -> Result<Option<CalculatorInputs>, ParallelError> {
        let layout = &job.layout;
        let sequence_parallel = match layout.sequence {
            SequenceParallel::Off => false,
            SequenceParallel::Megatron => true,
            SequenceParallel::Ulysses { .. } => return Ok(None),
        };
        let optimizer = match job.training.runtime {
            Runtime::MegatronLm { optimizer } => optimizer,
            Runtime::DeepSpeed {
                zero: ZeroStage::Disabled,
                ..
            } => OptimizerSharding::Replicated,
            Runtime::DeepSpeed { .. } => OptimizerSharding::Distributed,
        };
        let shape = &job.shape;
        Ok(Some(CalculatorInputs {
            num_layers: shape.layers,
            hidden_size: shape.hidden,
            num_attention_heads: shape.heads,
            num_query_groups: shape.query_groups,
            kv_channels: shape.kv_channels,
            ffn_hidden_size: shape.ffn_hidden,
            padded_vocab_size: shape.padded_vocab(layout.tensor, &job.names.vocab_padding)?,
            mlp: shape.mlp,
            normalization: shape.norm,
            embeddings: shape.embeddings,
            tensor_model_parallel_size: layout.tensor,
            pipeline_model_parallel_size: layout.pipeline,
            virtual_pipeline_model_parallel_size: match layout.schedule {
                PipelineSchedule::OneForwardOneBackward => None,
                PipelineSchedule::Interleaved { virtual_stages } => Some(virtual_stages),
            },
            data_parallel_size: layout.data,
            optimizer,
            seq_length: job.batch.seq_len,
            micro_batch_size: job.batch.micro_batch,
            sequence_parallel,
            selective_recompute: job.training.recompute == Recompute::Selective,
            num_microbatches: job.micro_batches(),
        }))
    }
}

fn f(value: u64) -> f64 {
    value as f64
}

/// `compute_weight_and_optimizer_memory` for a dense model.
pub fn weight_and_optimizer_bytes(args: &CalculatorInputs) -> f64 {
    let h = f(args.hidden_size);
    let query_projection_to_hidden_size_ratio = f(args.kv_channels * args.num_attention_heads) / h;
    let gated_linear_multiplier = match args.mlp {
        Mlp::SwiGlu => 1.5,
        Mlp::Gelu => 1.0,
    };
    let norm_size = f(args.normalization.params_per_channel());
    let self_attn_term = 2.0
        * h
        * h
        * ((1.0 + f(args.num_query_groups) / f(args.num_attention_heads))
            * query_projection_to_hidden_size_ratio);
    let embedding_size = h * f(args.padded_vocab_size);
    let final_layernorm = norm_size * h;
    let attention_params = self_attn_term;
    let dense_mlp_params = 2.0 * h * f(args.ffn_hidden_size) * gated_linear_multiplier;
    let layernorm_params = 2.0 * h * norm_size;
    let layers = f(args.num_layers);
    let p = f(args.pipeline_model_parallel_size);
    let t = f(args.tensor_model_parallel_size);
    let tp_sharded_params_in_transformer_block = (attention_params + dense_mlp_params) * layers;
    let replicated_params_in_transformer_block = layernorm_params * layers + final_layernorm;
    let mut tp_sharded_params_on_most_loaded_shard =
        (tp_sharded_params_in_transformer_block / p + embedding_size) / t;
    let replicated_params_on_most_loaded_shard = replicated_params_in_transformer_block / p;
    if args.embeddings == Embeddings::Untied && args.pipeline_model_parallel_size == 1 {
        tp_sharded_params_on_most_loaded_shard += embedding_size / t;
    }
    let bytes_per_parameter = match args.optimizer {
        OptimizerSharding::Replicated => 18.0,
        OptimizerSharding::Distributed => 6.0 + 12.0 / f(args.data_parallel_size),
    };
    (tp_sharded_params_on_most_loaded_shard + replicated_params_on_most_loaded_shard)
        * bytes_per_parameter
}

/// The embedding, interleaving and micro-batch terms both activation formulas share.
fn pipeline_terms(args: &CalculatorInputs, mut activation: f64) -> f64 {
    let s = f(args.seq_length);
    let b = f(args.micro_batch_size);
    let h = f(args.hidden_size);
    let p = f(args.pipeline_model_parallel_size);
    activation += 8.0 * s * b * p;
    activation += s * b * h * p;
    match args.virtual_pipeline_model_parallel_size {
        Some(vpp) => {
            let interleaved_schedule_memory_penalty = 1.0 + (p - 1.0) / (p * f(vpp));
            activation *= interleaved_schedule_memory_penalty;
        }
        None if args.pipeline_model_parallel_size > 1 => {
            activation *= (f(args.num_microbatches) / p).min(1.0);
        }
        None => {}
    }
    activation
}

/// `compute_activation_memory` (sequence parallelism with selective recompute).
pub fn activation_bytes_with_sp(args: &CalculatorInputs) -> f64 {
    let s = f(args.seq_length);
    let b = f(args.micro_batch_size);
    let h = f(args.hidden_size);
    let mut activation = (s * b * h) * (18.0 + 4.0 * (f(args.ffn_hidden_size) / h));
    activation *= f(args.num_layers);
    activation = pipeline_terms(args, activation);
    if args.pipeline_model_parallel_size == 1 {
        activation += s * b * h * 4.0 * (1.0 + f(args.padded_vocab_size) / h);
    }
    activation / f(args.tensor_model_parallel_size)
}

/// `compute_activation_memory_without_sp`.
pub fn activation_bytes_without_sp(args: &CalculatorInputs) -> f64 {
    let s = f(args.seq_length);
    let b = f(args.micro_batch_size);
    let h = f(args.hidden_size);
    let t = f(args.tensor_model_parallel_size);
    let per_layer_memory = s * b * h * (10.0 + 24.0 / t);
    let mut total = per_layer_memory * f(args.num_layers);
    total = pipeline_terms(args, total);
    if args.pipeline_model_parallel_size == 1 {
        let logits_size = s * b * f(args.padded_vocab_size) / t;
        let final_ln_output = s * b * h;
        total += (logits_size + final_ln_output) * 2.0;
    }
    total * 1.05
}

/// `report_theoretical_memory`.
pub fn report(args: &CalculatorInputs) -> CalculatorReport {
    let weight = weight_and_optimizer_bytes(args);
    let (formula, activation) = if args.sequence_parallel && args.selective_recompute {
        (
            ActivationFormula::WithSequenceParallel,
            activation_bytes_with_sp(args),
        )
    } else {
        (
            ActivationFormula::WithoutSequenceParallel,
            activation_bytes_without_sp(args),
        )
    };
    let weight_mb = weight / BYTES_PER_MB;
    let activation_mb = activation / BYTES_PER_MB;
    let total_mb = weight_mb + activation_mb;
    CalculatorReport {
        inputs: *args,
        formula,
        weight_and_optimizer_bytes: weight,
        activation_bytes: activation,
        weight_and_optimizer_mb: weight_mb,
        activation_mb,
        total_mb,
        printed: format!(
            "Theoretical memory footprints: weight and optimizer={weight_mb:.2} MB, activation={activation_mb:.2} MB, total={total_mb:.2} MB"
        ),
    }
}
