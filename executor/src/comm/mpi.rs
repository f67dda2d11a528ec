//! [`MpiComm`]: one rank per process, collectives over MPI (feature `mpi`).
//!
//! Started by `mpirun` (or any MPI process manager), every process is one rank of
//! `MPI_COMM_WORLD`. The module keeps the [`Comm`] contract of [`super`]:
//!
//! * **Same verdict everywhere.** Each collective first all-gathers every rank's call shape
//!   (operation, reduce op, root, lengths; five integers) and checks them with the same rules as
//!   [`super::LocalComm`], so a rank that disagrees or passes uneven shards makes the call fail
//!   on every rank with the same [`CommError`] before any data moves.
//! * **Rank-ordered reductions, bit for bit equal to threads.** `MPI_Allreduce` and
//!   `MPI_Reduce_scatter` combine ranks in an order the library chooses (Open MPI's algorithms
//!   depend on the message size and the world size, and a ring starts each element at a
//!   different rank), so their float sums may differ from a left-to-right sum in the last bit.
//!   They are not used. Reductions move data instead: an all-reduce of `n` elements is an
//!   `MPI_Alltoall` that gives rank `r` every rank's shard `r` (`ceil(n/W)` elements, the buffer
//!   zero-padded to `W` shards), a local reduction of those shards in rank order
//!   `((x_0 op x_1) op x_2) ...` with the same arithmetic as threads (`reduce.rs`), then an
//!   `MPI_Allgather` of the reduced shards. A reduce-scatter is the all-to-all and the local
//!   reduction; a scalar reduction all-gathers the `W` values and reduces them in rank order.
//!   Every element is thus reduced once, by one rank, in rank order: processes equal threads
//!   bit for bit, at any world size. The volume is that of a ring all-reduce (each rank sends
//!   `(W-1)/W` of the buffer twice).
//! * **A rank that leaves.** Under `mpirun` a process that dies ends the job: Open MPI notices
//!   the lost process, kills every other one and reports `process rank R ... exited on signal
//!   N`. A rank whose run fails calls [`MpiJob::abort`], which ends every rank at once (`MPI_ABORT
//!   was invoked on rank R`), instead of leaving the others waiting in a collective.
//! * **A stuck collective times out.** A watchdog thread (no MPI calls of its own) watches each
//!   blocking collective; one that takes longer than the timeout is reported to the
//!   `on_timeout` callback as [`CommError::TimedOut`] naming the operation and the rank. MPI
//!   cannot cancel a collective in flight, so the callback must end the process (the CLI prints
//!   the error and exits non-zero; `mpirun` then takes the job down).

use std::rc::Rc;
use std::time::Duration;

use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator, CommunicatorCollectives, Root};

use super::calls::check_calls;
use super::error::{CallShape, CommError, OpKind};
use super::reduce::{combine, finish, reduce_scalars};
use super::watchdog::{Sentry, Watchdog};
use super::{Comm, CommTraffic, ReduceOp};

/// What a process does when a collective times out; it must not return normally into MPI.
pub type OnTimeout = Box<dyn Fn(CommError) + Send + Sync>;

/// MPI, initialised for this process. Dropping the last handle (this and every [`MpiComm`] made
/// from it) finalises MPI.
pub struct MpiJob {
    universe: Rc<Universe>,
}

impl std::fmt::Debug for MpiJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiJob").finish_non_exhaustive()
    }
}

impl MpiJob {
    /// Initialises MPI (`MPI_Init_thread`, only the main thread communicates). An error if MPI
    /// was initialised before in this process.
    pub fn init() -> Result<Self, CommError> {
        let (universe, _) =
            mpi::initialize_with_threading(mpi::Threading::Funneled).ok_or(CommError::Backend {
                op: OpKind::Barrier.into(),
                rank: 0,
                backend: "MPI",
                message: "MPI is already initialised in this process".into(),
            })?;
        Ok(MpiJob {
            universe: Rc::new(universe),
        })
    }

    /// This process's rank in `MPI_COMM_WORLD`.
    pub fn rank(&self) -> usize {
        self.universe.world().rank() as usize
    }

