//! NCCL collectives for one process per GPU, set up from the launcher's environment.
//!
//! Rank 0 creates NCCL's unique id and hands it to the others, through the TCP rendezvous on
//! `MASTER_ADDR:MASTER_PORT` ([`super::rendezvous`], [`NcclComm::from_env`]) or through a
//! broadcast of the job's host `Comm`, MPI's under `mpirun` ([`super::id_broadcast`],
//! [`NcclComm::from_host_comm`]); every rank then joins the communicator with
//! `ncclCommInitRank`. [`NcclComm`] offers the six operations of
//! [`crate::comm::Comm`] with the same contract (same calls on every rank, caller-side
//! padding into equal shards, traffic counted with the same formulas):
//!
//! * on device buffers (`*_device`): what a GPU ZeRO engine uses, no copies;
//! * on host `f32` slices: staged through a device buffer, so host-side engines can run over
//!   NCCL unchanged;
//! * [`DeviceComm`]: the CUDA step's collectives in any element type it sends, on the
//!   communicator's stream.
//!
//! The host-slice operations are its [`Comm`] implementation: a failing NCCL or driver call is
//! [`CommError::Backend`], lengths that break the contract are the same errors as on
//! `LocalComm` (checked before NCCL is called).
//!
//! **Nothing hangs.** Every rank's communicator has a [`Watchdog`]: each host-slice operation
//! is watched, and [`NcclComm::watch`] watches a phase of the CUDA step (whose kernels include
//! its collectives). NCCL's asynchronous error (a peer's connection broke: the peer died) is
//! reported within [`PROBE_EVERY`]; a wait longer than the timeout is reported as
//! [`CommError::TimedOut`]. Either way the communicator is aborted (`ncclCommAbort`, which
//! stops its kernels, [`raw`]), and the wait returns the report as its error, naming the
//! operation and the rank. The set-up (`ncclCommInitRank`) cannot be aborted, since NCCL hands
//! out the handle only when it returns: one that outlasts the timeout ends the process.
//!
//! NCCL's library comes from the `nvidia-nccl-cu13` wheel as `libnccl.so.2`, a name cudarc does
//! not try: link `libnccl.so -> libnccl.so.2` in a directory on `LD_LIBRARY_PATH`.

mod raw;

use std::ffi::c_char;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr};
use cudarc::nccl::Id;

use super::device_comm::{DeviceComm, Wire, piece_of};
use super::error::CudaError;
use super::id_broadcast::{ID_BYTES, share_id_over};
use super::rendezvous::share_from_root;
use crate::comm::watchdog::{Sentry, Watch, Watchdog};
use crate::comm::{Comm, CommError, CommTraffic, OpKind, ReduceOp, Waiting};
use crate::launch::LaunchEnv;
use raw::RawNccl;

/// How often a watched wait asks NCCL for its asynchronous error.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);

/// One rank's NCCL communicator.
#[derive(Debug)]
pub struct NcclComm {
    comm: RawNccl,
    stream: Arc<CudaStream>,
    traffic: CommTraffic,
    watchdog: Watchdog,
}

