//! [`DeviceComm`]: the collectives of the CUDA step on device buffers, with the same contract
//! as [`crate::comm::Comm`] (the same calls on every rank, equal pieces), in every element type
//! the step sends ([`Wire`]: the model dtype, the f64 norm, the i32 overflow flag).
//!
//! Two implementations:
//! - [`crate::cuda::nccl::NcclComm`]: NCCL on the GPUs' memory, one process per GPU, on the
//!   communicator's stream;
//! - [`HostStaged`]: any host [`Comm`] (`LocalComm` between threads, MPI between processes):
//!   the device buffer is copied to the host, reduced or gathered there in `f32` (the f64 and
//!   i32 scalars as exact f64 scalars), and copied back. Ranks that share one GPU use it; it
//!   is slow, and 16-bit sums round once per collective in `f32` then to the model dtype (NCCL
//!   sums in the 16-bit type), so its results are close to NCCL's, not equal.
//!
//! The host half of [`HostStaged`] ([`staged_all_reduce`], [`staged_reduce_scatter`],
//! [`staged_all_gather`]) works on host slices and is tested without a GPU; the device half is
//! one copy each way around it.

use std::sync::Arc;

use cudarc::driver::{CudaStream, CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::NcclType;

use super::error::CudaError;
use crate::comm::{Comm, CommError, ReduceOp};

/// An element a collective of the step sends.
pub trait Wire: DeviceRepr + ValidAsZeroBits + NcclType + Copy + Send + Sync + 'static {
    /// How the host stages it.
    const STAGING: Staging;
    /// To f64 (exact).
    fn to_f64(self) -> f64;
    /// From f64 (rounded to nearest even where narrower).
    fn from_f64(x: f64) -> Self;
}

/// How [`HostStaged`] carries an element type through a host [`Comm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// As `f32` buffers (the model dtypes: f32 exactly, bf16 and f16 widened and rounded back).
    F32,
    /// One exact `f64` scalar per element (the norm's f64 sum, the i32 flag).
    Scalars,
}

impl Wire for f32 {
    const STAGING: Staging = Staging::F32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as f32
    }
}

impl Wire for half::bf16 {
    const STAGING: Staging = Staging::F32;
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f32(x as f32)
    }
}

impl Wire for half::f16 {
    const STAGING: Staging = Staging::F32;
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
    fn from_f64(x: f64) -> Self {
        half::f16::from_f32(x as f32)
    }
}

impl Wire for f64 {
    const STAGING: Staging = Staging::Scalars;
    fn to_f64(self) -> f64 {
        self
    }
    fn from_f64(x: f64) -> Self {
        x
    }
}

impl Wire for i32 {
    const STAGING: Staging = Staging::Scalars;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(x: f64) -> Self {
        x as i32
    }
}

