//! The element-wise arithmetic of reductions, in one place so every collective rounds alike.
//!
//! A reduction of `W` values is `finish(((x_0 op x_1) op x_2) ... op x_{W-1})`: start from rank
//! 0's value, combine the others in rank order, then apply the final step (division by `W` for
//! [`ReduceOp::Avg`], nothing otherwise).

use super::ReduceOp;

/// Elements reduced at a time: small enough to stay in L1 while `W` sources stream through.
pub(crate) const BLOCK: usize = 2048;

/// `acc[i] = acc[i] op src[i]` (`Avg` accumulates a sum).
pub(crate) fn combine(acc: &mut [f32], src: &[f32], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => {
            for (a, &s) in acc.iter_mut().zip(src) {
                *a += s;
            }
        }
        ReduceOp::Max => {
            for (a, &s) in acc.iter_mut().zip(src) {
                *a = max_propagating_nan(*a, s);
            }
        }
    }
}

/// Applies the final step of `op` over `world` ranks.
pub(crate) fn finish(acc: &mut [f32], op: ReduceOp, world: usize) {
    if op == ReduceOp::Avg {
        let world = world as f32;
        for a in acc {
            *a /= world;
        }
    }
}

/// Reduces one `f64` per rank, given in rank order.
pub(crate) fn reduce_scalars(values: impl IntoIterator<Item = f64>, op: ReduceOp) -> f64 {
    let mut count = 0usize;
    let mut acc = 0.0;
    for value in values {
        acc = match (count, op) {
            (0, _) => value,
            (_, ReduceOp::Sum | ReduceOp::Avg) => acc + value,
            (_, ReduceOp::Max) => max_propagating_nan(acc, value),
        };
        count += 1;
    }
    if op == ReduceOp::Avg && count > 0 {
        acc / count as f64
    } else {
        acc
    }
}

/// The larger of `a` and `b`, NaN if either is NaN; `a` on ties (so `max(0.0, -0.0) = 0.0` and
/// `max(-0.0, 0.0) = -0.0`: rank order decides, like everything else here).
fn max_propagating_nan<T: PartialOrd + Copy>(a: T, b: T) -> T {
    #[allow(clippy::eq_op)] // `x != x` is the generic NaN test
    let b_is_nan = b != b;
    if b_is_nan || b > a { b } else { a }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_propagates_nan_from_either_side() {
        assert!(max_propagating_nan(f32::NAN, 1.0).is_nan());
        assert!(max_propagating_nan(1.0, f32::NAN).is_nan());
        assert_eq!(max_propagating_nan(1.0_f32, 2.0), 2.0);
        assert_eq!(max_propagating_nan(3.0_f32, 2.0), 3.0);
    }

    #[test]
    fn scalar_average_divides_the_rank_ordered_sum() {
        let values = [0.1, 0.2, 0.3];
        assert_eq!(
            reduce_scalars(values, ReduceOp::Avg),
            ((0.1 + 0.2) + 0.3) / 3.0
        );
        assert_eq!(reduce_scalars(values, ReduceOp::Max), 0.3);
    }
}