/// Whether `libnccl` can be loaded (no NCCL call is made).
pub fn nccl_present() -> bool {
    // SAFETY: only tries to open the library by name.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

/// An error unless `libnccl` can be loaded.
fn require_nccl() -> Result<(), CudaError> {
    if nccl_present() {
        Ok(())
    } else {
        Err(CudaError::Nccl(
            "libnccl not found (pip install nvidia-nccl-cu13, and link libnccl.so -> \
             libnccl.so.2 in a directory on LD_LIBRARY_PATH)"
                .to_string(),
        ))
    }
}

/// NCCL's unique id, as bytes (rank 0 only).
fn make_id() -> Result<Vec<u8>, String> {
    let id = Id::new().map_err(|e| format!("ncclGetUniqueId: {e:?}"))?;
    Ok(id.internal().iter().map(|&c| c as u8).collect())
}

impl NcclComm {
    /// Joins the job described by `env` on `stream`'s GPU (which should be GPU
    /// `env.local_rank`), waiting at most `timeout` for the other ranks; the id travels over
    /// the TCP rendezvous on `MASTER_ADDR:MASTER_PORT`.
    pub fn from_env(
        stream: Arc<CudaStream>,
        env: &LaunchEnv,
        timeout: Duration,
    ) -> Result<Self, CudaError> {
        require_nccl()?;
        let bytes =
            share_from_root(env, make_id, timeout).map_err(|e| CudaError::Nccl(e.to_string()))?;
        Self::join(stream, (env.rank, env.world_size), &bytes, timeout)
    }

    /// Joins the job whose ranks already share `host` (MPI under `mpirun`), on `stream`'s GPU:
    /// the id is broadcast over it, so no `MASTER_ADDR` or port is needed. A wait on the
    /// communicator longer than `timeout` fails.
    pub fn from_host_comm(
        stream: Arc<CudaStream>,
        host: &mut dyn Comm,
        timeout: Duration,
    ) -> Result<Self, CudaError> {
        require_nccl()?;
        let bytes = share_id_over(host, make_id).map_err(CudaError::Nccl)?;
        Self::join(stream, (host.rank(), host.world_size()), &bytes, timeout)
    }

    /// `ncclCommInitRank` with rank 0's id, and the communicator's watchdog.
    fn join(
        stream: Arc<CudaStream>,
        (rank, world_size): (usize, usize),
        bytes: &[u8],
        timeout: Duration,
    ) -> Result<Self, CudaError> {
        if bytes.len() != ID_BYTES {
            return Err(CudaError::Nccl(format!(
                "rank 0 sent a {}-byte id, NCCL's is {ID_BYTES}",
                bytes.len()
            )));
        }
        let mut internal = [0 as c_char; ID_BYTES];
        for (slot, byte) in internal.iter_mut().zip(bytes) {
            *slot = *byte as c_char;
        }
        let comm = Self::bounded_join(&stream, (rank, world_size), internal, timeout)?;
        let (probe, alarm) = (comm.abort_handle(), comm.abort_handle());
        let watchdog = Watchdog::start(Sentry {
            rank,
            timeout,
            probe: Some(("NCCL", Box::new(move || probe.async_error()))),
            poll: PROBE_EVERY,
            alarm: Box::new(move |_| alarm.abort()),
        });
        Ok(Self {
            comm,
            stream,
            traffic: CommTraffic::default(),
            watchdog,
        })
    }

    /// `ncclCommInitRank`, which waits for every rank, under a watchdog of its own: NCCL
    /// hands out no handle to abort until it returns, so a set-up that outlasts `timeout` (a
    /// peer died between the rendezvous and the set-up) ends the process with the report.
    fn bounded_join(
        stream: &Arc<CudaStream>,
        (rank, world_size): (usize, usize),
        id: [c_char; ID_BYTES],
        timeout: Duration,
    ) -> Result<RawNccl, CudaError> {
        let watchdog = Watchdog::start(Sentry {
            rank,
            timeout,
            probe: None,
            poll: timeout,
            alarm: Box::new(|report| {
                eprintln!(
                    "error: {report}; NCCL cannot be interrupted while it sets up, so the process \
                     ends"
                );
                std::process::exit(1);
            }),
        });
        let ticket = watchdog.enter(Waiting::Join);
        let joined = RawNccl::join(stream.clone(), rank, world_size, id);
        // A report never returns here: its alarm ended the process.
        let _ = watchdog.leave(ticket);
        joined
    }

    /// Starts watching a wait for `what` on this communicator (see the [module
    /// documentation](self)); the watch's `finish` gives the report, if any.
    pub fn watch(&self, what: impl Into<Waiting>) -> Watch {
        self.watchdog.handle().watch(what.into())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    /// What this rank has sent so far (bandwidth-optimal volumes, as `LocalComm` counts).
    pub fn traffic(&self) -> &CommTraffic {
        &self.traffic
    }

    fn world(&self) -> u64 {
        self.world_size() as u64
    }

    fn check_shards(&self, op: OpKind, whole: usize, shard: usize) -> Result<(), CudaError> {
        if whole == self.world_size() * shard {
            Ok(())
        } else {
            Err(CudaError::Shape(format!(
                "{op}: {whole} elements do not split into {} shards of {shard}; pad the flat \
                 buffer to a multiple of the world size first",
                self.world_size()
            )))
        }
    }

    fn upload(&self, data: &[f32]) -> Result<CudaSlice<f32>, CudaError> {
        Ok(self.stream.clone_htod(data)?)
    }

    fn download(&self, device: &CudaSlice<f32>, host: &mut [f32]) -> Result<(), CudaError> {
        self.stream.memcpy_dtoh(device, host)?;
        self.stream.synchronize()?;
        Ok(())
    }

    /// The error of `op` failing with `error` on this rank.
    fn backend_error(&self, op: OpKind, error: CudaError) -> CommError {
        CommError::Backend {
            op: op.into(),
            rank: self.rank(),
            backend: "NCCL",
            message: error.to_string(),
        }
    }

    /// Runs host-slice operation `op` under the watchdog.
    fn watched<R>(
        &mut self,
        op: OpKind,
        run: impl FnOnce(&mut Self) -> Result<R, CudaError>,
    ) -> Result<R, CommError> {
        let watch = self.watch(op);
        let result = run(self).map_err(|e| self.backend_error(op, e));
        watch.finish(result)
    }

    /// The contract's shard check, as `LocalComm` reports it.
    fn shard_error(&self, op: OpKind, input_len: usize, output_len: usize) -> Option<CommError> {
        let world = self.world_size();
        let even = match op {
            OpKind::AllGather => output_len == world * input_len,
            _ => input_len == world * output_len,
        };
        (!even).then_some(CommError::UnevenShards {
            op,
            rank: self.rank(),
            input_len,
            output_len,
            world,
        })
    }
}

impl Comm for NcclComm {
    fn rank(&self) -> usize {
        NcclComm::rank(self)
    }

    fn world_size(&self) -> usize {
        NcclComm::world_size(self)
    }

    fn all_reduce(&mut self, data: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.watched(OpKind::AllReduce, |me| {
            let mut device = me.upload(data)?;
            DeviceComm::all_reduce(me, &mut device.as_view_mut(), op)?;
            me.download(&device, data)
        })
    }

    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if let Some(error) = self.shard_error(OpKind::ReduceScatter, input.len(), output.len()) {
            return Err(error);
        }
        self.watched(OpKind::ReduceScatter, |me| {
            let device_in = me.upload(input)?;
            let mut device_out = me.stream.alloc_zeros::<f32>(output.len())?;
            DeviceComm::reduce_scatter(
                me,
                &device_in.as_view(),
                &mut device_out.as_view_mut(),
                op,
            )?;
            me.download(&device_out, output)
        })
    }

    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> Result<(), CommError> {
        if let Some(error) = self.shard_error(OpKind::AllGather, input.len(), output.len()) {
            return Err(error);
        }
        self.watched(OpKind::AllGather, |me| {
            let device_in = me.upload(input)?;
            let mut device_out = me.stream.alloc_zeros::<f32>(output.len())?;
            DeviceComm::all_gather(me, &device_in.as_view(), &mut device_out.as_view_mut())?;
            me.download(&device_out, output)
        })
    }

    fn broadcast(&mut self, data: &mut [f32], root: usize) -> Result<(), CommError> {
        let world = self.world_size();
        if root >= world {
            return Err(CommError::RootOutOfRange {
                rank: self.rank(),
                root,
                world,
            });
        }
        self.watched(OpKind::Broadcast, |me| {
            let mut device = me.upload(data)?;
            // The root is a rank (checked above).
            me.comm.broadcast(&mut device.as_view_mut(), root)?;
            let (rank, world) = (me.rank(), me.world_size());
            me.traffic.record_broadcast(data.len(), root, rank, world);
            me.download(&device, data)
        })
    }

    /// An all-reduce of one element, waited for.
    fn barrier(&mut self) -> Result<(), CommError> {
        self.watched(OpKind::Barrier, |me| {
            let mut device = me.stream.alloc_zeros::<f32>(1)?;
            me.comm.all_reduce(&mut device, ReduceOp::Sum)?;
            me.stream.synchronize()?;
            me.traffic.record(OpKind::Barrier, 0);
            Ok(())
        })
    }

    fn all_reduce_scalar(&mut self, value: f64, op: ReduceOp) -> Result<f64, CommError> {
        self.watched(OpKind::AllReduceScalar, |me| {
            let mut device = me.stream.clone_htod(&[value])?;
            me.comm.all_reduce(&mut device, op)?;
            let mut host = [0.0f64];
            me.stream.memcpy_dtoh(&device, &mut host)?;
            me.stream.synchronize()?;
            me.traffic.record_scalar(me.world_size());
            Ok(host[0])
        })
    }

    fn traffic(&self) -> &CommTraffic {
        NcclComm::traffic(self)
    }
}

/// Bytes of `len` elements of `T`.
fn bytes_of<T>(len: usize) -> u64 {
    (len * std::mem::size_of::<T>()) as u64
}

impl DeviceComm for NcclComm {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn all_reduce<T: Wire>(
        &mut self,
        data: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError> {
        self.comm.all_reduce(data, reduction)?;
        let world = self.world();
        self.traffic.record(
            OpKind::AllReduce,
            2 * (world - 1) * bytes_of::<T>(data.len()) / world,
        );
        Ok(())
    }

    fn reduce_scatter<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError> {
        self.check_shards(OpKind::ReduceScatter, input.len(), output.len())?;
        self.comm.reduce_scatter(input, output, reduction)?;
        let sent = (self.world() - 1) * bytes_of::<T>(output.len());
        self.traffic.record(OpKind::ReduceScatter, sent);
        Ok(())
    }

    fn all_gather<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError> {
        self.check_shards(OpKind::AllGather, output.len(), input.len())?;
        self.comm.all_gather(input, output)?;
        let sent = (self.world() - 1) * bytes_of::<T>(input.len());
        self.traffic.record(OpKind::AllGather, sent);
        Ok(())
    }

    /// NCCL's in-place all-gather (the input is the output at `rank × piece`): the rank's
    /// piece is handed to NCCL as a second, borrowed view of the same memory.
    fn all_gather_in_place<T: Wire>(
        &mut self,
        whole: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError> {
        let piece = piece_of(whole.len(), self.world_size())?;
        let offset = bytes_of::<T>(self.rank() * piece);
        let base = {
            let (pointer, _sync) = whole.device_ptr(&self.stream);
            pointer
        };
        // SAFETY: `base + offset` is this rank's piece of `whole`, alive for the call; the
        // temporary slice is leaked afterwards, so it frees nothing. NCCL defines the
        // in-place all-gather with exactly this input.
        let mine = unsafe { self.stream.upgrade_device_ptr::<T>(base + offset, piece) };
        let result = self.comm.all_gather(&mine, whole);
        mine.leak();
        result?;
        let sent = (self.world() - 1) * bytes_of::<T>(piece);
        self.traffic.record(OpKind::AllGather, sent);
        Ok(())
    }
}
