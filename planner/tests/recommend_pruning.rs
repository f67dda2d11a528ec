//! `recommend` skips the full estimate of micro-batches whose activations alone overflow the
//! GPU; the full estimate of every candidate stays the truth. On a grid of small models,
//! clusters, sequence lengths and batches the pruned walk returns exactly the answer (the
//! chosen config, its estimate, every candidate's outcome, or the error) of the walk that
//! estimates every candidate, and it does so with fewer full estimates (counted by
//! [`recommend_counted`]), so a pruner that stops pruning fails here too.

use std::path::Path;

use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::{AttentionKernel, Checkpointing, Margins, Precision};
use dsplan_planner::model::{LmHead, ModelSpec, load};
#[path = "support/deep_request.rs"]
mod deep;
use deep::{deep_config, deep_request as shared_request};

use dsplan_planner::recommend::{
    Cluster, CostModel, Planning, RecommendError, RecommendStats, Request, recommend_counted,
    recommend_with,
};

const MIB: u64 = 1 << 20;

fn model(dir: &Path, name: &str, config: &str) -> ModelSpec {
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, config).expect("written");
    load::from_config_file(&path, LmHead::Include).expect("a valid model config")
}

fn models(dir: &Path) -> Vec<ModelSpec> {
    let gpt2 = |layers: u64, width: u64| {
        format!(
            r#"{{"model_type": "gpt2", "vocab_size": 5000, "n_positions": 1024,
                "n_embd": {width}, "n_layer": {layers}, "n_head": 4}}"#
        )
    };
    let llama = r#"{"model_type": "llama", "vocab_size": 4000, "hidden_size": 256,
        "intermediate_size": 688, "num_hidden_layers": 6, "num_attention_heads": 8,
        "num_key_value_heads": 2, "max_position_embeddings": 2048,
        "tie_word_embeddings": false}"#;
    vec![
        model(dir, "gpt2-1x64", &gpt2(1, 64)),
        model(dir, "gpt2-3x128", &gpt2(3, 128)),
        model(dir, "gpt2-24x64", &gpt2(24, 64)),
        model(dir, "llama-6x256", llama),
    ]
}

/// Both walks' answers, compared; the pruned walk's counts.
fn same_answer(request: &Request) -> Result<RecommendStats, String> {
    let (reference, every) = recommend_counted(request, Planning::EveryCandidate);
    let (pruned, counts) = recommend_counted(request, Planning::Pruned);
    if every.pruned != 0 || every.full_estimates != every.candidates {
        return Err(format!("the reference walk skipped candidates: {every:?}"));
    }
    if counts.candidates != every.candidates
        || counts.full_estimates + counts.pruned != counts.candidates
    {
        return Err(format!(
            "the walks considered different candidates: {every:?} vs {counts:?}"
        ));
    }
    if reference == pruned {
        Ok(counts)
    } else {
        Err(format!(
            "{} on {} GPUs of {} MiB, host {:?}, seq {}, batch {}: {reference:?} != {pruned:?}",
            request.model.name,
            request.cluster.hardware.total_gpus(),
            request.cluster.gpu_memory / MIB,
            request.cluster.cpu_memory.map(|b| b / MIB),
            request.seq_len,
            request.global_batch
        ))
    }
}

#[test]
fn the_pruned_walk_answers_as_the_full_estimate_of_every_candidate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut checked = 0;
    let mut nothing_fits = 0;
    let mut failures = Vec::new();
    let mut skipped = 0;
    for spec in models(dir.path()) {
        for (gpus, batch) in [(1, 16), (4, 32)] {
            for seq_len in [256, 1024] {
                for gpu_mib in [64, 192, 512, 2048, 16384] {
                    for cpu_memory in [None, Some(4096 * MIB)] {
                        let request = Request {
                            model: spec.clone(),
                            cluster: Cluster {
                                hardware: Topology::new(gpus, 1).expect("valid"),
                                gpu_memory: gpu_mib * MIB,
                                cpu_memory,
                                nvme_path: Some("/local_nvme".into()),
                            },
                            seq_len,
                            checkpointing: Checkpointing::None,
                            attention: AttentionKernel::Flash,
                            global_batch: batch,
                            precision: Precision::Bf16,
                            margins: Margins::default(),
                            cost: CostModel::default(),
                        };
                        match same_answer(&request) {
                            Ok(counts) => skipped += counts.pruned,
                            Err(failure) => failures.push(failure),
                        }
                        if matches!(
                            recommend_with(&request, Planning::Pruned),
                            Err(RecommendError::NothingFits(_))
                        ) {
                            nothing_fits += 1;
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The grid reaches both ends: requests where nothing fits and where something does.
    assert!(
        nothing_fits > 0 && nothing_fits < checked,
        "{nothing_fits} of {checked}"
    );
    // And the grid has candidates the pruned walk skips.
    assert!(skipped > 0, "no candidate of {checked} requests was pruned");
}

/// The request of the CLI's layer-limit test, at `layers` layers and `gpu_gib` GiB per GPU.
fn deep_request(dir: &Path, layers: u64, gpu_gib: u64) -> Request {
    let spec = model(dir, &format!("deep-{layers}"), &deep_config(layers));
    shared_request(spec, gpu_gib << 30)
}

#[test]
fn a_deep_model_is_planned_with_fewer_full_estimates_and_the_same_answer() {
    let dir = tempfile::tempdir().expect("temp dir");
    // Eager attention at 1,024 tokens stores megabytes per layer and sequence: at 96 layers
    // the largest micro-batches overflow a small GPU, micro-batch 1 may fit; the walk must
    // reach both kinds of candidate on one request or the other.
    let mut fitted = false;
    let mut overflowed = false;
    for gpu_gib in [2, 4, 80] {
        let request = deep_request(dir.path(), 96, gpu_gib);
        let (reference, every) = recommend_counted(&request, Planning::EveryCandidate);
        let (pruned, counts) = recommend_counted(&request, Planning::Pruned);
        assert_eq!(pruned, reference, "{gpu_gib} GiB");
        assert_eq!(counts.candidates, every.candidates, "{gpu_gib} GiB");
        assert_eq!(every.full_estimates, every.candidates, "{gpu_gib} GiB");
        assert_eq!(
            counts.full_estimates + counts.pruned,
            counts.candidates,
            "{gpu_gib} GiB"
        );
        match &reference {
            Ok(_) => fitted = true,
            Err(RecommendError::NothingFits(_)) => overflowed = true,
            Err(error) => panic!("{gpu_gib} GiB: {error}"),
        }
        if gpu_gib < 80 {
            // Micro-batches 8, 4 and 2 of every GPU-only strategy overflow these GPUs on
            // activations alone: only micro-batch 1 is estimated.
            assert!(
                counts.full_estimates < every.full_estimates,
                "{gpu_gib} GiB: {counts:?} vs {every:?}"
            );
            assert!(counts.pruned > 0, "{gpu_gib} GiB: {counts:?}");
        }
    }
    assert!(
        fitted && overflowed,
        "fitted {fitted}, overflowed {overflowed}"
    );
}
