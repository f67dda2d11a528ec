//! Benchmark of `recommend`'s 3D layout search: Llama-3-70B on 1,024 GPUs (8 per node, 80 GiB),
//! sequences of 8,192 tokens, a global batch of 1,024.
//!
//! ```sh
//! cargo run --release -p dsplan-planner --example layout_search_bench
//! ```
//!
//! Prints the layouts costed, the seconds, layouts per second, and, as the baseline measured
//! in the same run, the rate of the ZeRO-only `recommend` walk (data parallelism, each
//! candidate costed through the compiled execution plan) on the same model and one node, with
//! the ratio of the two rates. The issue's targets: at least 10,000 layouts/s and the whole
//! search under 2 s.

use std::time::Instant;

use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::{AttentionKernel, Checkpointing, Margins, Precision};
use dsplan_planner::model::{self, LmHead};
use dsplan_planner::parallel::search::{SearchRequest, search};
use dsplan_planner::parallel::{Dropout, DropoutUse, TransformerShape};
use dsplan_planner::recommend::{self, Cluster, CostModel, Request};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let spec = model::load("llama-3-70b", LmHead::Include)?;
    let architecture = spec.architecture.ok_or("the preset has an architecture")?;
    let shape = TransformerShape::from_architecture(&architecture)?;
    let request = SearchRequest {
        shape,
        gpus: 1024,
        gpus_per_node: 8,
        gpu_memory: 80 << 30,
        seq_len: 8192,
        global_batch: 1024,
        precision: Precision::Bf16,
        attention: AttentionKernel::Flash,
        dropout: Dropout {
            hidden: DropoutUse::Skipped,
            attention: DropoutUse::Skipped,
        },
        cost: CostModel::default(),
        margins: Margins::default(),
    };
    let rounds = 3;
    let mut best_seconds = f64::INFINITY;
    let mut examined = 0;
    for _ in 0..rounds {
        let start = Instant::now();
        let outcome = search(&request);
        best_seconds = best_seconds.min(start.elapsed().as_secs_f64());
        examined = outcome.examined;
        let best = outcome.best.ok_or("a layout fits")?;
        let layout = best.job.layout;
        println!(
            "best: t{} p{} v{} {:?} d{} micro-batch {} {:?} {:?}, {:.2} s/step, {:.0} tokens/s",
            layout.tensor,
            layout.pipeline,
            layout.schedule.chunks(),
            layout.sequence,
            layout.data,
            best.job.batch.micro_batch,
            best.job.training.runtime,
            best.job.training.recompute,
            best.step.total,
            best.tokens_per_second
        );
    }
    let rate = examined as f64 / best_seconds;
    println!(
        "3D search, Llama-3-70B x 1024 GPUs: {examined} layouts in {best_seconds:.3} s (best of {rounds}) = {rate:.0} layouts/s"
    );

    // Baseline, same run: the ZeRO-only walk of `recommend` on one node of the same GPUs.
    let baseline = Request {
        model: spec.clone(),
        cluster: Cluster {
            hardware: Topology::new(8, 1)?,
            gpu_memory: 80 << 30,
            cpu_memory: None,
            nvme_path: None,
        },
        seq_len: 8192,
        checkpointing: Checkpointing::Full,
        attention: AttentionKernel::Flash,
        global_batch: 64,
        precision: Precision::Bf16,
        margins: Margins::default(),
        cost: CostModel::default(),
    };
    let start = Instant::now();
    let walked = match recommend::recommend(&baseline) {
        Ok(recommendation) => recommendation.candidates.len(),
        Err(recommend::RecommendError::NothingFits(candidates)) => candidates.len(),
        Err(error) => return Err(error.into()),
    };
    let seconds = start.elapsed().as_secs_f64();
    let baseline_rate = walked as f64 / seconds;
    println!(
        "baseline, ZeRO-only recommend walk (Llama-3-70B, 8 GPUs): {walked} candidates in {seconds:.3} s = {baseline_rate:.1} candidates/s"
    );
    println!(
        "ratio: {:.0}x the baseline's rate per costed configuration",
        rate / baseline_rate
    );
    Ok(())
}
