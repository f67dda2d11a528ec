//! Every rank's results on every rank: the fp32 master partitions (to consolidate the model,
//! at the end of a run and for an eval during it) and the measured memory reports, over the
//! rank's [`Comm`].

use crate::comm::{Comm, ReduceOp};
use crate::metrics::MemoryReport;

/// Every rank's master shard (all-gathered, padded to the longest) and memory report (exact
/// `u64`s through `f64` scalar reductions: byte counts stay far below 2^53).
pub(crate) fn gather_everyone(
    comm: &mut dyn Comm,
    master: &[f32],
    memory: &MemoryReport,
) -> Result<Vec<(Vec<f32>, MemoryReport)>, crate::comm::CommError> {
    let world = comm.world_size();
    let me = comm.rank();
    // From rank `q`'s value, everyone's copy: a MAX over zeros elsewhere.
    let mut from = |q: usize, value: u64| -> Result<u64, crate::comm::CommError> {
        let mine = if q == me { value as f64 } else { 0.0 };
        Ok(comm.all_reduce_scalar(mine, ReduceOp::Max)? as u64)
    };
    let mut memories = Vec::with_capacity(world);
    for q in 0..world {
        let mut report = MemoryReport {
            peak_total: from(q, memory.peak_total)?,
            ..MemoryReport::default()
        };
        for i in 0..memory.peak.0.len() {
            report.peak.0[i] = from(q, memory.peak.0[i])?;
            report.at_peak.0[i] = from(q, memory.at_peak.0[i])?;
        }
        memories.push(report);
    }
    let masters = gather_masters(comm, master)?;
    Ok(masters.into_iter().zip(memories).collect())
}

/// Every rank's fp32 master partition, on every rank (all-gathered, padded to the longest).
pub(crate) fn gather_masters(
    comm: &mut dyn Comm,
    master: &[f32],
) -> Result<Vec<Vec<f32>>, crate::comm::CommError> {
    let world = comm.world_size();
    let me = comm.rank();
    let mut lens = Vec::with_capacity(world);
    for q in 0..world {
        let mine = if q == me { master.len() as f64 } else { 0.0 };
        lens.push(comm.all_reduce_scalar(mine, ReduceOp::Max)? as usize);
    }
    let longest = lens.iter().copied().max().unwrap_or(0);
    let mut padded = master.to_vec();
    padded.resize(longest, 0.0);
    let mut all = vec![0.0f32; longest * world];
    comm.all_gather(&padded, &mut all)?;
    Ok(all
        .chunks_exact(longest.max(1))
        .take(world)
        .zip(lens)
        .map(|(chunk, len)| chunk[..len.min(chunk.len())].to_vec())
        .collect())
}
