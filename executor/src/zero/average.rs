//! Forming the gradient average across ranks, as DeepSpeed does (facts §4.3): the division by
//! the world size happens before the sum (ZeRO's buckets, `prescale_gradients`) or after it
//! (the engine's default all-reduce, with `gradient_predivide_factor`), and every
//! intermediate is rounded to the communication dtype, as a 16-bit reduction would round it.

use super::ZeroError;
use super::options::RankOptions;
use super::scaling::GradScaling;
use crate::comm::{Comm, ReduceOp};

/// The scaling before a sum of `values` over `world` ranks, rounded to the communication dtype.
pub(super) fn scale_before_sum(options: &RankOptions, world: usize, values: &mut [f32]) {
    match options.scaling {
        GradScaling::PreDivide => {
            let world = world as f32;
            for x in values.iter_mut() {
                *x /= world;
            }
        }
        GradScaling::PostMultiply { factor } => {
            if factor != 1.0 {
                let inverse = 1.0 / factor;
                for x in values.iter_mut() {
                    *x *= inverse;
                }
            }
        }
    }
    options.comm_dtype.round_slice(values);
}

/// The scaling after a sum over `world` ranks, rounded to the communication dtype.
pub(super) fn scale_after_sum(options: &RankOptions, world: usize, values: &mut [f32]) {
    options.comm_dtype.round_slice(values);
    if let GradScaling::PostMultiply { factor } = options.scaling
        && factor != world as f32
    {
        let multiplier = factor / world as f32;
        for x in values.iter_mut() {
            *x *= multiplier;
        }
        options.comm_dtype.round_slice(values);
    }
}

/// Scales, sums across the ranks of `comm` and rescales `values`.
pub(super) fn average(
    comm: &mut dyn Comm,
    options: &RankOptions,
    values: &mut [f32],
) -> Result<(), ZeroError> {
    let world = comm.world_size();
    scale_before_sum(options, world, values);
    comm.all_reduce(values, ReduceOp::Sum)?;
    scale_after_sum(options, world, values);
    Ok(())
}
