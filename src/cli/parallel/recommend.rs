//! `dsplan recommend --gpus N`: the fastest 3D layout that fits, from the analytic search of
//! [`dsplan_planner::parallel::search`], as a `ds_config.json` plus Megatron flags, with each
//! stage's memory and the predicted step.

use std::path::Path;
use std::time::Instant;

use dsplan_planner::estimate::full::Margins;
use dsplan_planner::memory::{AttentionKernel, Precision};
use dsplan_planner::model::{Family, ModelSpec};
use dsplan_planner::parallel::search::{Evaluated, SearchOutcome, SearchRequest, search};
use dsplan_planner::parallel::{Dropout, DropoutUse, TransformerShape, launch};
use dsplan_planner::recommend::CostModel;
use serde::Serialize;

use super::{Failure, tables};
use crate::cli::{Format, Outcome};
use crate::units::gib_figure as gib;

/// What `recommend` passes on.
pub struct RecommendInputs<'a> {
    /// The model.
    pub spec: &'a ModelSpec,
    /// GPUs in all.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Bytes per GPU.
    pub gpu_memory: u64,
    /// Tokens per sequence.
    pub seq_len: u64,
    /// Sequences per step.
    pub global_batch: u64,
    /// Precision.
    pub precision: Precision,
    /// Flash attention.
    pub attention: AttentionKernel,
    /// Step-time constants.
    pub cost: CostModel,
    /// Memory margins.
    pub margins: Margins,
    /// Where to write the config.
    pub output: Option<&'a Path>,
    /// Output format.
    pub format: Format,
}

#[derive(Serialize)]
struct Choice<'a> {
    layout: &'a dsplan_planner::parallel::Layout,
    batch: &'a dsplan_planner::parallel::Batch,
    micro_batches: u64,
    training: &'a dsplan_planner::parallel::Training,
    stage_peak_bytes: &'a [u64],
    stage_reserved_bytes: &'a [u64],
    step: dsplan_planner::parallel::time::StepTime,
    tokens_per_second: f64,
}

fn choice(evaluated: &Evaluated) -> Choice<'_> {
    Choice {
        layout: &evaluated.job.layout,
        batch: &evaluated.job.batch,
        micro_batches: evaluated.job.micro_batches(),
        training: &evaluated.job.training,
        stage_peak_bytes: &evaluated.stage_peak_bytes,
        stage_reserved_bytes: &evaluated.stage_reserved_bytes,
        step: evaluated.step,
        tokens_per_second: evaluated.tokens_per_second,
    }
}

#[derive(Serialize)]
struct RecommendJson<'a> {
    model: &'a str,
    gpus: u64,
    gpus_per_node: u64,
    gpu_memory: u64,
    seq_len: u64,
    global_batch: u64,
    examined: u64,
    fitting: u64,
    search_seconds: f64,
    layouts_per_second: f64,
    chosen: Option<Choice<'a>>,
    ds_config: Option<serde_json::Value>,
    megatron_flags: Option<String>,
    runners_up: Vec<Choice<'a>>,
    closest: Option<Choice<'a>>,
    cost: CostModel,
}

fn summary(evaluated: &Evaluated) -> String {
    format!(
        "{:.2} s/step, {:.0} tokens/s, busiest stage {} GiB",
        evaluated.step.total,
        evaluated.tokens_per_second,
        gib(evaluated.reserved_bytes)
    )
}

