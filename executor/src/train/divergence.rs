//! [`check_loss`]: a run whose loss is no longer finite stops at that step instead of
//! training on NaN weights to the end and exiting 0.
//!
//! DeepSpeed stops an fp16 run whose dynamic loss scaler overflows at its minimum scale
//! ("Current loss scale already at minimum - cannot decrease scale anymore. Exiting run.",
//! raised by the scaler under ZeRO; the planner's `LossScaler` does the same). Where no scaler
//! can absorb the overflow, dsplan stops at the first non-finite loss:
//!
//! * a step applied with a non-finite loss (fp32, bf16: no overflow check skips it), whose
//!   update has made the weights non-finite, so every later step is NaN;
//! * a step skipped by a scaler that never changes (fp16 with a static `loss_scale`), which
//!   will skip every later step for the same reason.
//!
//! A dynamic scaler's skipped steps are left to it: halving the scale is how it recovers.

use std::fmt;

use dsplan_planner::schedule::loss_scale::LossScaler;

/// A run stopped because its loss is not finite.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diverged {
    /// The step (0-based, as the metrics number it).
    pub step: u64,
    /// The loss.
    pub loss: f64,
    /// Whether the step's update was applied.
    pub applied: bool,
}

impl fmt::Display for Diverged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = if self.applied {
            "its update was applied, so the weights are no longer finite"
        } else {
            "the loss scale is fixed, so every later step would be skipped too"
        };
        write!(
            f,
            "step {}: the loss is {} and {why}; stopped. Lower the learning rate, check the \
             data and the initial weights, or use fp16 with a dynamic loss scale \
             (`fp16.loss_scale: 0`)",
            self.step, self.loss
        )
    }
}

/// `Err` when step `step`, of loss `loss`, `skipped` or not by `scaler`, must stop the run.
pub fn check_loss(
    step: u64,
    loss: f64,
    skipped: bool,
    scaler: &LossScaler,
) -> Result<(), Diverged> {
    if loss.is_finite() {
        return Ok(());
    }
    let stuck = matches!(scaler, LossScaler::Fixed { .. });
    if !skipped || stuck {
        return Err(Diverged {
            step,
            loss,
            applied: !skipped,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_loss_stops_unless_a_dynamic_scaler_skipped_it() {
        let fixed = LossScaler::full_precision();
        assert!(check_loss(3, 2.5, false, &fixed).is_ok());
        let error = check_loss(3, f64::NAN, false, &fixed).expect_err("applied NaN");
        assert_eq!(error.step, 3);
        assert!(
            error.to_string().starts_with("step 3: the loss is NaN"),
            "{error}"
        );
        assert!(check_loss(4, f64::INFINITY, true, &fixed).is_err());
    }
}
