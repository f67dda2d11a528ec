//! [`TrainerSchedule`]: a Hugging Face Trainer learning-rate schedule (`lr_scheduler_type`),
//! for runs whose config has no `scheduler` block: the Trainer then builds its own
//! `LambdaLR` and hands it to DeepSpeed, which steps it after every optimizer step.
//!
//! `LambdaLR` applies its factor at construction, so optimizer step `k` (0-based, counting
//! applied steps) runs at `lr * factor(k)`: one step ahead of DeepSpeed's own `WarmupLR`,
//! which no DeepSpeed scheduler block reproduces.

/// A Trainer schedule by its `lr_scheduler_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrainerSchedule {
    /// `constant_with_warmup`: `factor(k) = k / max(1, warmup_steps)` while
    /// `k < warmup_steps`, then 1.
    ConstantWithWarmup {
        /// `warmup_steps`.
        warmup_steps: u64,
    },
}

impl TrainerSchedule {
    /// The multiplier of the optimizer's `lr` at applied step `step`.
    pub fn factor(&self, step: u64) -> f64 {
        match *self {
            TrainerSchedule::ConstantWithWarmup { warmup_steps } if step < warmup_steps => {
                step as f64 / warmup_steps.max(1) as f64
            }
            TrainerSchedule::ConstantWithWarmup { .. } => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_with_warmup_starts_at_zero_and_reaches_one_at_warmup() {
        let schedule = TrainerSchedule::ConstantWithWarmup { warmup_steps: 2 };
        let factors: Vec<f64> = (0..4).map(|k| schedule.factor(k)).collect();
        assert_eq!(factors, [0.0, 0.5, 1.0, 1.0]);
    }
}
