//! The loss scale of one training run: DeepSpeed 0.19.8's fp16 dynamic loss scaler
//! (`runtime/fp16/loss_scaler.py::DynamicLossScaler`, driven by the ZeRO optimizers), the
//! hysteresis-free variant of the non-ZeRO `FP16_Optimizer`, a static fp16 scale, and the fixed
//! scale of 1 used by bf16 and fp32.
//!
//! Call [`LossScaler::update`] once per optimizer step with whether the gradients overflowed;
//! it says whether the step is taken and by what the gradients are divided.
//!
//! Facts checked against `reference/loss_scaler.json` (DeepSpeed 0.19.8):
//! - the scale doubles when `cur_iter - last_overflow_iter - 1` is a positive multiple of
//!   `loss_scale_window`, i.e. on the `window + 1`-th consecutive clean update: at update index
//!   `window` from a cold start, at `k + window + 1` after an overflow at update `k`;
//! - hysteresis `h` absorbs `h - 1` overflows before the scale halves; it is refilled only at a
//!   window boundary, or on every clean step with `consecutive_hysteresis`;
//! - an overflow at `min_loss_scale` raises ("Current loss scale already at minimum …") unless
//!   the scaler was built to clamp; every overflow skips the step.
//!
//! Read from DeepSpeed's source, not in the reference: the ZeRO optimizers (and FP16_Optimizer)
//! update the scale *before* unscaling, and unscale by the *updated* scale. On a step where the
//! scale doubles, gradients made with scale `S` are divided by `2S`: that step's update is half
//! size. [`StepOutcome::Applied`] carries both numbers so an executor can reproduce this.

/// The fp16 section's loss-scaling values, typed (DeepSpeed's `DeepSpeedFP16Config`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp16ScaleSettings {
    /// `loss_scale`: 0 means dynamic, > 0 a static scale.
    pub loss_scale: f64,
    /// `initial_scale_power`: the dynamic scale starts at 2^power.
    pub initial_scale_power: i64,
    /// `loss_scale_window`: clean steps between doublings.
    pub loss_scale_window: u64,
    /// `hysteresis` (DeepSpeed's `delayed_shift`): overflows tolerated before halving, plus one.
    pub hysteresis: i64,
    /// `consecutive_hysteresis`: refill the hysteresis on every clean step.
    pub consecutive_hysteresis: bool,
    /// `min_loss_scale`: the floor of the dynamic scale.
    pub min_loss_scale: f64,
}

impl Default for Fp16ScaleSettings {
    /// DeepSpeed 0.19.8's defaults: dynamic, 2^16, window 1000, hysteresis 2, floor 1.
    fn default() -> Self {
        Fp16ScaleSettings {
            loss_scale: 0.0,
            initial_scale_power: 16,
            loss_scale_window: 1000,
            hysteresis: 2,
            consecutive_hysteresis: false,
            min_loss_scale: 1.0,
        }
    }
}

impl Fp16ScaleSettings {
    /// Whether the scale is dynamic (`loss_scale == 0`).
    pub fn is_dynamic(&self) -> bool {
        self.loss_scale == 0.0
    }

    /// 2^`initial_scale_power` (DeepSpeed's `init_scale`).
    pub fn initial_scale(&self) -> f64 {
        let power = self.initial_scale_power.clamp(-2000, 2000) as i32;
        2.0_f64.powi(power)
    }