    /// The number of processes in `MPI_COMM_WORLD`.
    pub fn world_size(&self) -> usize {
        self.universe.world().size() as usize
    }

    /// The group of every process, whose blocking collectives time out after `timeout`
    /// (`on_timeout` is called from the watchdog thread).
    pub fn comm(&self, timeout: Duration, on_timeout: OnTimeout) -> MpiComm {
        let world = self.universe.world();
        let rank = world.rank() as usize;
        MpiComm {
            rank,
            size: world.size() as usize,
            world,
            _universe: Rc::clone(&self.universe),
            traffic: CommTraffic::default(),
            watchdog: Watchdog::start(Sentry {
                rank,
                timeout,
                probe: None,
                poll: timeout,
                alarm: Box::new(move |error| on_timeout(error.clone())),
            }),
            send: Vec::new(),
            recv: Vec::new(),
        }
    }

    /// Ends every process of the job with `code` (`MPI_Abort`): what a rank does when it fails,
    /// so that no other rank waits for it.
    pub fn abort(&self, code: i32) -> ! {
        self.universe.world().abort(code)
    }
}

/// One rank of an MPI job. See the [module documentation](self).
pub struct MpiComm {
    rank: usize,
    size: usize,
    world: SimpleCommunicator,
    _universe: Rc<Universe>,
    traffic: CommTraffic,
    watchdog: Watchdog,
    /// Staging buffers of the reductions, kept between calls.
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl std::fmt::Debug for MpiComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MpiComm")
            .field("rank", &self.rank)
            .field("world", &self.size)
            .field("traffic", &self.traffic)
            .finish_non_exhaustive()
    }
}

impl MpiComm {
    /// Gathers every rank's call and checks them all (module docs).
    fn agree(&mut self, shape: CallShape) -> Result<(), CommError> {
        let mine = encode(shape);
        let mut all = vec![0u64; 5 * self.size];
        self.guarded(shape.op, |world| {
            world.all_gather_into(&mine[..], &mut all[..])
        });
        let shapes: Vec<CallShape> = all.chunks_exact(5).map(decode).collect();
        check_calls(&shapes, self.size)
    }

    /// Runs one blocking MPI call under the watchdog.
    fn guarded<T>(&self, op: OpKind, call: impl FnOnce(&SimpleCommunicator) -> T) -> T {
        let ticket = self.watchdog.enter(op.into());
        let out = call(&self.world);
        // The alarm ends the process, so a report never reaches this rank.
        let _ = self.watchdog.leave(ticket);
        out
    }

    /// Rank-ordered reduction of the `W` shards of `len` elements in `self.recv` into `out`.
    fn reduce_received(&self, out: &mut [f32], op: ReduceOp) {
        let len = out.len();
        for (rank, shard) in self
            .recv
            .chunks_exact(len.max(1))
            .enumerate()
            .take(self.size)
        {
            if rank == 0 {
                out.copy_from_slice(&shard[..len]);
            } else {
                combine(out, &shard[..len], op);
            }
        }
        finish(out, op, self.size);
    }

    fn shape(
        op: OpKind,
        reduce: Option<ReduceOp>,
        root: Option<usize>,
        input_len: usize,
        output_len: usize,
    ) -> CallShape {
        CallShape {
            op,
            reduce,
            root,
            input_len,
            output_len,
        }
    }
}

