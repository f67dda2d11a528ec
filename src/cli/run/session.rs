//! The run once it is set up: where it starts ([`checkpoints`]: a fresh run, or the point a
//! `--resume` checkpoint holds), what it says before step 0 ([`opening`]), the training itself
//! through the one loop with progress and `--metrics` ([`train`]), and what it leaves behind
//! ([`finish`]: the checkpoint directory's notes, `--save-model`, the summary).

use dsplan_executor::checkpoint::{NonFinite, load_checkpoint_with};
use dsplan_executor::cuda::Backend;
use dsplan_executor::cuda::train::CudaTrainError;
use dsplan_executor::io::llama_pretrained::{SavedTo, save_trained};
use dsplan_executor::metrics::StepMetrics;
use dsplan_executor::train::{
    CheckpointOptions, SavePolicy, TrainReport, TrainSpec, plan_training, resume_point,
};
use dsplan_executor::zero::MixedPrecision;
use dsplan_planner::plan::Plan;

use super::job::Job;
use super::outputs::Prepared;
use super::progress::{MetricsFile, Progress};
use super::ranks::Ranks;
use super::report::{self, RunFacts};
use super::{Failure, Format, RunArgs, bytes, checkpoint_failure, cuda, thousands, train_failure};
use crate::render;

/// Where the run starts: `--resume`'s checkpoint checked against the run and the plan, and
/// where it saves (`--save-checkpoint`).
pub(super) fn checkpoints(
    args: &RunArgs,
    spec: &TrainSpec,
    plan: &Plan,
    job: &Job,
    ranks: &Ranks,
) -> Result<CheckpointOptions, Failure> {
    let save = args
        .save_checkpoint
        .as_ref()
        .map(|dir| SavePolicy::new(dir, args.checkpoint_every));
    let Some(path) = &args.resume else {
        return Ok(CheckpointOptions { save, resume: None });
    };
    let non_finite = if args.allow_non_finite_checkpoint {
        NonFinite::Allow
    } else {
        NonFinite::Refuse
    };
    let started = std::time::Instant::now();
    let loaded = load_checkpoint_with(path, non_finite).map_err(checkpoint_failure)?;
    let seconds = started.elapsed().as_secs_f64();
    let point = resume_point(spec, plan, &loaded).map_err(|e| train_failure(e, &job.display))?;
    if ranks.reports() {
        for note in &point.notes {
            say!("note: {}", render::escape_message(note));
        }
        say!(
            "resuming from {} at step {} ({} applied, loss scale {}; read in {seconds:.2} s)",
            render::escape_controls(&point.location.path().display().to_string()),
            point.global_step,
            point.applied_steps,
            point.scaler.scale()
        );
    }
    Ok(CheckpointOptions {
        save,
        resume: Some(point),
    })
}

/// What the run is, before step 0 (rank 0 alone speaks for a job of processes).
pub(super) fn opening(
    job: &Job,
    spec: &TrainSpec,
    plan: &Plan,
    (backend, ranks): (&Backend, &Ranks),
    model: &str,
) {
    let settings = &spec.settings;
    let batch = settings.batch;
    let world = spec.world;
    say!(
        "dsplan run {}: ZeRO stage {}, {}, {world} {} {}",
        job.display,
        settings.stage as u8,
        precision_name(&settings.precision()),
        ranks.kind(),
        cuda::place(backend, ranks, world),
    );
    say!(
        "model {} ({} parameters); data {}; {} x {} tokens per rank and micro-step, {} micro-step(s), global batch {}; {} steps",
        render::escape_controls(model),
        thousands(job.num_params as u64),
        job.data_name,
        batch.micro_batch,
        spec.seq_len,
        batch.grad_accum,
        batch.train_batch,
        spec.steps,
    );
    say!("{}", plan_line(plan));
    for notice in &settings.notices {
        say!("note: {}", render::escape_message(notice));
    }
}