/// Searches and renders; exit 1 when nothing fits.
pub fn run(inputs: &RecommendInputs<'_>) -> Result<(String, Outcome), Failure> {
    let Some(architecture) = inputs.spec.architecture else {
        return Err((
            Outcome::InputRejected,
            format!(
                "{}: the 3D search needs the model's shape",
                inputs.spec.name
            ),
        ));
    };
    let shape = TransformerShape::from_architecture(&architecture)
        .map_err(|error| super::refused(&error.into()))?;
    if inputs.gpus_per_node == 0 || inputs.gpus == 0 {
        return Err((
            Outcome::UsageError,
            "--gpus and --gpus-per-node must be at least 1".into(),
        ));
    }
    let dropout = match architecture.family {
        Family::Gpt2 => DropoutUse::Applied,
        _ => DropoutUse::Skipped,
    };
    let request = SearchRequest {
        shape,
        gpus: inputs.gpus,
        gpus_per_node: inputs.gpus_per_node,
        gpu_memory: inputs.gpu_memory,
        seq_len: inputs.seq_len,
        global_batch: inputs.global_batch,
        precision: inputs.precision,
        attention: inputs.attention,
        dropout: Dropout {
            hidden: dropout,
            attention: dropout,
        },
        cost: inputs.cost,
        margins: inputs.margins,
    };
    let started = Instant::now();
    let outcome: SearchOutcome = search(&request);
    let seconds = started.elapsed().as_secs_f64();
    let rate = outcome.examined as f64 / seconds.max(1e-9);
    let config = outcome
        .best
        .as_ref()
        .map(|best| launch::ds_config(&best.job));
    let flags = outcome
        .best
        .as_ref()
        .map(|best| launch::megatron_flags(&best.job));
    if let (Some(config), Some(path)) = (&config, inputs.output) {
        let text = serde_json::to_string_pretty(config).map_err(|error| {
            (
                Outcome::UsageError,
                format!("cannot render the config: {error}"),
            )
        })?;
        dsplan_executor::io::write_output(path, (text + "\n").as_bytes()).map_err(|error| {
            (
                Outcome::UsageError,
                format!("cannot write {}: {error}", path.display()),
            )
        })?;
    }
    let exit = if outcome.best.is_some() {
        Outcome::Success
    } else {
        Outcome::InputRejected
    };
    let text = match inputs.format {
        Format::Json => {
            let document = RecommendJson {
                model: &inputs.spec.name,
                gpus: inputs.gpus,
                gpus_per_node: inputs.gpus_per_node,
                gpu_memory: inputs.gpu_memory,
                seq_len: inputs.seq_len,
                global_batch: inputs.global_batch,
                examined: outcome.examined,
                fitting: outcome.fitting,
                search_seconds: seconds,
                layouts_per_second: rate,
                chosen: outcome.best.as_ref().map(choice),
                ds_config: config,
                megatron_flags: flags,
                runners_up: outcome.runners_up.iter().map(choice).collect(),
                closest: outcome.closest.as_ref().map(choice),
                cost: inputs.cost,
            };
            serde_json::to_string_pretty(&document)
                .map_err(|error| (Outcome::UsageError, format!("cannot render JSON: {error}")))?
                + "\n"
        }
        Format::Human => {
            let mut text = format!(
                "Searched {} layouts of tensor, pipeline, virtual pipeline, sequence and data parallelism, ZeRO stage, micro-batch and recompute in {:.3} s ({:.0} layouts/s); {} fit {} GiB.\n",
                outcome.examined,
                seconds,
                rate,
                outcome.fitting,
                gib(inputs.gpu_memory)
            );
            match &outcome.best {
                Some(best) => {
                    text.push_str(&format!("Recommended: {}\n", tables::describe(&best.job)));
                    let step = &best.step;
                    text.push_str(&format!(
                        "  predicted step {:.2} s ({:.0} tokens/s): compute {:.2}, pipeline bubble {:.2}, tensor-parallel {:.2}, Ulysses {:.2}, pipeline sends {:.2}, exposed data-parallel {:.2}, optimizer {:.2}\n",
                        step.total, best.tokens_per_second, step.compute, step.bubble, step.tensor_communication,
                        step.sequence_communication, step.pipeline_communication, step.data_communication, step.optimizer
                    ));
                    let per_stage: Vec<String> =
                        best.stage_reserved_bytes.iter().map(|b| gib(*b)).collect();
                    text.push_str(&format!(
                        "  memory per GPU by pipeline stage (GiB, reserved): {}\n",
                        per_stage.join(" ")
                    ));
                    if !outcome.runners_up.is_empty() {
                        text.push_str("Next fastest:\n");
                        for other in &outcome.runners_up {
                            text.push_str(&format!(
                                "  {}: {}\n",
                                tables::describe(&other.job),
                                summary(other)
                            ));
                        }
                    }
                    if let Some(flags) = &flags {
                        text.push_str(&format!(
                            "\nMegatron-DeepSpeed flags (pretrain_gpt.py; with Megatron-LM, drop --deepspeed ... --zero-stage and add --use-distributed-optimizer for ZeRO-1):\n{flags}\n"
                        ));
                    }
                    match (inputs.output, &config) {
                        (Some(path), _) => text.push_str(&format!("\nWrote {}\n", path.display())),
                        (None, Some(config)) => {
                            let rendered =
                                serde_json::to_string_pretty(config).map_err(|error| {
                                    (
                                        Outcome::UsageError,
                                        format!("cannot render the config: {error}"),
                                    )
                                })?;
                            text.push_str(&format!("\nds_config.json:\n{rendered}\n"));
                        }
                        (None, None) => {}
                    }
                }
                None => {
                    text.push_str("No layout fits.\n");
                    if let Some(closest) = &outcome.closest {
                        text.push_str(&format!(
                            "Closest: {}: {}\n",
                            tables::describe(&closest.job),
                            summary(closest)
                        ));
                    }
                }
            }
            text
        }
    };
    Ok((text, exit))
}