impl Comm for MpiComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.size
    }

    fn all_reduce(&mut self, data: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        let kind = OpKind::AllReduce;
        let len = data.len();
        self.agree(Self::shape(kind, Some(op), None, len, len))?;
        let world = self.size;
        let chunk = len.div_ceil(world);
        let mut send = std::mem::take(&mut self.send);
        let mut recv = std::mem::take(&mut self.recv);
        send.clear();
        send.extend_from_slice(data);
        send.resize(chunk * world, 0.0);
        recv.resize(chunk * world, 0.0);
        self.guarded(kind, |w| w.all_to_all_into(&send[..], &mut recv[..]));
        self.recv = recv;
        let mut own = vec![0.0f32; chunk];
        self.reduce_received(&mut own, op);
        self.guarded(kind, |w| w.all_gather_into(&own[..], &mut send[..]));
        data.copy_from_slice(&send[..len]);
        self.send = send;
        let own_shard = chunk.min(len.saturating_sub(self.rank * chunk));
        self.traffic.record_all_reduce(len, own_shard, world);
        Ok(())
    }

    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let kind = OpKind::ReduceScatter;
        self.agree(Self::shape(kind, Some(op), None, input.len(), output.len()))?;
        let mut recv = std::mem::take(&mut self.recv);
        recv.resize(input.len(), 0.0);
        self.guarded(kind, |w| w.all_to_all_into(input, &mut recv[..]));
        self.recv = recv;
        self.reduce_received(output, op);
        self.traffic.record_sharded(kind, output.len(), self.size);
        Ok(())
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        let kind = OpKind::AllGather;
        self.agree(Self::shape(kind, None, None, input.len(), output.len()))?;
        self.guarded(kind, |w| w.all_gather_into(input, output));
        self.traffic.record_sharded(kind, input.len(), self.size);
        Ok(())
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let kind = OpKind::Broadcast;
        let len = data.len();
        self.agree(Self::shape(kind, None, Some(root), len, len))?;
        self.guarded(kind, |w| {
            w.process_at_rank(root as mpi::Rank).broadcast_into(data)
        });
        self.traffic
            .record_broadcast(len, root, self.rank, self.size);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        // The shape exchange is itself a meeting of every rank.
        self.agree(Self::shape(OpKind::Barrier, None, None, 0, 0))?;
        self.traffic.record(OpKind::Barrier, 0);
        Ok(())
    }

    fn all_reduce_scalar(&mut self, value: f64, op: ReduceOp) -> Result<f64, CommError> {
        let kind = OpKind::AllReduceScalar;
        self.agree(Self::shape(kind, Some(op), None, 1, 1))?;
        let mut all = vec![0.0f64; self.size];
        self.guarded(kind, |w| w.all_gather_into(&value, &mut all[..]));
        self.traffic.record_scalar(self.size);
        Ok(reduce_scalars(all, op))
    }

    fn traffic(&self) -> &CommTraffic {
        &self.traffic
    }
}

/// A call shape as five integers (for the all-gather of every rank's call).
fn encode(shape: CallShape) -> [u64; 5] {
    let op = OP_KINDS.iter().position(|&k| k == shape.op).unwrap_or(0) as u64;
    let reduce = match shape.reduce {
        None => 0,
        Some(ReduceOp::Sum) => 1,
        Some(ReduceOp::Avg) => 2,
        Some(ReduceOp::Max) => 3,
    };
    let root = shape.root.map_or(u64::MAX, |r| r as u64);
    [
        op,
        reduce,
        root,
        shape.input_len as u64,
        shape.output_len as u64,
    ]
}

/// The inverse of [`encode`].
fn decode(code: &[u64]) -> CallShape {
    CallShape {
        op: OP_KINDS[(code[0] as usize).min(OP_KINDS.len() - 1)],
        reduce: match code[1] {
            1 => Some(ReduceOp::Sum),
            2 => Some(ReduceOp::Avg),
            3 => Some(ReduceOp::Max),
            _ => None,
        },
        root: (code[2] != u64::MAX).then_some(code[2] as usize),
        input_len: code[3] as usize,
        output_len: code[4] as usize,
    }
}

const OP_KINDS: [OpKind; 6] = [
    OpKind::AllReduce,
    OpKind::ReduceScatter,
    OpKind::AllGather,
    OpKind::Broadcast,
    OpKind::Barrier,
    OpKind::AllReduceScalar,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_shapes_survive_the_exchange() {
        let shape = CallShape {
            op: OpKind::Broadcast,
            reduce: None,
            root: Some(3),
            input_len: 17,
            output_len: 17,
        };
        assert_eq!(decode(&encode(shape)), shape);
        let shape = CallShape {
            op: OpKind::ReduceScatter,
            reduce: Some(ReduceOp::Avg),
            root: None,
            input_len: 8,
            output_len: 2,
        };
        assert_eq!(decode(&encode(shape)), shape);
    }
}
