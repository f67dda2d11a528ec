//! [`GradScaling`]: where the division by the world size happens in the gradient average, as
//! the plan's engine and every rank's options read it.

/// How the gradient average is formed (DeepSpeed §4.3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GradScaling {
    /// Divide by the world size, then sum (ZeRO's buckets; `prescale_gradients`).
    PreDivide,
    /// Multiply by `1/factor`, sum, multiply by `factor/W` (the engine's default all-reduce;
    /// `factor` is `gradient_predivide_factor`, usually 1).
    PostMultiply {
        /// `gradient_predivide_factor`.
        factor: f32,
    },
}
