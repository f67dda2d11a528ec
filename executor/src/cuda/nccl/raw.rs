//! [`RawNccl`]: dsplan's own thin NCCL communicator, over cudarc's `nccl::sys` bindings.
//!
//! cudarc's safe `Comm` keeps its handle private, and a stuck collective can only be ended
//! through the handle: the watchdog ([`crate::comm::watchdog`]) asks `ncclCommGetAsyncError`
//! whether NCCL has seen a peer fail, and calls `ncclCommAbort` when it has or when a wait
//! outlives the timeout. Both are meant to be called from a thread other than the one issuing
//! the collectives (PyTorch's and XLA's NCCL watchdogs do exactly this), so the handle is
//! shared with the watchdog behind [`Handle`]; it is aborted (and freed) at most once.
//!
//! The collectives take cudarc's device views, so cudarc's stream-ordering records work as
//! with its own `Comm`. Errors carry NCCL's own text (`ncclGetErrorString` and
//! `ncclGetLastError`) rather than cudarc's bare `NcclError`.

use std::ffi::{CStr, c_char};
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{NcclType, sys};

use crate::comm::ReduceOp;
use crate::cuda::error::CudaError;

/// Whether the communicator can still be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Live,
    /// `ncclCommAbort` was called: the handle is freed.
    Aborted,
}

/// The NCCL handle, shared by the rank's thread and its watchdog.
struct Handle {
    comm: sys::ncclComm_t,
    life: Mutex<Life>,
}

// SAFETY: the handle is an opaque pointer that NCCL lets other threads query
// (`ncclCommGetAsyncError`) and abort (`ncclCommAbort`) while the owner thread issues
// collectives; the pointer is freed once, by `abort`, under `life`'s lock, and never used
// after (every use checks `life` first).
unsafe impl Send for Handle {}
// SAFETY: as above; shared access goes through `life`'s lock or NCCL's thread-safe queries.
unsafe impl Sync for Handle {}

impl Handle {
    fn life(&self) -> std::sync::MutexGuard<'_, Life> {
        self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `ncclCommAbort`, once: stops the communicator's kernels and frees it.
    fn abort(&self) {
        let mut life = self.life();
        if *life == Life::Live {
            *life = Life::Aborted;
            // SAFETY: `comm` is live (checked under the lock) and is never used again.
            let _ = unsafe { sys::ncclCommAbort(self.comm) };
        }
    }

    /// NCCL's asynchronous error, if it has one (a peer's connection broke, a proxy thread
    /// failed); `None` once aborted.
    fn async_error(&self) -> Option<String> {
        let life = self.life();
        if *life != Life::Live {
            return None;
        }
        let mut code = MaybeUninit::<sys::ncclResult_t>::uninit();
        // SAFETY: `comm` is live (the lock keeps `abort` out); `code` is written by NCCL.
        let status = unsafe { sys::ncclCommGetAsyncError(self.comm, code.as_mut_ptr()) };
        if status != sys::ncclResult_t::ncclSuccess {
            return Some(describe(status, Some(self.comm)));
        }
        // SAFETY: NCCL wrote `code` when it returned success.
        let code = unsafe { code.assume_init() };
        match code {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => None,
            failed => Some(describe(failed, Some(self.comm))),
        }
    }
}

/// NCCL's text for `code`, with the communicator's last error when it has one.
fn describe(code: sys::ncclResult_t, comm: Option<sys::ncclComm_t>) -> String {
    // SAFETY: NCCL returns a static, NUL-terminated string for every code.
    let text = unsafe { c_text(sys::ncclGetErrorString(code)) };
    let last = comm
        // SAFETY: `comm` is a live communicator; NCCL returns a NUL-terminated string it owns.
        .map(|c| unsafe { c_text(sys::ncclGetLastError(c)) })
        .filter(|s| !s.is_empty());
    match last {
        Some(last) => format!("{code:?}: {text} ({last})"),
        None => format!("{code:?}: {text}"),
    }
}

/// # Safety
/// `text` is null or a NUL-terminated string alive for the call.
unsafe fn c_text(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .trim()
        .to_string()
}

fn red_op(op: ReduceOp) -> sys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
        ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
    }
}

/// One rank's NCCL communicator on one stream (see the [module documentation](self)).
pub(crate) struct RawNccl {
    handle: Arc<Handle>,
    rank: usize,
    world_size: usize,
    stream: Arc<CudaStream>,
}

impl std::fmt::Debug for RawNccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawNccl")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish_non_exhaustive()
    }
}

/// What the watchdog holds of a [`RawNccl`]: its asynchronous error and its abort.
#[derive(Clone)]
pub(crate) struct AbortHandle(Arc<Handle>);

impl AbortHandle {
    /// NCCL's asynchronous error, if any.
    pub(crate) fn async_error(&self) -> Option<String> {
        self.0.async_error()
    }

    /// Aborts the communicator (once).
    pub(crate) fn abort(&self) {
        self.0.abort()
    }
}

impl RawNccl {
    /// `ncclCommInitRank` of `rank` among `world_size` with rank 0's `id`, on `stream`'s GPU.
    pub(crate) fn join(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        id: [c_char; 128],
    ) -> Result<Self, CudaError> {
        let (nranks, me) = (to_int(world_size)?, to_int(rank)?);
        stream.context().bind_to_thread()?;
        let mut comm = MaybeUninit::<sys::ncclComm_t>::uninit();
        let id = sys::ncclUniqueId { internal: id };
        // SAFETY: `comm` is written by NCCL on success; the id came from `ncclGetUniqueId`.
        let status = unsafe { sys::ncclCommInitRank(comm.as_mut_ptr(), nranks, id, me) };
        if status != sys::ncclResult_t::ncclSuccess {
            return Err(CudaError::Nccl(format!(
                "ncclCommInitRank (rank {rank} of {world_size}): {}",
                describe(status, None)
            )));
        }
        Ok(Self {
            // SAFETY: NCCL returned success, so it wrote the handle.
            handle: Arc::new(Handle {
                comm: unsafe { comm.assume_init() },
                life: Mutex::new(Life::Live),
            }),
            rank,
            world_size,
            stream,
        })
    }