    /// DeepSpeedFP16Config's checks of these values (for an enabled fp16 section).
    pub fn validate(&self) -> Result<(), LossScaleError> {
        let invalid = |field: &'static str, message: &str| {
            Err(LossScaleError {
                kind: LossScaleErrorKind::InvalidSetting { field },
                message: message.to_string(),
            })
        };
        if !self.loss_scale.is_finite() {
            return invalid(
                "loss_scale",
                "fp16.loss_scale must be a finite number (not inf/-inf/nan)",
            );
        }
        if self.loss_scale < 0.0 {
            return invalid(
                "loss_scale",
                "fp16.loss_scale must be >= 0 (0 enables dynamic loss scaling)",
            );
        }
        if self.is_dynamic() {
            if self.loss_scale_window == 0 {
                return invalid(
                    "loss_scale_window",
                    "fp16.loss_scale_window must be > 0 when dynamic loss scaling is enabled (loss_scale=0)",
                );
            }
            if self.min_loss_scale.is_nan() || self.min_loss_scale <= 0.0 {
                return invalid(
                    "min_loss_scale",
                    "fp16.min_loss_scale must be > 0 when dynamic loss scaling is enabled (loss_scale=0)",
                );
            }
        }
        Ok(())
    }
}

/// Which DeepSpeed fp16 wrapper drives the dynamic scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp16Wrapper {
    /// ZeRO stages 1–3: `DynamicLossScaler`, with hysteresis and the raise at the minimum.
    Zero,
    /// No ZeRO: `FP16_Optimizer` / `FP16_UnfusedOptimizer`, which ignore hysteresis and clamp
    /// at the minimum instead of raising.
    Fp16Optimizer,
}

/// What an overflow at the minimum scale does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtMinimum {
    /// Raise and end the run (DeepSpeed's default, `raise_error_at_min_scale=True`).
    Raise,
    /// Stay at the minimum and skip the step.
    Clamp,
}

/// Whether a fixed-scale run looks at overflows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowCheck {
    /// Skip the optimizer step when gradients hold inf/NaN (fp16 static scale; bf16 with
    /// `check_grad_overflow`, on by default in 0.19.8).
    SkipStep,
    /// Apply the step regardless (fp32; bf16 with `check_grad_overflow: false`).
    Ignore,
}

/// The running state of a [`DynamicLossScaler`] (DeepSpeed's names), saved in checkpoints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicScaleState {
    /// The current scale.
    pub scale: f64,
    /// Overflows left before the scale halves.
    pub cur_hysteresis: i64,
    /// Updates so far.
    pub cur_iter: i64,
    /// The update of the last overflow (-1: none).
    pub last_overflow_iter: i64,
}

/// The state of DeepSpeed's dynamic loss scaler.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamicLossScaler {
    scale: f64,
    scale_window: u64,
    min_scale: f64,
    delayed_shift: i64,
    hysteresis: i64,
    consecutive_hysteresis: bool,
    at_minimum: AtMinimum,
    wrapper: Fp16Wrapper,
    cur_iter: i64,
    last_overflow_iter: i64,
}

impl DynamicLossScaler {
    /// `DynamicLossScaler(init_scale, scale_window, min_scale, delayed_shift,
    /// consecutive_hysteresis, raise_error_at_min_scale)`, driven by `wrapper`.
    pub fn new(
        init_scale: f64,
        scale_window: u64,
        min_scale: f64,
        delayed_shift: i64,
        consecutive_hysteresis: bool,
        at_minimum: AtMinimum,
        wrapper: Fp16Wrapper,
    ) -> Result<Self, LossScaleError> {
        if scale_window == 0 {
            return Err(LossScaleError {
                kind: LossScaleErrorKind::InvalidSetting {
                    field: "loss_scale_window",
                },
                message: "loss_scale_window must be > 0 (DeepSpeed divides by it)".to_string(),
            });
        }
        Ok(DynamicLossScaler {
            scale: init_scale,
            scale_window,
            min_scale,
            delayed_shift,
            hysteresis: delayed_shift,
            consecutive_hysteresis,
            at_minimum,
            wrapper,
            cur_iter: 0,
            last_overflow_iter: -1,
        })
    }

    /// The current scale.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Overflows left before the scale halves (DeepSpeed's `cur_hysteresis`).
    pub fn hysteresis(&self) -> i64 {
        self.hysteresis
    }

    /// What changes as the scaler runs (its settings come from the config), for checkpoints.
    pub fn state(&self) -> DynamicScaleState {
        DynamicScaleState {
            scale: self.scale,
            cur_hysteresis: self.hysteresis,
            cur_iter: self.cur_iter,
            last_overflow_iter: self.last_overflow_iter,
        }
    }

