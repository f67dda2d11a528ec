//! `dsplan plan` for a model-parallel job: the TP/PP/DP grid, each stage's layers and memory,
//! and the pipeline schedule as a timeline.
//!
//! Exit 1 with `--gpu-memory` when a stage's reserved peak does not fit.

use dsplan_planner::estimate::full::Margins;
use dsplan_planner::parallel::schedule::{Timeline, bubble_fraction, timeline};
use dsplan_planner::parallel::stages::{self, FullParallelEstimate};
use dsplan_planner::parallel::{Job, launch};
use serde::Serialize;

use super::estimate::ParallelJson;
use super::{Failure, JobSource, refused, tables};
use crate::cli::Outcome;
use crate::cli::plan::PlanFormat;

/// The most operations a drawn or listed timeline has.
const TIMELINE_OPS: u64 = 200_000;
/// The widest timeline drawn in human output, ticks.
const TIMELINE_WIDTH: u64 = 160;

#[derive(Serialize)]
struct PlanJson<'a> {
    parallel: ParallelJson<'a>,
    warnings: &'a [String],
    pipeline_stages: &'a FullParallelEstimate,
    bubble_fraction: f64,
    timeline: Option<Timeline>,
    ds_config: serde_json::Value,
    megatron_flags: String,
}

/// Plans a 3D job; the outcome is exit 1 when `gpu_memory` is given and exceeded.
pub fn run(
    source: &JobSource,
    gpu_memory: Option<u64>,
    format: PlanFormat,
) -> Result<(String, Outcome), Failure> {
    let job: &Job = source.job();
    if format == PlanFormat::Trace {
        return Err((
            Outcome::UsageError,
            "--format trace draws one data-parallel rank's step; for a 3D plan use --format human (the pipeline timeline) or json".into(),
        ));
    }
    let estimate =
        stages::estimate(job, &Margins::default()).map_err(|error| refused(&error.into()))?;
    for warning in source.warnings() {
        say!("warning: {}", crate::render::escape_controls(warning));
    }
    let micro_batches = job.micro_batches();
    let line = timeline(&job.layout, micro_batches, TIMELINE_OPS);
    let bubble = line.as_ref().map_or_else(
        || bubble_fraction(&job.layout, micro_batches),
        |l| l.bubble_fraction,
    );
    let too_big: Vec<u64> = gpu_memory.map_or_else(Vec::new, |available| {
        estimate
            .pipeline_stages
            .iter()
            .filter(|s| s.reserved_bytes > available)
            .map(|s| s.stage)
            .collect()
    });
    let outcome = if too_big.is_empty() {
        Outcome::Success
    } else {
        Outcome::InputRejected
    };
    let text = match format {
        PlanFormat::Json | PlanFormat::Trace => {
            let document = PlanJson {
                parallel: ParallelJson {
                    layout: &job.layout,
                    batch: &job.batch,
                    micro_batches,
                    training: &job.training,
                },
                warnings: source.warnings(),
                pipeline_stages: &estimate,
                bubble_fraction: bubble,
                timeline: line,
                ds_config: launch::ds_config(job),
                megatron_flags: launch::megatron_flags(job),
            };
            serde_json::to_string_pretty(&document)
                .map_err(|error| (Outcome::UsageError, format!("cannot render JSON: {error}")))?
                + "\n"
        }
        PlanFormat::Human => {
            let mut text = format!(
                "3D plan of {}: {}\n",
                source.model_name(),
                tables::describe(job)
            );
            text.push_str(&tables::grid(job));
            text.push_str(&tables::stages(job, &estimate, 12));
            match &line {
                Some(line) => text.push_str(&tables::timeline(line, TIMELINE_WIDTH)),
                None => text.push_str(&format!(
                    "Pipeline timeline: too long to simulate here; bubble (p-1)/(v*m + p-1) = {:.1} % of the step\n",
                    bubble * 100.0
                )),
            }
            if let Some(available) = gpu_memory {
                if too_big.is_empty() {
                    text.push_str(&format!(
                        "Every stage fits {} GiB.\n",
                        crate::units::gib_figure(available)
                    ));
                } else {
                    text.push_str(&format!(
                        "Does not fit {} GiB: stage(s) {:?} need more (reserved column).\n",
                        crate::units::gib_figure(available),
                        too_big
                    ));
                }
            }
            text
        }
    };
    Ok((text, outcome))
}
