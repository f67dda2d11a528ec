//! [`StepMetrics`]: one optimizer step as the run reports it, whichever backend ran it (the
//! one step record of a run), and where its time went ([`PhaseTimes`]).

use serde::Serialize;

/// Seconds spent in each phase of a step, on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PhaseTimes {
    /// Forward passes (including stage 3's gathers).
    pub forward: f64,
    /// Backward passes (including stage 2/3's bucket reductions).
    pub backward: f64,
    /// Boundary reduction, overflow check, norm and clipping.
    pub reduce: f64,
    /// Optimizer step and parameter refresh/gather.
    pub step: f64,
}

/// One optimizer step: the keys of a `--metrics` line, plus rank 0's phase times.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepMetrics {
    /// The step, from 0.
    pub step: u64,
    /// The loss, averaged over micro-steps and ranks.
    pub loss: f64,
    /// The learning rate the step used.
    pub lr: f64,
    /// The pre-clip global gradient norm; `null` when the step was skipped.
    pub grad_norm: Option<f64>,
    /// The loss scale of the step's backward (1 unless fp16).
    pub loss_scale: f64,
    /// Whether the step was skipped (fp16 overflow).
    pub skipped: bool,
    /// Tokens of the global batch (predicted positions) per second of this step.
    pub tokens_per_s: f64,
    /// Where rank 0's time went (for `wall_clock_breakdown`); not written to `--metrics`.
    #[serde(skip)]
    pub times: PhaseTimes,
    /// Wall-clock seconds of the whole step on rank 0.
    #[serde(skip)]
    pub seconds: f64,
    /// The eval loss after the step, when one was due (written to `--metrics` as a line of
    /// its own).
    #[serde(skip)]
    pub eval_loss: Option<f64>,
}
