//! Stage 1 (and 2): the optimizer state and fp32 master are sharded; after the step every rank
//! writes its updated partition of the flat 16-bit (or fp32) parameters and all-gathers the
//! others' partitions, in pieces of at most `allgather_bucket_size` elements in all (straight
//! into the parameters when they are `f32` and one piece holds a whole partition).
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
        if partition == 0 {
            return Ok(());
        }
        let chunk = (self.options.allgather_bucket_size / world).clamp(1, partition);
        let own_start = self.plan.flat().range(self.rank).start;
        if chunk == partition
            && let Some(full) = self.params.as_f32_mut()
        {
            // One all-gather straight into the f32 parameters; only this rank's own partition
            // is copied out first (it is both the input and part of the output).
            let mut input = Tracked::zeros(&self.ledger, Category::Buckets, partition);
            input.copy_from_slice(&full[own_start..own_start + partition]);
            self.comm
                .all_gather(&input, &mut full[..world * partition])?;
            return Ok(());
        }
        let mut input = Tracked::zeros(&self.ledger, Category::Buckets, chunk);
        let mut output = Tracked::zeros(&self.ledger, Category::Buckets, world * chunk);
        let mut start = 0;
        while start < partition {
            let len = chunk.min(partition - start);
            self.params.read(own_start + start, &mut input[..len]);
            self.comm
                .all_gather(&input[..len], &mut output[..world * len])?;
            for (q, piece) in output[..world * len].chunks_exact(len).enumerate() {
                self.params.write(q * partition + start, piece);
            }
            start += len;
        }
        Ok(())
    }
}
