//! [`train`]: one run, one thread per rank, following the run's execution plan; with
//! [`train_planned_with`], saving checkpoints as it goes and starting from one
//! ([`super::checkpoints`]).

use std::time::Instant;

use dsplan_planner::plan::{Plan, PlanBackend};

use super::checkpoints::{CheckpointOptions, every_rank};
use super::plan::compile_plan;
use super::prepare::{check_model, prepare};
use super::rank::{Gather, run_rank};
use super::{TrainError, TrainReport, TrainSpec};
use crate::checkpoint::consolidate;
use crate::comm::run_ranks;
use crate::metrics::StepMetrics;
use crate::zero::swap::{NvmeReport, NvmeUsage};

/// Compiles the plan of `spec` ([`compile_plan`]) and runs it, calling `observer` with every
/// step of rank 0 as it finishes.
pub fn train(
    spec: &TrainSpec,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    check_model(spec)?;
    let plan = compile_plan(&spec.settings, &spec.model, spec.seq_len, spec.world)
        .map_err(TrainError::Plan)?;
    train_planned(spec, &plan, observer)
}

/// Runs `spec` by `plan` (from [`compile_plan`]), calling `observer` with
/// every step of rank 0 as it finishes.
pub fn train_planned(
    spec: &TrainSpec,
    plan: &Plan,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    train_planned_with(spec, plan, &CheckpointOptions::default(), observer)
}

/// [`train_planned`] with checkpoints: resumed from `checkpoints.resume` (steps
/// `global_step..spec.steps` are run, numbered as in the uninterrupted run) and saved as
/// `checkpoints.save` says. Every rank is a thread of this process ([`run_ranks`]); each runs
/// [`run_rank`].
pub fn train_planned_with(
    spec: &TrainSpec,
    plan: &Plan,
    checkpoints: &CheckpointOptions,
    observer: &(dyn Fn(&StepMetrics) + Sync),
) -> Result<TrainReport, TrainError> {
    let prepared = prepare(spec, plan, checkpoints, PlanBackend::DsplanCpu)?;
    let world = prepared.world;
    let started = Instant::now();
    let outcomes = run_ranks(world, |comm| {
        run_rank(
            &prepared,
            Box::new(comm),
            checkpoints,
            observer,
            Gather::Nothing,
        )
    })
    .map_err(TrainError::Comm)?;
    let seconds = started.elapsed().as_secs_f64();

    let mut ranks = every_rank(outcomes).map_err(|(rank, error)| error.into_train_error(rank))?;
    let masters: Vec<Vec<f32>> = ranks
        .iter_mut()
        .map(|r| std::mem::take(&mut r.master))
        .collect();
    let final_params = consolidate(
        &prepared.engine_plan,
        prepared.engine_plan.stage(),
        &masters,
    );
    let nvme_ranks: Vec<NvmeUsage> = ranks.iter_mut().filter_map(|r| r.nvme.take()).collect();
    let nvme = (!nvme_ranks.is_empty()).then(|| NvmeReport {
        ranks: nvme_ranks,
        ..NvmeReport::of_plan(plan)
    });
    Ok(TrainReport {
        steps: ranks
            .first_mut()
            .map(|r| std::mem::take(&mut r.steps))
            .unwrap_or_default(),
        final_params,
        memory: ranks.iter().map(|r| r.memory).collect(),
        predicted: prepared.predicted,
        plan_memory: prepared.plan_memory,
        correspondence: prepared.correspondence,
        traffic: ranks.iter().map(|r| r.traffic.clone()).collect(),
        applied_steps: ranks.first().map_or(0, |r| r.applied_steps),
        seconds,
        tokens: prepared.tokens_per_step * spec.steps.saturating_sub(prepared.first_step),
        first_step: prepared.first_step,
        checkpoints: ranks
            .first_mut()
            .map(|r| std::mem::take(&mut r.checkpoints))
            .unwrap_or_default(),
        nvme,
        device: None,
    })
}