/// Trains `spec` by `plan` on `backend` through the one training loop, with the progress line
/// and `--metrics`. A failed run is reported as itself; a metrics file that failed too is added
/// to it.
pub(super) fn train(
    args: &RunArgs,
    job: &Job,
    (spec, plan, checkpoints): (&TrainSpec, &Plan, &CheckpointOptions),
    (backend, ranks): (&Backend, &Ranks),
) -> Result<TrainReport, Failure> {
    ranks.check_backend(backend)?;
    let metrics = match args.metrics.as_ref().filter(|_| ranks.reports()) {
        Some(path) => Some(MetricsFile::create(path)?),
        None => None,
    };
    let policy = plan_training(plan).map_err(|e| train_failure(e, &job.display))?;
    let mut progress = Progress::new(spec.steps, policy, metrics);
    if let Some(point) = &checkpoints.resume {
        progress.resume_at(point.global_step, point.applied_steps);
    }
    let observer = |m: &StepMetrics| progress.observe(m);
    let result = match backend {
        Backend::Cuda(device) => cuda::train(spec, plan, checkpoints, (device, ranks), &observer)
            .map_err(|e| match e {
                CudaTrainError::Run(e) => train_failure(e, &job.display),
                other => Failure::input(format!("--device cuda: {other}")),
            }),
        Backend::Cpu => ranks
            .train(spec, plan, checkpoints, &observer)
            .map_err(|e| train_failure(e, &job.display)),
    };
    let committed = progress.finish().map(|m| m.commit()).transpose();
    match (result, committed) {
        (Err(mut failure), Err(metrics)) => {
            failure.message = format!("{}; also: {}", failure.message, metrics.message);
            Err(failure)
        }
        (Err(failure), Ok(_)) | (Ok(_), Err(failure)) => Err(failure),
        (Ok(report), Ok(_)) => Ok(report),
    }
}

/// What the run leaves: the checkpoint directory's notes, then (rank 0) the model and the
/// summary.
pub(super) fn finish(
    args: &RunArgs,
    job: &Job,
    (spec, report): (&TrainSpec, &TrainReport),
    (prepared, ranks): (Prepared, &Ranks),
    model: &str,
) -> Result<(), Failure> {
    if let Some(dir) = args.save_checkpoint.as_ref().filter(|_| ranks.reports()) {
        for note in prepared.finish(dir, &report.checkpoints) {
            say!("note: {note}");
        }
    }
    if !ranks.reports() {
        return Ok(());
    }
    let saved = match &args.save_model {
        Some(path) => Some(
            save_trained(
                path,
                &spec.model,
                &report.final_params,
                spec.settings.precision().model_dtype(),
            )
            .map_err(|e| Failure::usage(format!("cannot save the model: {e}")))?,
        ),
        None => None,
    };
    let facts = RunFacts {
        config: &job.display,
        model,
        num_params: job.num_params,
    };
    let summary = report::summary(&facts, spec, report);
    match args.format {
        Format::Human => say_text!("{}", report::human(report, &summary)),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        ),
    }
    let shown =
        |path: &std::path::Path| render::escape_controls(&path.display().to_string()).into_owned();
    match (&args.save_model, saved) {
        (Some(path), Some(SavedTo::File)) => {
            say!("saved the trained fp32 model to {}", shown(path));
        }
        (Some(path), Some(SavedTo::Directory(mut files))) => {
            if let Some(data) = job.sft.as_ref().and_then(|sft| sft.data.as_ref()) {
                files.extend(
                    super::sft::copy_tokenizer(&data.tokenizer, path).map_err(Failure::usage)?,
                );
            }
            say!(
                "saved the trained model to {} (config.json, {})",
                shown(path),
                files.join(", ")
            );
        }
        _ => {}
    }
    if let Some(last) = report.checkpoints.last() {
        say!(
            "saved {} checkpoint(s) to {}; the last, {} ({}, {:.2} s), is `latest`",
            report.checkpoints.len(),
            shown(&last.location.dir),
            last.location.tag,
            bytes(last.bytes),
            last.seconds
        );
    }
    Ok(())
}

/// One line saying what the plan decided and the engines follow.
fn plan_line(plan: &Plan) -> String {
    let layout = &plan.layout;
    let mut line = format!(
        "plan: {} elements padded to {}, {} per rank; {} gradient bucket(s) ({})",
        thousands(layout.numel),
        thousands(layout.padded_numel),
        thousands(layout.partition_numel),
        plan.buckets.reduce.len(),
        plan.buckets
            .reduce
            .first()
            .map_or("none", |b| b.collective.as_str()),
    );
    if let Some(gather) = &plan.buckets.param_gather {
        line.push_str(&format!(
            "; parameter all-gather in {} piece(s)",
            gather.shards.len()
        ));
    }
    if let (Some(schedule), Some(persistent)) = (&plan.stage3, &plan.shards.persistent) {
        line.push_str(&format!(
            "; stage 3: {} fetch units, {} persistent tensor(s), gathered on demand",
            schedule.unit_count(),
            persistent.entries.len()
        ));
    }
    line
}

fn precision_name(precision: &MixedPrecision) -> String {
    match precision {
        MixedPrecision::Fp32 => "fp32".to_string(),
        MixedPrecision::Bf16 { .. } => "bf16 (fp32 master weights)".to_string(),
        MixedPrecision::Fp16 { scale } => {
            if scale.is_dynamic() {
                format!(
                    "fp16 (fp32 master weights, dynamic loss scale from 2^{})",
                    scale.initial_scale_power
                )
            } else {
                format!(
                    "fp16 (fp32 master weights, static loss scale {})",
                    scale.loss_scale
                )
            }
        }
    }
}
