//! [`LocalComm`]: `W` ranks as threads of one process, with real shared-memory collectives.
//!
//! # How a collective runs
//!
//! Each collective is a short sequence of *phases* separated by *meetings* (a barrier of all
//! ranks, see `rendezvous.rs`):
//!
//! 1. **Post.** Every rank posts the shape of its call and the address of its input (or in-place)
//!    buffer, then meets the others. From the snapshot of all postings every rank checks the same
//!    rules (equal shards, valid root, same call on every rank) and so reaches the same verdict:
//!    either all proceed or all return the same [`CommError`].
//! 2. **Reduce / copy.** Rank `r` works on its own part of the data only, reading the other
//!    ranks' buffers directly (no staging copies):
//!    * all-reduce of `n` elements: rank `r` reduces its shard `[r c, (r+1) c)` (`c = ceil(n/W)`)
//!      of all `W` buffers, in rank order, block by block, and writes it into its own buffer;
//!      after a meeting, it copies every other rank's reduced shard from that rank's buffer. Each
//!      rank reads `n` + `n (W-1)/W` elements and writes `n` (`2 (W-1)/W` of the buffer crosses
//!      between ranks, as in a ring all-reduce, and no element is reduced twice);
//!    * reduce-scatter: rank `r` reduces shard `r` of all inputs into its output;
//!    * all-gather: rank `r` copies every rank's input into its output;
//!    * broadcast: every non-root rank copies the root's buffer.
//! 3. **Meet again** before returning, so that no rank leaves (and frees or reuses its buffer)
//!    while another may still read it. Scalar reductions and barriers need no buffer and end at
//!    the posting meeting.
//!
//! # Why the shared-memory access is sound
//!
//! A rank publishes raw addresses of its buffers and, during the phases of that call, touches its
//! own buffers only through those same addresses. Within a phase the regions are disjoint: in an
//! all-reduce, rank `r` writes only shard `r` of its own buffer in phase 2 while others read only
//! their own shards of it; in phase 3 rank `r` writes the other shards of its own buffer while
//! others read only shard `r` of it. Buffers of different ranks never overlap: a `&mut [f32]`
//! held by one thread cannot alias anything held by another, and shared `&[f32]` inputs are only
//! ever read. The caller's borrow outlives every access because the call does not return before
//! the final meeting, which every other rank reaches only after its last access. A rank cannot
//! skip a meeting: the work of a phase runs under `catch_unwind`; a rank whose work panicked
//! still arrives at the meeting that ends the phase, that meeting fails on every rank (so no
//! rank starts another phase that would read the panicking rank's buffers), and only then is
//! the panic resumed. A rank that left the group (dropped its handle) is not inside a
//! collective, so it is not touching anyone's buffer.
//!
//! # Determinism
//!
//! Every element is reduced exactly once, by the rank that owns its shard, in rank order
//! `0, 1, ..., W-1`; the other ranks copy the result. All ranks therefore hold bit-identical
//! results, equal to a serial left-to-right reduction, in every run.

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::thread;

use super::calls::check_calls;
use super::error::{CallShape, CommError, Departure, OpKind};
use super::reduce::{BLOCK, combine, finish, reduce_scalars};
use super::rendezvous::{BufferAddr, Posting, Rendezvous};
use super::{Comm, CommTraffic, ReduceOp};

/// One rank of a group of in-process ranks. Create a group with [`LocalComm::group`] or run a
/// closure on every rank with [`run_ranks`].
///
/// Dropping a handle takes its rank out of the group: collectives the others are waiting in, or
/// start later, fail with [`CommError::PeerLeft`].
pub struct LocalComm {
    rank: usize,
    world: usize,
    rendezvous: Arc<Rendezvous>,
    traffic: CommTraffic,
}

impl std::fmt::Debug for LocalComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalComm")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("traffic", &self.traffic)
            .finish_non_exhaustive()
    }
}

impl LocalComm {
    /// The `world` handles of a new group, in rank order. Move each into its own thread.
    pub fn group(world: usize) -> Result<Vec<LocalComm>, CommError> {
        if world == 0 {
            return Err(CommError::EmptyGroup);
        }
        let rendezvous = Arc::new(Rendezvous::new(world));
        Ok((0..world)
            .map(|rank| LocalComm {
                rank,
                world,
                rendezvous: Arc::clone(&rendezvous),
                traffic: CommTraffic::default(),
            })
            .collect())
    }

