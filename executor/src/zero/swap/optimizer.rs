//! [`OptimizerSwap`]: a rank's fp32 master weights and Adam moments in three files, stepped
//! sub-group by sub-group through swap buffers.

use std::ops::Range;
use std::path::Path;
use std::rc::Rc;

use super::{OPTIMIZER_PATH_POINTER, SwapDir, SwapError, SwapFile, SwapTraffic};
use crate::metrics::{Category, MemoryLedger, Tracked};
use crate::optim::{AdamConfig, adam_step};
use crate::zero::ZeroError;
use crate::zero::partition::OptimizerNvme;
use crate::zero::precision::Dtype;

/// JSON pointer of the optimizer's `buffer_count`.
const BUFFER_COUNT_POINTER: &str = "/zero_optimization/offload_optimizer/buffer_count";
/// JSON pointer of the optimizer's `ratio`.
const RATIO_POINTER: &str = "/zero_optimization/offload_optimizer/ratio";
/// Swap buffers one sub-group's step needs: master, `exp_avg`, `exp_avg_sq`.
const BUFFERS_PER_GROUP: usize = 3;

/// The master weights and Adam moments of a rank's shard, on NVMe. Element `i` of each file is
/// element `i` of the shard; a sub-group is a range of it.
#[derive(Debug)]
pub struct OptimizerSwap {
    master: SwapFile,
    exp_avg: SwapFile,
    exp_avg_sq: SwapFile,
    groups: Vec<Range<usize>>,
    /// `buffer_count` buffers of the largest sub-group (the ledger's optimizer memory).
    buffers: Vec<Tracked<Box<[f32]>>>,
    init: SwapTraffic,
    // Last, so that the files are closed before the directory is removed.
    dir: SwapDir,
}

impl OptimizerSwap {
    /// Creates rank `rank`'s files under the plan's `nvme_path` and writes the initial state:
    /// `initial_master` (the shard widened to fp32) and zero moments.
    pub fn create(
        layout: &OptimizerNvme,
        rank: usize,
        initial_master: &[f32],
        ledger: &Rc<MemoryLedger>,
    ) -> Result<Self, SwapError> {
        let base = Path::new(&layout.path);
        if layout.on_nvme.iter().any(|&on| !on) {
            return Err(SwapError::invalid(
                RATIO_POINTER,
                base,
                "partial optimizer offload (ratio < 1) to NVMe is not implemented by dsplan's executor",
            ));
        }
        if layout.buffer_count < BUFFERS_PER_GROUP {
            return Err(SwapError::invalid(
                BUFFER_COUNT_POINTER,
                base,
                format!(
                    "buffer_count {} is too small: one sub-group's step swaps in its master and Adam's two moments ({BUFFERS_PER_GROUP} buffers)",
                    layout.buffer_count
                ),
            ));
        }
        let largest = layout.sub_groups.iter().map(|g| g.len()).max().unwrap_or(0);
        let buffers: Vec<Tracked<Box<[f32]>>> = (0..layout.buffer_count)
            .map(|_| Tracked::zeros(ledger, Category::Optimizer, largest))
            .collect();
        let dir = SwapDir::create(base, rank, OPTIMIZER_PATH_POINTER)?;
        let file =
            |name: &str| SwapFile::create(&dir.file(name), Dtype::F32, OPTIMIZER_PATH_POINTER);
        let master = file("fp32_master.swp")?;
        let exp_avg = file("exp_avg.swp")?;
        let exp_avg_sq = file("exp_avg_sq.swp")?;
        let mut swap = Self {
            master,
            exp_avg,
            exp_avg_sq,
            groups: layout.sub_groups.clone(),
            buffers,
            init: SwapTraffic::default(),
            dir,
        };
        for group in swap.groups.clone() {
            swap.master
                .write(group.start, &initial_master[group.clone()])?;
            let zeros = &swap.buffers[0][..group.len()];
            swap.exp_avg.write(group.start, zeros)?;
            swap.exp_avg_sq.write(group.start, zeros)?;
        }
        swap.init = swap.traffic();
        Ok(swap)
    }

    /// The sub-groups, as ranges of the shard.
    pub fn groups(&self) -> &[Range<usize>] {
        &self.groups
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes moved so far (set-up included).
    pub fn traffic(&self) -> SwapTraffic {
        self.master
            .traffic()
            .plus(self.exp_avg.traffic())
            .plus(self.exp_avg_sq.traffic())
    }

    /// Bytes written while setting up.
    pub fn init_traffic(&self) -> SwapTraffic {
        self.init
    }

    /// The files' sizes on disk.
    pub fn resident_bytes(&self) -> Result<u64, SwapError> {
        Ok(self.master.size()? + self.exp_avg.size()? + self.exp_avg_sq.size()?)
    }

    /// Adam step `step` on every sub-group in order: swap its master and moments in, step them
    /// with `grads` (the whole shard's fp32 gradients), swap them out, then hand the new master
    /// values to `refresh(start, values)` (to update the 16-bit parameters).
    pub fn step(
        &mut self,
        grads: &[f32],
        step: u64,
        lr: f64,
        adam: &AdamConfig,
        mut refresh: impl FnMut(usize, &[f32]) -> Result<(), ZeroError>,
    ) -> Result<(), ZeroError> {
        let Self {
            master,
            exp_avg,
            exp_avg_sq,
            groups,
            buffers,
            ..
        } = self;
        let [p, m, v, ..] = buffers.as_mut_slice() else {
            return Ok(());
        };
        for group in groups.iter() {
            let n = group.len();
            let (p, m, v) = (&mut p[..n], &mut m[..n], &mut v[..n]);
            master.read(group.start, p)?;
            exp_avg.read(group.start, m)?;
            exp_avg_sq.read(group.start, v)?;
            adam_step(p, &grads[group.clone()], m, v, step, lr, adam)?;
            master.write(group.start, p)?;
            exp_avg.write(group.start, m)?;
            exp_avg_sq.write(group.start, v)?;
            refresh(group.start, p)?;
        }
        Ok(())
    }

    /// The whole master, read from its file.
    pub fn read_master(&self, len: usize) -> Result<Vec<f32>, SwapError> {
        let mut out = vec![0.0; len];
        self.master.read(0, &mut out)?;
        Ok(out)
    }

    /// Adam's two moments, read from their files.
    pub fn read_moments(&self, len: usize) -> Result<(Vec<f32>, Vec<f32>), SwapError> {
        let mut m = vec![0.0; len];
        let mut v = vec![0.0; len];
        self.exp_avg.read(0, &mut m)?;
        self.exp_avg_sq.read(0, &mut v)?;
        Ok((m, v))
    }

    /// Replaces the master.
    pub fn write_master(&self, values: &[f32]) -> Result<(), SwapError> {
        self.master.write(0, values)
    }

    /// Replaces Adam's two moments.
    pub fn write_moments(&self, exp_avg: &[f32], exp_avg_sq: &[f32]) -> Result<(), SwapError> {
        self.exp_avg.write(0, exp_avg)?;
        self.exp_avg_sq.write(0, exp_avg_sq)
    }
}
