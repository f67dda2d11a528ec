//! [`CommTraffic`]: bytes a rank has sent, per collective kind.

use super::OpKind;

/// Bytes of an `f32`, the element of every buffer collective.
const F32_BYTES: u64 = 4;
/// Bytes of the `f64` of a scalar all-reduce.
const F64_BYTES: u64 = 8;

/// Calls and bytes of one collective kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpTraffic {
    /// Completed calls.
    pub calls: u64,
    /// Bytes of this rank's buffers that went to other ranks.
    pub bytes_sent: u64,
}

/// Per-kind traffic of one rank, counted over completed collectives only.
///
/// "Sent" means the bytes of this rank's buffers that other ranks read (shared memory) or that
/// left over the wire (NCCL). For the local implementation, and for the bandwidth-optimal
/// algorithms, with `W` ranks and `n` elements per rank of 4 bytes each:
///
/// | operation | bytes sent per rank |
/// |---|---|
/// | all-reduce of `n` | `((n - s) + (W-1) s) * 4`, `s` = this rank's reduced shard; `2 (W-1) n / W * 4` when `W` divides `n` |
/// | reduce-scatter of `W n` into `n` | `(W-1) n * 4` |
/// | all-gather of `n` into `W n` | `(W-1) n * 4` |
/// | broadcast of `n` | `(W-1) n * 4` for the root, 0 for the others |
/// | scalar all-reduce | `(W-1) * 8` |
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommTraffic {
    /// [`super::Comm::all_reduce`].
    pub all_reduce: OpTraffic,
    /// [`super::Comm::reduce_scatter`].
    pub reduce_scatter: OpTraffic,
    /// [`super::Comm::all_gather`].
    pub all_gather: OpTraffic,
    /// [`super::Comm::broadcast`].
    pub broadcast: OpTraffic,
    /// [`super::Comm::barrier`] (never sends bytes).
    pub barrier: OpTraffic,
    /// [`super::Comm::all_reduce_scalar`].
    pub all_reduce_scalar: OpTraffic,
}

impl CommTraffic {
    /// The counters of one kind.
    pub fn of(&self, op: OpKind) -> OpTraffic {
        match op {
            OpKind::AllReduce => self.all_reduce,
            OpKind::ReduceScatter => self.reduce_scatter,
            OpKind::AllGather => self.all_gather,
            OpKind::Broadcast => self.broadcast,
            OpKind::Barrier => self.barrier,
            OpKind::AllReduceScalar => self.all_reduce_scalar,
        }
    }

    /// Bytes sent over all kinds.
    pub fn total_bytes_sent(&self) -> u64 {
        [
            self.all_reduce,
            self.reduce_scatter,
            self.all_gather,
            self.broadcast,
            self.barrier,
            self.all_reduce_scalar,
        ]
        .iter()
        .map(|t| t.bytes_sent)
        .sum()
    }

    /// Records one completed call.
    pub fn record(&mut self, op: OpKind, bytes_sent: u64) {
        let entry = match op {
            OpKind::AllReduce => &mut self.all_reduce,
            OpKind::ReduceScatter => &mut self.reduce_scatter,
            OpKind::AllGather => &mut self.all_gather,
            OpKind::Broadcast => &mut self.broadcast,
            OpKind::Barrier => &mut self.barrier,
            OpKind::AllReduceScalar => &mut self.all_reduce_scalar,
        };
        entry.calls += 1;
        entry.bytes_sent += bytes_sent;
    }

    /// An all-reduce of `len` `f32`s in which this rank reduced `own_shard` of them.
    pub fn record_all_reduce(&mut self, len: usize, own_shard: usize, world: usize) {
        let (len, own, world) = (len as u64, own_shard as u64, world as u64);
        let sent = (len - own) + (world - 1) * own;
        self.record(OpKind::AllReduce, sent * F32_BYTES);
    }

    /// A reduce-scatter or an all-gather whose per-rank shard is `shard_len` `f32`s.
    pub fn record_sharded(&mut self, op: OpKind, shard_len: usize, world: usize) {
        let sent = (world as u64 - 1) * shard_len as u64;
        self.record(op, sent * F32_BYTES);
    }

    /// A broadcast of `len` `f32`s from `root`, as `rank` sees it (only the root sends).
    pub fn record_broadcast(&mut self, len: usize, root: usize, rank: usize, world: usize) {
        let sent = if rank == root {
            (world as u64 - 1) * len as u64
        } else {
            0
        };
        self.record(OpKind::Broadcast, sent * F32_BYTES);
    }

    /// A scalar (`f64`) all-reduce.
    pub fn record_scalar(&mut self, world: usize) {
        self.record(OpKind::AllReduceScalar, (world as u64 - 1) * F64_BYTES);
    }
}