    /// Posts this rank's call, meets the others, and checks every rank's call.
    fn open(
        &mut self,
        shape: CallShape,
        input: BufferAddr,
        scalar: f64,
    ) -> Result<Vec<Posting>, CommError> {
        let posting = Posting {
            shape,
            input,
            scalar,
        };
        let postings = self
            .rendezvous
            .meet_posting(self.rank, posting)
            .map_err(|left| left.error(shape.op))?;
        let shapes: Vec<CallShape> = postings.iter().map(|p| p.shape).collect();
        check_calls(&shapes, self.world)?;
        Ok(postings)
    }

    /// Runs this rank's `work` for the current phase, then meets the others. A panic in `work`
    /// is resumed only after the meeting, which then fails on every rank (module docs).
    fn phase(&self, op: OpKind, work: impl FnOnce()) -> Result<(), CommError> {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(work)) {
            self.rendezvous.meet_after_panic(self.rank);
            panic::resume_unwind(payload);
        }
        self.rendezvous
            .meet(self.rank)
            .map_err(|left| left.error(op))
    }

    /// The call shape of a reduction of `len` elements in place.
    fn in_place(
        op: OpKind,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        len: usize,
    ) -> CallShape {
        CallShape {
            op,
            reduce,
            root,
            input_len: len,
            output_len: len,
        }
    }
}

impl Drop for LocalComm {
    fn drop(&mut self) {
        let departure = if thread::panicking() {
            Departure::Panicked
        } else {
            Departure::Returned
        };
        self.rendezvous.depart(self.rank, departure);
    }
}

impl Comm for LocalComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce(&mut self, data: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let kind = OpKind::AllReduce;
        let len = data.len();
        // From here on this rank touches `data` only through `own` (module docs).
        let own = BufferAddr(data.as_mut_ptr());
        let shape = Self::in_place(kind, Some(op), None, len);
        let postings = self.open(shape, own, 0.0)?;
        let world = self.world;
        let shard = shard_range(len, world, self.rank);
        self.phase(kind, || {
            // SAFETY: phase 2 of an all-reduce: this rank reads `shard` of every buffer and
            // writes `shard` of its own; the others touch only their own shards (module docs).
            unsafe { reduce_into(&postings, shard.clone(), own, shard.start, op, world) }
        })?;
        self.phase(kind, || {
            for (rank, posting) in postings.iter().enumerate() {
                if rank == self.rank {
                    continue;
                }
                let theirs = shard_range(len, world, rank);
                let count = theirs.len();
                // SAFETY: phase 3 of an all-reduce: shard `rank` of rank `rank`'s buffer is
                // final and only read by anyone until the next meeting; shard `rank` of this
                // rank's buffer is written by this rank alone (module docs). Both lie within
                // `len`, the length every rank posted.
                unsafe {
                    let src = shared(posting.input, theirs.start, count);
                    exclusive(own, theirs.start, count).copy_from_slice(src);
                }
            }
        })?;
        self.traffic.record_all_reduce(len, shard.len(), world);
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let kind = OpKind::ReduceScatter;
        let shape = CallShape {
            op: kind,
            reduce: Some(op),
            root: None,
            input_len: input.len(),
            output_len: output.len(),
        };
        // Published for reading only; nobody writes through this address.
        let postings = self.open(shape, BufferAddr(input.as_ptr().cast_mut()), 0.0)?;
        let world = self.world;
        let shard_len = output.len();
        let start = self.rank * shard_len;
        let dest = BufferAddr(output.as_mut_ptr());
        self.phase(kind, || {
            // SAFETY: every input has `world * shard_len` elements (checked at the posting
            // meeting) and is only read until the next meeting; `output` is this rank's own
            // exclusive borrow, seen by no other rank.
            unsafe { reduce_into(&postings, start..start + shard_len, dest, 0, op, world) }
        })?;
        self.traffic.record_sharded(kind, shard_len, world);
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        let kind = OpKind::AllGather;
        let shape = CallShape {
            op: kind,
            reduce: None,
            root: None,
            input_len: input.len(),
            output_len: output.len(),
        };
        let postings = self.open(shape, BufferAddr(input.as_ptr().cast_mut()), 0.0)?;
        let shard_len = input.len();
        self.phase(kind, || {
            for (posting, chunk) in postings
                .iter()
                .zip(output.chunks_exact_mut(shard_len.max(1)))
            {
                // SAFETY: every rank's input has `shard_len` elements (checked at the posting
                // meeting) and is only read until the next meeting.
                chunk.copy_from_slice(unsafe { shared(posting.input, 0, shard_len) });
            }
        })?;
        self.traffic.record_sharded(kind, shard_len, self.world);
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let kind = OpKind::Broadcast;
        let len = data.len();
        let is_root = self.rank == root;
        let own = BufferAddr(data.as_mut_ptr());
        let shape = Self::in_place(kind, None, Some(root), len);
        let postings = self.open(shape, own, 0.0)?;
        self.phase(kind, || {
            if !is_root {
                // SAFETY: the root's buffer has `len` elements (checked at the posting meeting)
                // and is only read until the next meeting; this rank's buffer is read by nobody
                // else in a broadcast, and is accessed here through its published address.
                unsafe {
                    exclusive(own, 0, len).copy_from_slice(shared(postings[root].input, 0, len))
                }
            }
        })?;
        self.traffic
            .record_broadcast(len, root, self.rank, self.world);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        let shape = Self::in_place(OpKind::Barrier, None, None, 0);
        self.open(shape, BufferAddr::NONE, 0.0)?;
        self.traffic.record(OpKind::Barrier, 0);
        Ok(())
    }

    fn all_reduce_scalar(&mut self, value: f64, op: ReduceOp) -> Result<f64, CommError> {
        let kind = OpKind::AllReduceScalar;
        let shape = Self::in_place(kind, Some(op), None, 1);
        let postings = self.open(shape, BufferAddr::NONE, value)?;
        let reduced = reduce_scalars(postings.iter().map(|p| p.scalar), op);
        self.traffic.record_scalar(self.world);
        Ok(reduced)
    }

    fn traffic(&self) -> &CommTraffic {
        &self.traffic
    }
}

