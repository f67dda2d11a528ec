//! The one training loop: [`run_step`] is an optimizer step in DeepSpeed's order over any
//! [`StepBackend`], [`drive`] runs the steps of a rank (resume, metrics, progress, divergence,
//! checkpoints).
//!
//! For each micro-step `k < G`: forward with the loss multiplied by `S / G` (`S` the loss
//! scale, 1 unless fp16), backward (stages 2 and 3 reduce gradient buckets as they fill). At
//! the boundary:
//!
//! 1. the gradients are reduced (stages 0 and 1: all-reduced) and readied for the optimizer
//!    (16-bit runs: widened to `f32`);
//! 2. fp16, and bf16 with `check_grad_overflow`: any inf/NaN on any rank is an overflow;
//! 3. the loss scaler is updated; on an overflow the step is skipped: no optimizer step, no
//!    learning-rate scheduler step, gradients discarded;
//! 4. otherwise the global norm is computed, the gradients are unscaled and clipped in one
//!    multiplication ([`crate::zero::clip`]), Adam steps the fp32 master with the scheduler's
//!    learning rate, the model-dtype parameters are refreshed (and gathered), and the
//!    scheduler advances.
//!
//! The step's loss is the mean over micro-steps, then over ranks (in f64), under
//! [`LossNormalisation::MicroBatchMean`]. Under [`LossNormalisation::TokensInStep`] (the
//! Hugging Face Trainer's) the rank first reads all its micro-batches of the step, the ranks sum
//! their label tokens (`num_items_in_batch`), each micro-batch's loss is its summed NLL over
//! `num_items_in_batch / W`, the backward is not divided by `G`, and the step's loss is the sum
//! over micro-steps, averaged over ranks.

use std::time::Instant;

use dsplan_planner::schedule::loss_scale::StepOutcome;

use super::LossNormalisation;
use super::checkpoints::{CheckpointOptions, RankFailure, save_from_rank};
use super::eval::eval_loss;
use super::gather::gather_masters;
use super::prepare::Prepared;
use super::{StepBackend, StepControl, check_loss};
use crate::checkpoint::{CheckpointError, SavedCheckpoint, consolidate};
use crate::comm::{ReduceOp, StepPhase};
use crate::data::{DataError, Evaluation, LabelledBatch, MicroBatchIndex};
use crate::metrics::{PhaseTimes, StepMetrics};
use crate::model::LossDivisor;
use crate::zero::{Scales, ZeroError};

/// Where a rank's micro-batches come from.
pub(crate) type Batches<'a> = &'a dyn Fn(MicroBatchIndex) -> Result<LabelledBatch, DataError>;

