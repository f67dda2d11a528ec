//! `dsplan estimate` for a model-parallel job: Megatron-LM's calculator and dsplan's full
//! estimate of every pipeline stage.
//!
//! JSON: `model`, `hardware`, `parallel` (layout, batch, training), `warnings`,
//! `megatron_calculator` (Megatron's figures, `null` under Ulysses) and `full` with
//! `pipeline_stages[]` (`peak_bytes`, `after_step_bytes`, `reserved_bytes`, each term).

use dsplan_planner::estimate::Topology;
use dsplan_planner::estimate::full::Margins;
use dsplan_planner::parallel::calculator::{CalculatorInputs, CalculatorReport, report};
use dsplan_planner::parallel::stages::{self, FullParallelEstimate};
use dsplan_planner::parallel::{Batch, Layout, Training, TransformerShape};
use serde::Serialize;

use super::{Failure, JobSource, refused, tables};
use crate::cli::{Format, Outcome};

/// The model of a 3D estimate.
#[derive(Serialize)]
struct ModelJson<'a> {
    name: String,
    source: String,
    shape: &'a TransformerShape,
}

/// The layout of a 3D estimate.
#[derive(Serialize)]
pub struct ParallelJson<'a> {
    /// The GPU split.
    pub layout: &'a Layout,
    /// The batch.
    pub batch: &'a Batch,
    /// Micro-batches per step.
    pub micro_batches: u64,
    /// How it trains.
    pub training: &'a Training,
}

#[derive(Serialize)]
struct EstimateJson<'a> {
    model: ModelJson<'a>,
    hardware: Topology,
    parallel: ParallelJson<'a>,
    warnings: &'a [String],
    megatron_calculator: Option<CalculatorReport>,
    full: FullParallelEstimate,
}

/// Estimates a 3D job and renders it.
pub fn run(
    source: &JobSource,
    hardware: Topology,
    margins: &Margins,
    format: Format,
) -> Result<String, Failure> {
    let job = source.job();
    let calculator = CalculatorInputs::from_job(job)
        .map_err(|error| refused(&error.into()))?
        .map(|inputs| report(&inputs));
    let full = stages::estimate(job, margins).map_err(|error| refused(&error.into()))?;
    for warning in source.warnings() {
        say!("warning: {}", crate::render::escape_controls(warning));
    }
    match format {
        Format::Json => {
            let document = EstimateJson {
                model: ModelJson {
                    name: source.model_name(),
                    source: match source {
                        JobSource::Megatron(_) => "megatron-args".to_owned(),
                        JobSource::Config { spec, .. } => spec.source.to_string(),
                    },
                    shape: &job.shape,
                },
                hardware,
                parallel: ParallelJson {
                    layout: &job.layout,
                    batch: &job.batch,
                    micro_batches: job.micro_batches(),
                    training: &job.training,
                },
                warnings: source.warnings(),
                megatron_calculator: calculator,
                full,
            };
            serde_json::to_string_pretty(&document)
                .map(|json| json + "\n")
                .map_err(|error| (Outcome::UsageError, format!("cannot render JSON: {error}")))
        }
        Format::Human => {
            let mut text = format!(
                "3D estimate of {}: {}\n",
                source.model_name(),
                tables::describe(job)
            );
            text.push_str(&tables::calculator(calculator.as_ref()));
            text.push_str(&tables::stages(job, &full, 12));
            Ok(text)
        }
    }
}
