//! The planner's GPT-2 layout lists exactly the executor's parameter buffer: the same tensors,
//! in the same order, with the same shapes and offsets (stage 0 and 1 share the executor's
//! `model.parameters()` order; stage 1 only pads the end), so the executor can run the plan.
//! The same for the Llama family (GQA, Qwen2's q/k/v biases, o_proj bias, tied and untied
//! embeddings): the planner's graph of the architecture the executor reports.

use dsplan_executor::model::llama::{AttentionBias, LlamaConfig, LlamaFamily};
use dsplan_executor::model::rope::{Rope, RopeScaling};
use dsplan_executor::model::{Gpt2Config, ModelConfig, ParamLayout, ParamTable};
use dsplan_planner::config;
use dsplan_planner::model::{Architecture, Embeddings, Family};
use dsplan_planner::plan::{self, Cluster, ModelGraph, Workload};
use serde_json::json;

fn architecture(config: &Gpt2Config) -> Architecture {
    let as_u64 = |n: usize| u64::try_from(n).expect("fits");
    Architecture {
        family: Family::Gpt2,
        layers: as_u64(config.n_layer),
        hidden: as_u64(config.n_embd),
        heads: as_u64(config.n_head),
        kv_heads: as_u64(config.n_head),
        head_dim: as_u64(config.head_dim()),
        intermediate: 4 * as_u64(config.n_embd),
        vocab: as_u64(config.vocab_size),
        positions: Some(as_u64(config.n_positions)),
        embeddings: Embeddings::Tied,
    }
}

fn check(config: &Gpt2Config, stage: u64, world: u64) {
    let executor = ParamLayout::new(config);
    let graph = ModelGraph::from_architecture("gpt2", &architecture(config)).expect("graph");
    compare(&executor, &graph, stage, world);
}

fn compare(executor: &dyn ParamTable, graph: &ModelGraph, stage: u64, world: u64) {
    let ds = config::from_value(&json!({
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW"},
        "zero_optimization": {"stage": stage}
    }))
    .expect("config");
    let cluster = Cluster::new(world, 8).expect("cluster");
    let plan = plan::compile(&ds, graph, &cluster, &Workload::default()).expect("plan");
    let ours = &plan.layout.entries;
    let theirs = executor.tensors().entries();
    assert_eq!(ours.len(), theirs.len(), "tensor count");
    for (planned, executed) in ours.iter().zip(theirs) {
        assert_eq!(planned.name, executed.name);
        let shape: Vec<usize> = planned
            .shape
            .iter()
            .map(|&d| usize::try_from(d).expect("fits"))
            .collect();
        assert_eq!(shape, executed.shape, "{}", planned.name);
        assert_eq!(
            usize::try_from(planned.offset).expect("fits"),
            executed.span.offset,
            "{}",
            planned.name
        );
    }
    assert_eq!(
        usize::try_from(plan.layout.numel).expect("fits"),
        executor.param_count()
    );
    if stage > 0 {
        assert_eq!(plan.layout.padded_numel % (2 * world), 0, "padded to 2·N");
    }
}

#[test]
fn gpt2_124m_layout_matches_the_executor() {
    for (stage, world) in [(0, 1), (1, 8), (2, 3)] {
        check(&Gpt2Config::gpt2(), stage, world);
    }
}

#[test]
fn fixture_sized_gpt2_layout_matches_the_executor() {
    let tiny = Gpt2Config {
        vocab_size: 256,
        n_positions: 64,
        n_embd: 64,
        n_layer: 2,
        n_head: 4,
        layer_norm_epsilon: 1e-5,
    };
    check(&tiny, 1, 2);
}

fn llama(family: LlamaFamily, bias: AttentionBias, embeddings: Embeddings) -> ModelConfig {
    ModelConfig::Llama(LlamaConfig {
        family,
        vocab_size: 256,
        max_position_embeddings: 128,
        hidden_size: 64,
        num_hidden_layers: 3,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 16,
        intermediate_size: 176,
        rms_norm_eps: 1e-5,
        rope: Rope {
            theta: 10_000.0,
            scaling: RopeScaling::Default,
        },
        attention_bias: bias,
        embeddings,
        sliding_window: None,
    })
}

#[test]
fn llama_family_layouts_match_the_executor() {
    for model in [
        llama(
            LlamaFamily::Llama,
            AttentionBias::Absent,
            Embeddings::Untied,
        ),
        llama(LlamaFamily::Llama, AttentionBias::QkvO, Embeddings::Tied),
        llama(LlamaFamily::Qwen2, AttentionBias::Qkv, Embeddings::Tied),
        llama(
            LlamaFamily::Mistral,
            AttentionBias::Absent,
            Embeddings::Untied,
        ),
    ] {
        let graph = ModelGraph::from_architecture(model.family_name(), &model.architecture())
            .expect("graph");
        for (stage, world) in [(0, 1), (1, 8), (2, 3)] {
            compare(&model.layout(), &graph, stage, world);
        }
    }
}
