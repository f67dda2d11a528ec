//! The request of the CLI's layer-limit test (`tests/bounded_work_cli.rs`): a GPT-2 config of
//! width 64, 4 heads, vocabulary 50,257 and 1,024 positions, on 8 GPUs of one node, sequences of
//! 1,024 tokens and a global batch of 64. Shared by `tests/recommend_pruning.rs` and
//! `examples/recommend_bench.rs` (each includes it with `#[path]`).

use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::{AttentionKernel, Checkpointing, Margins, Precision};
use dsplan_planner::model::ModelSpec;
use dsplan_planner::recommend::{Cluster, CostModel, Request};

/// The model's `config.json` at `layers` layers.
pub fn deep_config(layers: u64) -> String {
    format!(
        r#"{{"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
            "n_embd": 64, "n_layer": {layers}, "n_head": 4}}"#
    )
}

/// The request for `model` with `gpu_memory` bytes per GPU.
pub fn deep_request(model: ModelSpec, gpu_memory: u64) -> Request {
    Request {
        model,
        cluster: Cluster {
            hardware: Topology::new(8, 1).expect("8 GPUs on one node is a topology"),
            gpu_memory,
            cpu_memory: None,
            nvme_path: None,
        },
        seq_len: 1024,
        checkpointing: Checkpointing::None,
        attention: AttentionKernel::Eager,
        global_batch: 64,
        precision: Precision::Bf16,
        margins: Margins::default(),
        cost: CostModel::default(),
    }
}