/// Runs `rank_main` on `world` threads, each with its own [`LocalComm`], and returns their
/// results in rank order.
///
/// Each rank runs inside a rayon pool of its own, with an equal share of the threads the global
/// pool has (at least one), as a rank that is a process would: its parallel loops then run on
/// its own workers, starting from the rank's thread, instead of queueing behind the other
/// ranks' loops in one shared pool and waking the rank's thread when done. The results do not
/// depend on the thread count (every parallel loop splits its work the same way).
///
/// If any rank panics, the others' pending collectives fail with [`CommError::PeerLeft`] instead
/// of hanging; once every thread has finished, the first panic is reported as
/// [`CommError::RankPanicked`].
pub fn run_ranks<T, F>(world: usize, rank_main: F) -> Result<Vec<T>, CommError>
where
    T: Send,
    F: Fn(LocalComm) -> T + Sync,
{
    let comms = LocalComm::group(world)?;
    let rank_main = &rank_main;
    let threads_per_rank = (rayon::current_num_threads() / world.max(1)).max(1);
    let outcomes: Vec<thread::Result<T>> = thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                scope.spawn(move || match rank_pool(comm.rank(), threads_per_rank) {
                    Some(pool) => pool.install(|| rank_main(comm)),
                    None => rank_main(comm),
                })
            })
            .collect();
        handles.into_iter().map(|handle| handle.join()).collect()
    });
    let mut results = Vec::with_capacity(world);
    let mut panicked: Vec<(usize, String)> = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        match outcome {
            Ok(value) => results.push(value),
            Err(payload) => panicked.push((rank, panic_message(payload.as_ref()))),
        }
    }
    match panicked.first() {
        None => Ok(results),
        Some((rank, message)) => Err(CommError::RankPanicked {
            rank: *rank,
            message: message.clone(),
            ranks: panicked.iter().map(|(rank, _)| *rank).collect(),
        }),
    }
}

/// The rayon pool of thread rank `rank`: `threads` workers. `None` when the system refuses the
/// threads; the rank then shares the global pool (slower, the same results).
fn rank_pool(rank: usize, threads: usize) -> Option<rayon::ThreadPool> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(move |i| format!("dsplan-rank{rank}-{i}"))
        .build()
        .ok()
}