    /// Continues from `state` (taken by [`DynamicLossScaler::state`] of a scaler with the same
    /// settings), as DeepSpeed's checkpoints restore `cur_scale`, `cur_hysteresis`, `cur_iter`
    /// and `last_overflow_iter`.
    pub fn restore(&mut self, state: DynamicScaleState) {
        self.scale = state.scale;
        self.hysteresis = state.cur_hysteresis;
        self.cur_iter = state.cur_iter;
        self.last_overflow_iter = state.last_overflow_iter;
    }

    /// `update_scale(overflow)`.
    pub fn update(&mut self, overflow: bool) -> Result<StepOutcome, LossScaleError> {
        let grad_scale = self.scale;
        let halves_now = match self.wrapper {
            Fp16Wrapper::Zero => self.delayed_shift == 1 || self.hysteresis == 1,
            Fp16Wrapper::Fp16Optimizer => true,
        };
        let raises = self.wrapper == Fp16Wrapper::Zero && self.at_minimum == AtMinimum::Raise;
        let outcome = if overflow {
            let reason = if halves_now {
                if raises && self.scale == self.min_scale {
                    return Err(LossScaleError {
                        kind: LossScaleErrorKind::AtMinimumScale { scale: self.scale },
                        message: "Current loss scale already at minimum - cannot decrease scale \
                                  anymore. Exiting run."
                            .to_string(),
                    });
                }
                self.scale = python_max(self.scale / 2.0, self.min_scale);
                SkipReason::ScaleReduced
            } else {
                self.hysteresis -= 1;
                SkipReason::HysteresisAbsorbed {
                    remaining: self.hysteresis,
                }
            };
            self.last_overflow_iter = self.cur_iter;
            StepOutcome::Skipped {
                grad_scale,
                next_scale: self.scale,
                reason,
            }
        } else {
            let tracks_hysteresis = self.wrapper == Fp16Wrapper::Zero;
            if tracks_hysteresis && self.consecutive_hysteresis {
                self.hysteresis = self.delayed_shift;
            }
            let stable_interval = self.cur_iter - self.last_overflow_iter - 1;
            if stable_interval > 0 && (stable_interval as u64).is_multiple_of(self.scale_window) {
                if tracks_hysteresis && !self.consecutive_hysteresis {
                    self.hysteresis = self.delayed_shift;
                }
                self.scale *= 2.0;
            }
            StepOutcome::Applied {
                grad_scale,
                unscale_by: self.scale,
            }
        };
        self.cur_iter += 1;
        Ok(outcome)
    }
}

/// The loss scale of a run, whatever the precision.
#[derive(Debug, Clone, PartialEq)]
pub enum LossScaler {
    /// fp16 with `loss_scale: 0`.
    Dynamic(DynamicLossScaler),
    /// A scale that never changes: fp16 static, bf16 and fp32 (scale 1).
    Fixed {
        /// The scale.
        scale: f64,
        /// Whether overflowing steps are skipped.
        on_overflow: OverflowCheck,
    },
}

impl LossScaler {
    /// The scaler DeepSpeed builds for an enabled fp16 section under `wrapper`: dynamic when
    /// `loss_scale` is 0 (raising at the minimum under ZeRO), static otherwise.
    pub fn fp16(
        settings: &Fp16ScaleSettings,
        wrapper: Fp16Wrapper,
    ) -> Result<Self, LossScaleError> {
        settings.validate()?;
        if !settings.is_dynamic() {
            return Ok(LossScaler::Fixed {
                scale: settings.loss_scale,
                on_overflow: OverflowCheck::SkipStep,
            });
        }
        DynamicLossScaler::new(
            settings.initial_scale(),
            settings.loss_scale_window,
            settings.min_loss_scale,
            settings.hysteresis,
            settings.consecutive_hysteresis,
            AtMinimum::Raise,
            wrapper,
        )
        .map(LossScaler::Dynamic)
    }

