//! The rules every rank's call of a collective must keep, checked from all ranks' calls so
//! that every rank reaches the same verdict (shared by [`super::LocalComm`] and the MPI
//! backend).

use super::error::{CallShape, CommError, OpKind};

/// Checks every rank's call, in rank order, so that all ranks reach the same verdict.
pub(crate) fn check_calls(shapes: &[CallShape], world: usize) -> Result<(), CommError> {
    for (rank, &shape) in shapes.iter().enumerate() {
        let uneven = match shape.op {
            OpKind::ReduceScatter => shape.output_len.checked_mul(world) != Some(shape.input_len),
            OpKind::AllGather => shape.input_len.checked_mul(world) != Some(shape.output_len),
            _ => false,
        };
        if uneven {
            return Err(CommError::UnevenShards {
                op: shape.op,
                rank,
                input_len: shape.input_len,
                output_len: shape.output_len,
                world,
            });
        }
        if let Some(root) = shape.root
            && root >= world
        {
            return Err(CommError::RootOutOfRange { rank, root, world });
        }
    }
    let Some(&expected) = shapes.first() else {
        return Ok(());
    };
    for (rank, &found) in shapes.iter().enumerate().skip(1) {
        if found != expected {
            return Err(CommError::Disagreement {
                expected,
                rank,
                found,
            });
        }
    }
    Ok(())
}