/// The text of a panic payload, when it has one.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// The elements of shard `rank` when `len` elements are split into `world` contiguous shards of
/// `ceil(len / world)` (the last ones shorter or empty).
fn shard_range(len: usize, world: usize, rank: usize) -> std::ops::Range<usize> {
    let chunk = len.div_ceil(world);
    let start = (rank * chunk).min(len);
    start..(start + chunk).min(len)
}

/// Reduces elements `range` of every rank's input, in rank order, into `dest` starting at
/// `dest_start`, one block at a time (so `dest` may be one of the inputs).
///
/// # Safety
///
/// Every posting's input must be valid for reads of `range`, and `dest` for writes of
/// `dest_start .. dest_start + range.len()`, for the duration of the call; no other thread may
/// write any of these regions, nor read the `dest` region, meanwhile.
unsafe fn reduce_into(
    postings: &[Posting],
    range: std::ops::Range<usize>,
    dest: BufferAddr,
    dest_start: usize,
    op: ReduceOp,
    world: usize,
) {
    let mut block = [0.0f32; BLOCK];
    let mut start = range.start;
    while start < range.end {
        let count = BLOCK.min(range.end - start);
        let acc = &mut block[..count];
        for (rank, posting) in postings.iter().enumerate() {
            // SAFETY: guaranteed by the caller; the shared borrow ends with this statement,
            // before `dest` (possibly the same region) is borrowed mutably below.
            let src = unsafe { shared(posting.input, start, count) };
            if rank == 0 {
                acc.copy_from_slice(src);
            } else {
                combine(acc, src, op);
            }
        }
        finish(acc, op, world);
        // SAFETY: guaranteed by the caller; no shared borrow of this region is alive.
        unsafe { exclusive(dest, dest_start + start - range.start, count) }.copy_from_slice(acc);
        start += count;
    }
}

/// `addr[start .. start + len]` for reading.
///
/// # Safety
///
/// `addr` must point to a live buffer of at least `start + len` elements that nobody writes in
/// that range while the returned slice is used.
unsafe fn shared<'a>(addr: BufferAddr, start: usize, len: usize) -> &'a [f32] {
    // SAFETY: forwarded from the caller; `addr` is non-null even for an empty buffer (it came
    // from `as_ptr` of a slice), and `start + len` is within that buffer.
    unsafe { std::slice::from_raw_parts(addr.0.add(start), len) }
}

/// `addr[start .. start + len]` for writing.
///
/// # Safety
///
/// `addr` must point to a live buffer of at least `start + len` elements that nobody else reads
/// or writes in that range while the returned slice is used.
unsafe fn exclusive<'a>(addr: BufferAddr, start: usize, len: usize) -> &'a mut [f32] {
    // SAFETY: forwarded from the caller, as for `shared`.
    unsafe { std::slice::from_raw_parts_mut(addr.0.add(start), len) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_a_phase_fails_that_meeting_on_every_rank() {
        let outcomes = run_ranks(3, |mut comm| {
            let rank = comm.rank();
            let phase = panic::catch_unwind(AssertUnwindSafe(|| {
                comm.phase(OpKind::AllReduce, || {
                    if rank == 1 {
                        panic!("inside the phase");
                    }
                })
            }));
            // The panicking rank caught its own panic; the group still works afterwards.
            let mut data = [1.0f32; 5];
            comm.all_reduce(&mut data, ReduceOp::Sum)
                .expect("all_reduce");
            (phase.ok(), data[0])
        })
        .expect("every panic was caught");
        let left = CommError::PeerLeft {
            op: OpKind::AllReduce,
            rank: 1,
            departure: Departure::Panicked,
        };
        assert_eq!(outcomes[0], (Some(Err(left.clone())), 3.0));
        assert_eq!(outcomes[1], (None, 3.0));
        assert_eq!(outcomes[2], (Some(Err(left)), 3.0));
    }

    #[test]
    fn shards_cover_the_buffer_once() {
        for len in 0..20 {
            for world in 1..6 {
                let mut next = 0;
                for rank in 0..world {
                    let shard = shard_range(len, world, rank);
                    assert_eq!(shard.start, next.min(len));
                    next = shard.end.max(next);
                }
                assert_eq!(next, len);
            }
        }
    }
}
