//! Stage 1 (and 2): the optimizer state and fp32 master are sharded; after the step every rank
//! writes its updated partition of the flat 16-bit (or fp32) parameters and all-gathers the
//! others' partitions, one collective per piece of the plan's parameter all-gather
//! (`buckets.param_gather`; none with one rank): straight into the parameters when they are
//! `f32` and one piece is the whole partition, else through an `f32` staging pair.
//!
//! The gathered values are the ranks' own stored values (already rounded to the model dtype),
//! so every rank ends with bit-identical parameters.

use super::ZeroError;
use super::rank::ZeroRank;
use crate::metrics::{Category, Tracked};

impl ZeroRank {
    /// Rebuilds the full flat parameters from every rank's partition.
    pub(super) fn gather_flat_partitions(&mut self) -> Result<(), ZeroError> {
        let world = self.world;
        let partition = self.plan.flat().partition;
        let pieces = self.plan.param_gather().to_vec();
        let own_start = self.plan.owned(self.rank).start;
        let whole = pieces.len() == 1 && pieces[0] == (0..partition);
        if whole && let Some(full) = self.params.as_f32_mut() {
            // One all-gather straight into the f32 parameters; only this rank's own partition
            // is copied out first (it is both the input and part of the output).
            let mut input = Tracked::zeros(&self.ledger, Category::Buckets, partition);
            input.copy_from_slice(&full[own_start..own_start + partition]);
            self.comm
                .all_gather(&input, &mut full[..world * partition])?;
            return Ok(());
        }
        let largest = pieces.iter().map(|p| p.len()).max().unwrap_or(0);
        if largest == 0 {
            return Ok(());
        }
        let mut input = Tracked::zeros(&self.ledger, Category::Buckets, largest);
        let mut output = Tracked::zeros(&self.ledger, Category::Buckets, world * largest);
        for piece in pieces {
            let len = piece.len();
            if len == 0 {
                continue;
            }
            self.params.read(own_start + piece.start, &mut input[..len]);
            self.comm
                .all_gather(&input[..len], &mut output[..world * len])?;
            for (q, values) in output[..world * len].chunks_exact(len).enumerate() {
                self.params.write(q * partition + piece.start, values);
            }
        }
        Ok(())
    }
}