    /// This rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub(crate) fn world_size(&self) -> usize {
        self.world_size
    }

    /// The handle the watchdog queries and aborts.
    pub(crate) fn abort_handle(&self) -> AbortHandle {
        AbortHandle(Arc::clone(&self.handle))
    }

    /// The live handle, or why there is none.
    fn live(&self, call: &str) -> Result<sys::ncclComm_t, CudaError> {
        match *self.handle.life() {
            Life::Live => Ok(self.handle.comm),
            Life::Aborted => Err(CudaError::Nccl(format!(
                "{call} on rank {}: the communicator was aborted after an earlier failure",
                self.rank
            ))),
        }
    }

    /// NCCL's status of `call`, as an error naming it.
    fn check(&self, call: &str, status: sys::ncclResult_t) -> Result<(), CudaError> {
        match status {
            sys::ncclResult_t::ncclSuccess | sys::ncclResult_t::ncclInProgress => Ok(()),
            failed => {
                let comm = (*self.handle.life() == Life::Live).then_some(self.handle.comm);
                Err(CudaError::Nccl(format!(
                    "{call} on rank {}: {}",
                    self.rank,
                    describe(failed, comm)
                )))
            }
        }
    }

    fn cu_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// `ncclAllReduce` in place.
    pub(crate) fn all_reduce<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        data: &mut R,
        op: ReduceOp,
    ) -> Result<(), CudaError> {
        let comm = self.live("ncclAllReduce")?;
        let count = data.len();
        let (ptr, _record) = data.device_ptr_mut(&self.stream);
        // SAFETY: `ptr` is a device buffer of `count` elements of `T`, alive and ordered on
        // `self.stream` by the record held for the call.
        let status = unsafe {
            sys::ncclAllReduce(
                ptr as _,
                ptr as _,
                count,
                T::as_nccl_type(),
                red_op(op),
                comm,
                self.cu_stream(),
            )
        };
        self.check("ncclAllReduce", status)
    }

    /// `ncclReduceScatter`: `send` holds `world × recv.len()` elements.
    pub(crate) fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: ReduceOp,
    ) -> Result<(), CudaError> {
        let comm = self.live("ncclReduceScatter")?;
        let count = recv.len();
        let (src, _record_src) = send.device_ptr(&self.stream);
        let (dst, _record_dst) = recv.device_ptr_mut(&self.stream);
        // SAFETY: as in `all_reduce`; the caller checked the lengths.
        let status = unsafe {
            sys::ncclReduceScatter(
                src as _,
                dst as _,
                count,
                T::as_nccl_type(),
                red_op(op),
                comm,
                self.cu_stream(),
            )
        };
        self.check("ncclReduceScatter", status)
    }

    /// `ncclAllGather`: `recv` holds `world × send.len()` elements.
    pub(crate) fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<(), CudaError> {
        let comm = self.live("ncclAllGather")?;
        let count = send.len();
        let (src, _record_src) = send.device_ptr(&self.stream);
        let (dst, _record_dst) = recv.device_ptr_mut(&self.stream);
        // SAFETY: as in `all_reduce`; the caller checked the lengths.
        let status = unsafe {
            sys::ncclAllGather(
                src as _,
                dst as _,
                count,
                T::as_nccl_type(),
                comm,
                self.cu_stream(),
            )
        };
        self.check("ncclAllGather", status)
    }

    /// `ncclBroadcast` in place from `root`.
    pub(crate) fn broadcast<T: NcclType, R: DevicePtrMut<T>>(
        &self,
        data: &mut R,
        root: usize,
    ) -> Result<(), CudaError> {
        let comm = self.live("ncclBroadcast")?;
        let count = data.len();
        let (ptr, _record) = data.device_ptr_mut(&self.stream);
        // SAFETY: as in `all_reduce`.
        let status = unsafe {
            sys::ncclBroadcast(
                ptr as _,
                ptr as _,
                count,
                T::as_nccl_type(),
                to_int(root)?,
                comm,
                self.cu_stream(),
            )
        };
        self.check("ncclBroadcast", status)
    }
}

impl Drop for RawNccl {
    /// Aborted rather than destroyed: `ncclCommDestroy` can wait for a peer that is gone,
    /// and by now every collective this rank issued has completed or failed.
    fn drop(&mut self) {
        self.handle.abort();
    }
}

fn to_int(value: usize) -> Result<i32, CudaError> {
    i32::try_from(value)
        .map_err(|_| CudaError::Nccl(format!("{value} does not fit NCCL's int rank and count")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduce_ops_map_to_nccls() {
        assert_eq!(red_op(ReduceOp::Sum), sys::ncclRedOp_t::ncclSum);
        assert_eq!(red_op(ReduceOp::Avg), sys::ncclRedOp_t::ncclAvg);
        assert_eq!(red_op(ReduceOp::Max), sys::ncclRedOp_t::ncclMax);
    }

    #[test]
    fn a_rank_beyond_nccls_int_is_refused_before_any_call() {
        let error = to_int(usize::MAX).expect_err("too large");
        assert!(error.to_string().contains("does not fit"), "{error}");
    }

    #[test]
    fn null_c_text_is_empty() {
        // SAFETY: null is allowed.
        assert_eq!(unsafe { c_text(std::ptr::null()) }, "");
    }
}
