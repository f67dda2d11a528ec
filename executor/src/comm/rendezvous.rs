//! The meeting point of in-process ranks: a reusable barrier that carries what each rank is about
//! to do, and that notices ranks which have left.
//!
//! Every collective of [`super::LocalComm`] is a sequence of *meetings*. The first one posts a
//! [`Posting`] (the call's shape and buffer addresses); when the last rank arrives, the meeting is
//! *released* and a snapshot of all postings is taken, so that every rank reads the same table
//! even if a fast rank posts its next call before a slow one has woken up.
//!
//! A rank leaves by dropping its handle ([`Rendezvous::depart`]). A departed rank counts as
//! arrived at every later meeting, so nobody waits for it forever, and every meeting released
//! after the departure reports it. A rank whose work panicked inside a collective still arrives
//! at the meeting that ends the phase ([`Rendezvous::meet_after_panic`]), so that the others
//! have finished with its buffers, and that meeting fails for everyone. The outcome of a meeting
//! is decided once, by the releasing thread, so all ranks see the same outcome.
//!
//! Condition variables, not spinning: the ranks usually share fewer cores than there are ranks.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

use super::error::{CallShape, CommError, Departure, OpKind};

/// The address of a rank's buffer, published to the other ranks of a collective.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BufferAddr(pub(crate) *mut f32);

// SAFETY: a `BufferAddr` is a plain address; moving or sharing it between threads does nothing by
// itself. Every dereference happens in `local.rs`, inside the phase discipline documented there
// (the owner keeps the buffer alive and un-aliased until the meeting that ends the phase).
unsafe impl Send for BufferAddr {}
// SAFETY: as for `Send`: sharing the address is harmless, dereferencing it is governed elsewhere.
unsafe impl Sync for BufferAddr {}

impl BufferAddr {
    /// An address that is never dereferenced (for calls without a buffer).
    pub(crate) const NONE: BufferAddr = BufferAddr(std::ptr::null_mut());
}

/// What one rank posts when it enters a collective.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Posting {
    /// The call, compared across ranks.
    pub(crate) shape: CallShape,
    /// The input buffer (or the in-place buffer).
    pub(crate) input: BufferAddr,
    /// The value of a scalar reduction.
    pub(crate) scalar: f64,
}

impl Posting {
    const EMPTY: Posting = Posting {
        shape: CallShape {
            op: OpKind::Barrier,
            reduce: None,
            root: None,
            input_len: 0,
            output_len: 0,
        },
        input: BufferAddr::NONE,
        scalar: 0.0,
    };
}

/// A rank that had left when a meeting was released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeftRank {
    /// The lowest departed rank.
    pub(crate) rank: usize,
    /// How it left.
    pub(crate) departure: Departure,
}

impl LeftRank {
    /// The error a collective of kind `op` reports for this departure.
    pub(crate) fn error(self, op: OpKind) -> CommError {
        CommError::PeerLeft {
            op,
            rank: self.rank,
            departure: self.departure,
        }
    }
}

struct State {
    /// Bumped at every release; waiters wait for it to change.
    generation: u64,
    /// Ranks that arrived at the current meeting.
    arrived: usize,
    /// What each rank posted last.
    postings: Vec<Posting>,
    /// `postings` as they were at the last release.
    snapshot: Vec<Posting>,
    /// Ranks that have left, and how.
    departed: Vec<Option<Departure>>,
    /// The lowest rank that arrived at the current meeting after a panic in its work.
    panicked_here: Option<usize>,
    /// How many entries of `departed` are set.
    departed_count: usize,
    /// The outcome of the last release.
    last_left: Option<LeftRank>,
}

/// The shared state of a group of in-process ranks.
pub(crate) struct Rendezvous {
    world: usize,
    state: Mutex<State>,
    released: Condvar,
}

impl Rendezvous {
    /// A meeting point for `world` ranks.
    pub(crate) fn new(world: usize) -> Self {
        Rendezvous {
            world,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                postings: vec![Posting::EMPTY; world],
                snapshot: vec![Posting::EMPTY; world],
                departed: vec![None; world],
                panicked_here: None,
                departed_count: 0,
                last_left: None,
            }),
            released: Condvar::new(),
        }
    }

    /// Posts `posting` for `rank`, waits for the meeting and returns every rank's posting (in
    /// rank order), or the departed rank that makes the meeting fail.
    pub(crate) fn meet_posting(
        &self,
        rank: usize,
        posting: Posting,
    ) -> Result<Vec<Posting>, LeftRank> {
        let state = self.arrive(rank, Some(posting), false);
        match state.last_left {
            None => Ok(state.snapshot.clone()),
            Some(left) => Err(left),
        }
    }

    /// Waits until every rank has arrived (or left).
    pub(crate) fn meet(&self, rank: usize) -> Result<(), LeftRank> {
        let state = self.arrive(rank, None, false);
        match state.last_left {
            None => Ok(()),
            Some(left) => Err(left),
        }
    }

    /// As [`Rendezvous::meet`], for a rank whose work in this phase panicked: it waits like the
    /// others (they may still be reading its buffers), and the meeting fails for every rank.
    pub(crate) fn meet_after_panic(&self, rank: usize) {
        drop(self.arrive(rank, None, true));
    }

    /// Marks `rank` as gone; releases the current meeting if it was the last one missing.
    pub(crate) fn depart(&self, rank: usize, departure: Departure) {
        let mut state = self.lock();
        if state.departed[rank].is_none() {
            state.departed[rank] = Some(departure);
            state.departed_count += 1;
            if state.arrived > 0 && state.arrived + state.departed_count >= self.world {
                self.release(&mut state);
            }
        }
    }

    /// Arrives at the current meeting and returns the state once it has been released.
    fn arrive(
        &self,
        rank: usize,
        posting: Option<Posting>,
        panicked: bool,
    ) -> MutexGuard<'_, State> {
        let mut state = self.lock();
        if let Some(posting) = posting {
            state.postings[rank] = posting;
        }
        if panicked {
            state.panicked_here = Some(state.panicked_here.map_or(rank, |first| first.min(rank)));
        }
        state.arrived += 1;
        if state.arrived + state.departed_count >= self.world {
            self.release(&mut state);
            return state;
        }
        let generation = state.generation;
        while state.generation == generation {
            state = self
                .released
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // No later release can happen before this rank arrives again, so `snapshot` and
        // `last_left` still describe the meeting it waited for.
        state
    }

    fn release(&self, state: &mut State) {
        let State {
            postings, snapshot, ..
        } = state;
        snapshot.copy_from_slice(postings);
        let departed = state
            .departed
            .iter()
            .enumerate()
            .find_map(|(rank, departure)| departure.map(|departure| LeftRank { rank, departure }));
        let panicked = state.panicked_here.take().map(|rank| LeftRank {
            rank,
            departure: Departure::Panicked,
        });
        state.last_left = departed.or(panicked);
        state.arrived = 0;
        state.generation = state.generation.wrapping_add(1);
        self.released.notify_all();
    }

    /// The state; a poisoned lock is still usable (no code panics while holding it, and the
    /// state is consistent between statements).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