/// The collectives of the CUDA step on device buffers.
pub trait DeviceComm {
    /// The stream the collectives run on (the step's communication stream).
    fn stream(&self) -> &Arc<CudaStream>;
    /// In-place all-reduce.
    fn all_reduce<T: Wire>(
        &mut self,
        data: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError>;
    /// Reduce-scatter: `input.len() == world × output.len()`.
    fn reduce_scatter<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError>;
    /// All-gather: `output.len() == world × input.len()`.
    fn all_gather<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError>;
    /// In-place all-gather: this rank's piece is `whole[rank × piece, (rank + 1) × piece)`.
    fn all_gather_in_place<T: Wire>(
        &mut self,
        whole: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError>;
}

fn comm_error(error: CommError) -> CudaError {
    CudaError::Nccl(error.to_string())
}

/// The host half of a staged all-reduce of `data`.
pub fn staged_all_reduce<T: Wire>(
    comm: &mut dyn Comm,
    data: &mut [T],
    reduction: ReduceOp,
) -> Result<(), CommError> {
    let op = reduction;
    match T::STAGING {
        Staging::F32 => {
            let mut wide: Vec<f32> = data.iter().map(|x| x.to_f64() as f32).collect();
            comm.all_reduce(&mut wide, op)?;
            for (slot, value) in data.iter_mut().zip(wide) {
                *slot = T::from_f64(f64::from(value));
            }
        }
        Staging::Scalars => {
            for slot in data.iter_mut() {
                *slot = T::from_f64(comm.all_reduce_scalar(slot.to_f64(), op)?);
            }
        }
    }
    Ok(())
}

/// Widens model-dtype elements to `f32` (scalar types have no staged reduce-scatter or
/// all-gather: the step sends them by all-reduce only).
fn widen<T: Wire>(data: &[T], what: &str) -> Result<Vec<f32>, CommError> {
    match T::STAGING {
        Staging::F32 => Ok(data.iter().map(|x| x.to_f64() as f32).collect()),
        Staging::Scalars => Err(CommError::Backend {
            op: crate::comm::OpKind::AllGather.into(),
            rank: 0,
            backend: "host-staged",
            message: format!("{what} of scalar elements is not staged"),
        }),
    }
}

/// The host half of a staged reduce-scatter.
pub fn staged_reduce_scatter<T: Wire>(
    comm: &mut dyn Comm,
    input: &[T],
    output: &mut [T],
    reduction: ReduceOp,
) -> Result<(), CommError> {
    let wide = widen(input, "a reduce-scatter")?;
    let mut out = vec![0.0f32; output.len()];
    comm.reduce_scatter(&wide, &mut out, reduction)?;
    for (slot, value) in output.iter_mut().zip(out) {
        *slot = T::from_f64(f64::from(value));
    }
    Ok(())
}

/// The host half of a staged all-gather.
pub fn staged_all_gather<T: Wire>(
    comm: &mut dyn Comm,
    input: &[T],
    output: &mut [T],
) -> Result<(), CommError> {
    let wide = widen(input, "an all-gather")?;
    let mut out = vec![0.0f32; output.len()];
    comm.all_gather(&wide, &mut out)?;
    for (slot, value) in output.iter_mut().zip(out) {
        *slot = T::from_f64(f64::from(value));
    }
    Ok(())
}

/// [`DeviceComm`] over a host [`Comm`] (see the [module documentation](self)).
pub struct HostStaged<C: Comm> {
    comm: C,
    stream: Arc<CudaStream>,
}

impl<C: Comm> std::fmt::Debug for HostStaged<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStaged")
            .field("rank", &self.comm.rank())
            .field("world_size", &self.comm.world_size())
            .finish()
    }
}

impl<C: Comm> HostStaged<C> {
    /// Stages `comm`'s collectives through the host on `stream`.
    pub fn new(comm: C, stream: Arc<CudaStream>) -> Self {
        Self { comm, stream }
    }

    /// The host communicator.
    pub fn host(&mut self) -> &mut C {
        &mut self.comm
    }

    fn download<T: Wire>(&self, view: &CudaView<'_, T>) -> Result<Vec<T>, CudaError> {
        let host = self.stream.clone_dtoh(view)?;
        self.stream.synchronize()?;
        Ok(host)
    }
}

impl<C: Comm> DeviceComm for HostStaged<C> {
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    fn all_reduce<T: Wire>(
        &mut self,
        data: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError> {
        let mut host = self.download(&data.as_view())?;
        staged_all_reduce(&mut self.comm, &mut host, reduction).map_err(comm_error)?;
        self.stream.memcpy_htod(&host, data)?;
        Ok(())
    }

    fn reduce_scatter<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
        reduction: ReduceOp,
    ) -> Result<(), CudaError> {
        let host_in = self.download(input)?;
        let mut host_out = self.download(&output.as_view())?;
        staged_reduce_scatter(&mut self.comm, &host_in, &mut host_out, reduction)
            .map_err(comm_error)?;
        self.stream.memcpy_htod(&host_out, output)?;
        Ok(())
    }

