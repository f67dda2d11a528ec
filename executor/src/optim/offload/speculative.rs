//! The speculative mode's state (SuperOffload-style: step each bucket as its gradients
//! arrive, before the global norm and the overflow check are known; undo the step when they
//! say it was wrong), kept exact by double buffering.
//!
//! The fp32 state exists twice. Every step reads the *current* side and writes the *next*
//! side, out of place, with the very arithmetic of the in-place step. When the checks pass,
//! [`SpeculativeState::commit`] makes the next side current (no copy). When they do not,
//! [`SpeculativeState::roll_back`] drops what was written: the current side was never
//! touched, so re-running the ranges with the right factor (clipping) gives the exact-order
//! step bit for bit, and running nothing skips the step (overflow).
//!
//! Bytes: 12 B per parameter of extra host memory (the second master, `exp_avg` and
//! `exp_avg_sq`), and no extra pass: a step still reads 12 B of state and writes 12 B, plus
//! the gradients and the 16-bit copy. (The writes go to lines not in cache, so the CPU's
//! write-allocate reads them first: up to 12 B per parameter of extra read traffic that the
//! in-place step does not have.) A rollback costs one more step over the ranges redone.
//! The alternatives cost more: a backup copy written during the step moves 12 B more per
//! parameter every step, and algebraic undo (DeepSpeed's `adam_rollback`) is not exact in
//! floating point.

use std::fmt;
use std::ops::Range;

use super::io::{GradsIn, ParamsOut};
use super::kernel::{Lanes, StatePtrs};
use super::pool::OffloadPool;
use super::step::{AdamSlices, OffloadError, OffloadStep, check, io_ptrs};
use crate::optim::adam::AdamConfig;

/// One copy of a partition's fp32 state, first-touched by the pool that steps it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostAdamState {
    /// fp32 master weights.
    pub master: Vec<f32>,
    /// First moments.
    pub exp_avg: Vec<f32>,
    /// Second moments.
    pub exp_avg_sq: Vec<f32>,
}

impl HostAdamState {
    /// Master weights `initial`, zero moments, each page placed for `pool`'s threads.
    pub fn new(pool: &OffloadPool, initial: &[f32]) -> HostAdamState {
        HostAdamState {
            master: pool.copied(initial),
            exp_avg: pool.zeroed(initial.len()),
            exp_avg_sq: pool.zeroed(initial.len()),
        }
    }

    /// The three slices, for [`OffloadPool::adam_step`].
    pub fn slices(&mut self) -> AdamSlices<'_> {
        AdamSlices {
            master: &mut self.master,
            exp_avg: &mut self.exp_avg,
            exp_avg_sq: &mut self.exp_avg_sq,
        }
    }

    fn ptrs(&mut self, start: usize) -> StatePtrs {
        // SAFETY: callers pass `start` within the state (checked before).
        unsafe {
            StatePtrs {
                master: self.master.as_mut_ptr().add(start),
                exp_avg: self.exp_avg.as_mut_ptr().add(start),
                exp_avg_sq: self.exp_avg_sq.as_mut_ptr().add(start),
            }
        }
    }
}

/// Why a speculative step cannot be committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UncoveredRange {
    /// The first range of the partition no step of this round wrote.
    pub missing: Range<usize>,
}

impl fmt::Display for UncoveredRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cannot commit the speculative Adam step: elements {:?} were not stepped",
            self.missing
        )
    }
}

impl std::error::Error for UncoveredRange {}

/// A partition's fp32 state, twice, for exact rollback.
#[derive(Debug)]
pub struct SpeculativeState {
    sides: [HostAdamState; 2],
    current: usize,
    written: Vec<Range<usize>>,
}

impl SpeculativeState {
    /// Master weights `initial` and zero moments on both sides.
    pub fn new(pool: &OffloadPool, initial: &[f32]) -> SpeculativeState {
        SpeculativeState {
            sides: [
                HostAdamState::new(pool, initial),
                HostAdamState::new(pool, initial),
            ],
            current: 0,
            written: Vec::new(),
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.sides[0].master.len()
    }

    /// No elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The committed state.
    pub fn current(&self) -> &HostAdamState {
        &self.sides[self.current]
    }

    /// Steps `range` from the committed state into the next one (as
    /// [`OffloadPool::adam_step_range`] would in place). Stepping a range again in the same
    /// round (after [`Self::roll_back`] or not) recomputes it from the committed state.
    pub fn step_range(
        &mut self,
        pool: &OffloadPool,
        range: Range<usize>,
        grads: GradsIn<'_>,
        mut params_out: ParamsOut<'_>,
        step: &OffloadStep,
        config: &AdamConfig,
    ) -> Result<(), OffloadError> {
        let len = self.len();
        check(len, &range, &grads, &params_out, step)?;
        let (g, o) = io_ptrs(&grads, &mut params_out);
        let (first, second) = self.sides.split_at_mut(1);
        let (src, dst) = if self.current == 0 {
            (&mut first[0], &mut second[0])
        } else {
            (&mut second[0], &mut first[0])
        };
        let lanes = Lanes {
            src: src.ptrs(range.start),
            dst: dst.ptrs(range.start),
            grads: g,
            out: o,
            len: range.len(),
        };
        // SAFETY: both sides are `len` long, `range` is within them (checked), they are two
        // allocations, and `self` stays borrowed until this returns.
        unsafe { pool.run_lanes(&lanes, range.clone(), len, step, config) };
        self.written.push(range);
        Ok(())
    }

    /// Makes the stepped state current; every element must have been stepped this round.
    pub fn commit(&mut self) -> Result<(), UncoveredRange> {
        let mut ranges = std::mem::take(&mut self.written);
        ranges.sort_by_key(|r| r.start);
        let mut covered = 0;
        for r in &ranges {
            if r.start > covered {
                break;
            }
            covered = covered.max(r.end);
        }
        if covered < self.len() {
            let next = ranges
                .iter()
                .map(|r| r.start)
                .find(|&s| s > covered)
                .unwrap_or(self.len());
            self.written = ranges;
            return Err(UncoveredRange {
                missing: covered..next,
            });
        }
        self.current = 1 - self.current;
        Ok(())
    }

    /// The next side's master weights (what a round has written so far), for tests.
    #[cfg(test)]
    pub(crate) fn sides_next_master_for_test(&self) -> Vec<f32> {
        self.sides[1 - self.current].master.clone()
    }

    /// Forgets this round's steps: the committed state is as before them.
    pub fn roll_back(&mut self) {
        self.written.clear();
    }
}