    /// bf16: the scale is 1; `check_grad_overflow` decides whether overflowing steps are skipped.
    pub fn bf16(check: OverflowCheck) -> Self {
        LossScaler::Fixed {
            scale: 1.0,
            on_overflow: check,
        }
    }

    /// fp32: scale 1, overflows are not looked for.
    pub fn full_precision() -> Self {
        LossScaler::Fixed {
            scale: 1.0,
            on_overflow: OverflowCheck::Ignore,
        }
    }

    /// The scale the next backward pass multiplies the loss by.
    pub fn scale(&self) -> f64 {
        match self {
            LossScaler::Dynamic(dynamic) => dynamic.scale(),
            LossScaler::Fixed { scale, .. } => *scale,
        }
    }

    /// One optimizer step: whether it is taken and how the scale moves.
    pub fn update(&mut self, overflow: bool) -> Result<StepOutcome, LossScaleError> {
        match self {
            LossScaler::Dynamic(dynamic) => dynamic.update(overflow),
            LossScaler::Fixed { scale, on_overflow } => {
                Ok(if overflow && *on_overflow == OverflowCheck::SkipStep {
                    StepOutcome::Skipped {
                        grad_scale: *scale,
                        next_scale: *scale,
                        reason: SkipReason::FixedScale,
                    }
                } else {
                    StepOutcome::Applied {
                        grad_scale: *scale,
                        unscale_by: *scale,
                    }
                })
            }
        }
    }
}

/// What happened to one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepOutcome {
    /// The optimizer steps. The gradients, made with `grad_scale`, are divided by `unscale_by`
    /// (the scale after the update: twice `grad_scale` on a step where the scale grows).
    Applied {
        /// The scale the loss was multiplied by in this step's backward.
        grad_scale: f64,
        /// The scale the wrapper divides the gradients by, and the next step's scale.
        unscale_by: f64,
    },
    /// The step is skipped (gradients discarded, no scheduler step).
    Skipped {
        /// The scale the loss was multiplied by in this step's backward.
        grad_scale: f64,
        /// The scale of the next step.
        next_scale: f64,
        /// Why the scale did or did not move.
        reason: SkipReason,
    },
}

impl StepOutcome {
    /// Whether the optimizer (and the LR scheduler) step.
    pub fn is_applied(&self) -> bool {
        matches!(self, StepOutcome::Applied { .. })
    }

    /// The scale after this step.
    pub fn next_scale(&self) -> f64 {
        match self {
            StepOutcome::Applied { unscale_by, .. } => *unscale_by,
            StepOutcome::Skipped { next_scale, .. } => *next_scale,
        }
    }
}

/// Why a skipped step left the scale where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The scale halved (or stayed at `min_loss_scale` when clamping).
    ScaleReduced,
    /// The hysteresis absorbed the overflow; the scale is unchanged.
    HysteresisAbsorbed {
        /// Overflows left before the next one halves the scale.
        remaining: i64,
    },
    /// A static (or bf16) scale: the step is skipped, the scale never moves.
    FixedScale,
}

/// What went wrong with a loss scaler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossScaleErrorKind {
    /// An overflow at `min_loss_scale`: DeepSpeed ends the run.
    AtMinimumScale {
        /// The scale at the time.
        scale: f64,
    },
    /// An fp16 value DeepSpeedFP16Config refuses.
    InvalidSetting {
        /// The fp16 key.
        field: &'static str,
    },
}

/// A loss-scale failure, with DeepSpeed's message.
#[derive(Debug, Clone, PartialEq)]
pub struct LossScaleError {
    /// What went wrong.
    pub kind: LossScaleErrorKind,
    /// DeepSpeed's message.
    pub message: String,
}

impl std::fmt::Display for LossScaleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for LossScaleError {}

/// Python's `max(a, b)`: `a` unless `b > a`.
fn python_max(a: f64, b: f64) -> f64 {
    if b > a { b } else { a }
}

#[cfg(test)]
mod tests;