/// Runs optimizer step `step` on `backend`, reading micro-batch `(step, rank, k)` from
/// `batches`. The record's `tokens_per_s` and `seconds` are left at 0 for the caller.
pub(crate) fn run_step(
    backend: &mut dyn StepBackend,
    control: &mut StepControl,
    step: u64,
    batches: Batches<'_>,
) -> Result<StepMetrics, ZeroError> {
    let mut times = PhaseTimes::default();
    let grad_accum = control.grad_accum;
    let loss_scale = control.scaler.scale();
    let lr = control.lr();
    let adam = control.adam();
    let grad_scale = control.grad_scale();

    watched(backend, StepPhase::Start, |b| b.begin_step())?;
    let rank = backend.rank();
    let micro_batches = (0..grad_accum)
        .map(|micro_step| {
            batches(MicroBatchIndex {
                step,
                rank,
                micro_step,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let divisor = match control.loss {
        LossNormalisation::MicroBatchMean => LossDivisor::TargetsInBatch,
        LossNormalisation::TokensInStep => {
            let mine: usize = micro_batches.iter().map(LabelledBatch::label_tokens).sum();
            let comm = backend.comm();
            let world = comm.world_size() as f64;
            let items = comm.all_reduce_scalar(mine as f64, ReduceOp::Sum)?;
            LossDivisor::Given(items / world)
        }
    };
    let mut loss_sum = 0.0f64;
    for batch in &micro_batches {
        loss_sum += watched(backend, StepPhase::MicroStep, |b| {
            b.micro_step(batch, divisor, grad_scale, &mut times)
        })?;
    }
    let rank_loss = match control.loss {
        LossNormalisation::MicroBatchMean => loss_sum / grad_accum as f64,
        LossNormalisation::TokensInStep => loss_sum,
    };

    let started = Instant::now();
    watched(backend, StepPhase::GradientReduction, |b| {
        b.reduce_gradients(loss_scale)
    })?;
    backend.speculate_step(&adam, lr)?;
    let overflow = control.precision.checks_overflow() && backend.any_overflow()?;
    let (grad_norm, skipped) = match control.scaler.update(overflow)? {
        StepOutcome::Skipped { .. } => {
            backend.discard();
            times.reduce += started.elapsed().as_secs_f64();
            (None, true)
        }
        StepOutcome::Applied {
            grad_scale,
            unscale_by,
        } => {
            let scales = Scales {
                grad_scale,
                unscale_by,
            };
            let norm = backend.unscale_and_clip(control.clip_rule, scales, control.clip)?;
            times.reduce += started.elapsed().as_secs_f64();
            let started = Instant::now();
            watched(backend, StepPhase::OptimizerStep, |b| {
                b.optimizer_step(&adam, lr)
            })?;
            control.applied_steps += 1;
            times.step += started.elapsed().as_secs_f64();
            (Some(norm), false)
        }
    };
    let comm = backend.comm();
    let world = comm.world_size() as f64;
    let loss = comm.all_reduce_scalar(rank_loss, ReduceOp::Sum)? / world;
    Ok(StepMetrics {
        step,
        loss,
        lr,
        grad_norm,
        loss_scale,
        skipped,
        tokens_per_s: 0.0,
        times,
        seconds: 0.0,
        eval_loss: None,
    })
}

/// Runs `phase` of the step under the backend's watch (see [`StepBackend::watch`]).
fn watched<R>(
    backend: &mut dyn StepBackend,
    phase: StepPhase,
    run: impl FnOnce(&mut dyn StepBackend) -> Result<R, ZeroError>,
) -> Result<R, ZeroError> {
    let watch = backend.watch(phase);
    let result = run(backend);
    watch.finish(result)
}

/// What the loop hands back: rank 0's steps and checkpoints (empty elsewhere), and the
/// optimizer steps applied.
pub(crate) struct Driven {
    pub(crate) steps: Vec<StepMetrics>,
    pub(crate) checkpoints: Vec<SavedCheckpoint>,
    pub(crate) applied_steps: u64,
}

/// Runs the steps of `prepared` on `backend` (resumed first when `checkpoints.resume` is
/// set): rank 0 calls `observer` with every step; a loss that stops being finite ends the
/// run; the checkpoints are saved as `checkpoints.save` says.
pub(crate) fn drive(
    backend: &mut dyn StepBackend,
    prepared: &Prepared<'_>,
    checkpoints: &CheckpointOptions,
    observer: &dyn Fn(&StepMetrics),
) -> Result<Driven, RankFailure> {
    let mut control = prepared.control.clone();
    let batches = |at| prepared.batch(at);
    let id = backend.rank();
    if let Some(resume) = prepared.resume {
        let state = &resume.ranks[id];
        state
            .check_len(backend.owned_len())
            .map_err(|e| CheckpointError::Corrupt {
                path: resume.location.path(),
                field: e.field.to_string(),
                message: e.to_string(),
            })?;
        backend.import_owned(state)?;
        control.resume(resume.applied_steps, resume.scaler.clone());
    }
    let is_reporter = id == 0;
    let evaluation = prepared.spec.data.evaluation();
    let mut steps = Vec::new();
    let mut saved = Vec::new();
    let steps_total = prepared.spec.steps;
    for step in prepared.first_step..steps_total {
        let step_started = Instant::now();
        let mut metrics = run_step(backend, &mut control, step, &batches)?;
        let seconds = step_started.elapsed().as_secs_f64();
        check_loss(step, metrics.loss, metrics.skipped, &control.scaler)?;
        if let Some(evaluation) = &evaluation
            && evaluation.schedule.due(step + 1, steps_total)
        {
            metrics.eval_loss = evaluate(backend, prepared, evaluation)?;
        }
        if is_reporter {
            metrics.seconds = seconds;
            metrics.tokens_per_s = prepared.tokens_per_step as f64 / seconds.max(1e-9);
            observer(&metrics);
            steps.push(metrics);
        }
        if let Some(policy) = &checkpoints.save
            && policy.saves_after(step + 1, steps_total)
        {
            let written = save_from_rank(backend, &control, &prepared.template, policy, step + 1)?;
            saved.extend(written);
        }
    }
    Ok(Driven {
        steps,
        checkpoints: saved,
        applied_steps: control.applied_steps,
    })
}

/// The eval loss of the parameters as they stand, on rank 0 (`None` on the others): every
/// rank's fp32 master partition gathered and consolidated, as at the end of the run, then the
/// Trainer's `eval_loss` of `evaluation`'s batches (a collective: every rank calls it).
fn evaluate(
    backend: &mut dyn StepBackend,
    prepared: &Prepared<'_>,
    evaluation: &Evaluation,
) -> Result<Option<f64>, RankFailure> {
    let master = backend.export_owned()?.master;
    let masters = gather_masters(backend.comm(), &master).map_err(ZeroError::from)?;
    if backend.rank() != 0 {
        return Ok(None);
    }
    let plan = &prepared.engine_plan;
    let params = consolidate(plan, plan.stage(), &masters);
    let scored = eval_loss(
        &prepared.spec.model,
        &params,
        &evaluation.batches,
        evaluation.weighting,
    )
    .map_err(ZeroError::from)?;
    Ok(Some(scored.loss))
}
