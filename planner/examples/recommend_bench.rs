//! Benchmark of `recommend`'s ZeRO walk on a very deep model: the request of the CLI test
//! `recommend_and_the_preflight_at_the_layer_limit_take_seconds_not_hours` (a GPT-2 config of
//! width 64, 4 heads, vocabulary 50,257, 1,024 positions; 8 GPUs of 80 GiB on one node,
//! sequences of 1,024 tokens, a global batch of 64).
//!
//! ```sh
//! cargo run --release -p dsplan-planner --example recommend_bench -- [LAYERS] [COMPARED]
//! ```
//!
//! Each timing covers the whole request as `dsplan recommend` runs it: the model's
//! `config.json` is read and parsed, then the walk runs. It prints the pruned walk
//! ([`Planning::Pruned`], what the CLI runs) at `LAYERS` layers (default 16,384, the layer
//! limit), and, at `COMPARED` layers (default 4,096, where the reference also finishes in
//! seconds), the pruned walk against the walk that fully estimates every candidate
//! ([`Planning::EveryCandidate`]), with the ratio of their times, the count of full estimates
//! each ran, and whether their answers are equal (they must be). The issue's target: under
//! 2 s at 16,384 layers in a release build.

use std::path::Path;
use std::time::Instant;

use dsplan_planner::model::{self, LmHead};
use dsplan_planner::recommend::{
    Planning, RecommendError, RecommendStats, Recommendation, recommend_counted,
};

#[path = "../tests/support/deep_request.rs"]
mod deep_request;
use deep_request::{deep_config, deep_request};

/// Rounds per timing; the best is reported.
const ROUNDS: usize = 3;

type Answer = Result<Recommendation, RecommendError>;

/// Writes the deep GPT-2 config of the CLI test.
fn write_model(dir: &Path, layers: u64) -> Result<String, Box<dyn std::error::Error>> {
    let path = dir.join(format!("deep{layers}.json"));
    std::fs::write(&path, deep_config(layers))?;
    Ok(path.to_str().ok_or("a UTF-8 temporary path")?.to_owned())
}

/// One request as the CLI runs it: load the model, then walk.
fn run_once(
    model_path: &str,
    planning: Planning,
) -> Result<(Answer, RecommendStats), Box<dyn std::error::Error>> {
    let spec = model::load(model_path, LmHead::Include)?;
    Ok(recommend_counted(&deep_request(spec, 80 << 30), planning))
}

/// The best of [`ROUNDS`] timings of one request, with its answer and counts.
fn timed(
    model_path: &str,
    planning: Planning,
) -> Result<(f64, Answer, RecommendStats), Box<dyn std::error::Error>> {
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let outcome = run_once(model_path, planning)?;
        best = best.min(start.elapsed().as_secs_f64());
        last = Some(outcome);
    }
    let (answer, stats) = last.ok_or("at least one round")?;
    Ok((best, answer, stats))
}

fn verdict(answer: &Answer) -> String {
    match answer {
        Ok(recommendation) => format!(
            "chosen {:?}, micro-batch {}",
            recommendation.chosen.plan.strategy, recommendation.chosen.plan.micro_batch
        ),
        Err(RecommendError::NothingFits(candidates)) => {
            format!("nothing fits ({} candidates reported)", candidates.len())
        }
        Err(error) => format!("error: {error}"),
    }
}

fn layer_arg(position: usize, default: u64) -> Result<u64, Box<dyn std::error::Error>> {
    match std::env::args().nth(position) {
        Some(text) => Ok(text.parse()?),
        None => Ok(default),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let layers = layer_arg(1, 16_384)?;
    let compared = layer_arg(2, 4_096)?;
    let dir = std::env::temp_dir().join(format!("dsplan-recommend-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let deep = write_model(&dir, layers)?;
    let (seconds, answer, stats) = timed(&deep, Planning::Pruned)?;
    println!(
        "Pruned at {layers} layers: {seconds:.3} s (best of {ROUNDS}), {} full estimates of {} candidates; {}",
        stats.full_estimates,
        stats.candidates,
        verdict(&answer)
    );

    let shallow = write_model(&dir, compared)?;
    let (pruned_seconds, pruned_answer, pruned_stats) = timed(&shallow, Planning::Pruned)?;
    let (every_seconds, every_answer, every_stats) = timed(&shallow, Planning::EveryCandidate)?;
    println!(
        "Pruned at {compared} layers: {pruned_seconds:.3} s, {} full estimates of {} candidates",
        pruned_stats.full_estimates, pruned_stats.candidates
    );
    println!(
        "EveryCandidate at {compared} layers: {every_seconds:.3} s, {} full estimates of {} candidates",
        every_stats.full_estimates, every_stats.candidates
    );
    println!(
        "ratio EveryCandidate / Pruned at {compared} layers: {:.2}x; answers {}",
        every_seconds / pruned_seconds,
        if pruned_answer == every_answer {
            "equal"
        } else {
            "DIFFER"
        }
    );
    std::fs::remove_dir_all(&dir)?;
    if pruned_answer != every_answer {
        return Err("the pruned walk's answer differs from the reference".into());
    }
    Ok(())
}