    fn all_gather<T: Wire>(
        &mut self,
        input: &CudaView<'_, T>,
        output: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError> {
        let host_in = self.download(input)?;
        let mut host_out = self.download(&output.as_view())?;
        staged_all_gather(&mut self.comm, &host_in, &mut host_out).map_err(comm_error)?;
        self.stream.memcpy_htod(&host_out, output)?;
        Ok(())
    }

    fn all_gather_in_place<T: Wire>(
        &mut self,
        whole: &mut CudaViewMut<'_, T>,
    ) -> Result<(), CudaError> {
        let mut host = self.download(&whole.as_view())?;
        let piece = piece_of(whole.len(), self.comm.world_size())?;
        let start = self.comm.rank() * piece;
        let mine = host[start..start + piece].to_vec();
        staged_all_gather(&mut self.comm, &mine, &mut host).map_err(comm_error)?;
        self.stream.memcpy_htod(&host, whole)?;
        Ok(())
    }
}

/// Elements of one rank's piece of `whole` elements, or an error when they do not split.
pub fn piece_of(whole: usize, world: usize) -> Result<usize, CudaError> {
    if world == 0 || !whole.is_multiple_of(world) {
        return Err(CudaError::Shape(format!(
            "{whole} elements do not split into {world} equal pieces"
        )));
    }
    Ok(whole / world)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::{LocalComm, run_ranks};

    /// Rank r holds `r + 1 + i/8` at element i: bf16-exact values.
    fn values(rank: usize, len: usize) -> Vec<half::bf16> {
        (0..len)
            .map(|i| half::bf16::from_f32(rank as f32 + 1.0 + i as f32 / 8.0))
            .collect()
    }

    #[test]
    fn staged_bf16_collectives_match_the_arithmetic_on_every_rank() {
        for world in [2usize, 4] {
            let results = run_ranks(world, |mut comm: LocalComm| -> Result<_, CommError> {
                let rank = comm.rank();
                let mut data = values(rank, 8);
                staged_all_reduce(&mut comm, &mut data, ReduceOp::Avg)?;
                let input = values(rank, 4 * world);
                let mut shard = vec![half::bf16::ZERO; 4];
                staged_reduce_scatter(&mut comm, &input, &mut shard, ReduceOp::Sum)?;
                let mine = values(rank, 2);
                let mut all = vec![half::bf16::ZERO; 2 * world];
                staged_all_gather(&mut comm, &mine, &mut all)?;
                let mut norm = [2.5f64 * (rank as f64 + 1.0)];
                staged_all_reduce(&mut comm, &mut norm, ReduceOp::Sum)?;
                let mut flag = [i32::from(rank == world - 1)];
                staged_all_reduce(&mut comm, &mut flag, ReduceOp::Max)?;
                Ok((rank, data, shard, all, norm[0], flag[0]))
            })
            .expect("ranks");
            let mean_rank = (world as f32 - 1.0) / 2.0;
            let ranks_sum: f32 = (0..world).map(|r| r as f32 + 1.0).sum();
            for result in results {
                let (rank, data, shard, all, norm, flag) = result.expect("collectives");
                for (i, x) in data.iter().enumerate() {
                    let expected = half::bf16::from_f32(mean_rank + 1.0 + i as f32 / 8.0);
                    assert_eq!(*x, expected, "W={world} rank {rank} all-reduce {i}");
                }
                for (i, x) in shard.iter().enumerate() {
                    let at = rank * 4 + i;
                    let expected = ranks_sum + world as f32 * at as f32 / 8.0;
                    assert_eq!(x.to_f32(), half::bf16::from_f32(expected).to_f32());
                }
                for (i, x) in all.iter().enumerate() {
                    assert_eq!(*x, values(i / 2, 2)[i % 2], "W={world} gather {i}");
                }
                let norm_sum: f64 = (0..world).map(|r| 2.5 * (r as f64 + 1.0)).sum();
                assert_eq!(norm, norm_sum);
                assert_eq!(flag, 1);
            }
        }
    }

    #[test]
    fn staged_collectives_keep_the_contract() {
        let results = run_ranks(2, |mut comm: LocalComm| {
            let input = vec![half::bf16::ONE; 5];
            let mut out = vec![half::bf16::ZERO; 2];
            staged_reduce_scatter(&mut comm, &input, &mut out, ReduceOp::Sum).is_err()
        })
        .expect("ranks");
        assert!(results.iter().all(|&refused| refused));
        let scalars = run_ranks(2, |mut comm: LocalComm| {
            let mut out = [0.0f64; 2];
            staged_all_gather(&mut comm, &[1.0f64], &mut out).is_err()
        })
        .expect("ranks");
        assert!(scalars.iter().all(|&refused| refused));
        assert!(piece_of(10, 4).is_err());
        assert_eq!(piece_of(12, 4).expect("splits"), 3);
    }
}
