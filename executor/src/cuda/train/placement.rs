//! Where the ranks of a GPU run train, as data: [`place_ranks`] decides, from the number of
//! ranks and of visible GPUs (and whether NCCL can be loaded), each rank's GPU ordinal and
//! how the ranks' device collectives travel ([`DeviceLink`]). Pure: the trainer and the run
//! header read the same [`Placement`].
//!
//! NCCL refuses two ranks of one communicator on one GPU, so ranks that share a GPU stage
//! their collectives through host memory over the host `Comm` (`HostStaged`); ranks with a
//! GPU each use NCCL when it can be loaded, and the host staging otherwise.

use std::fmt;

/// How the device collectives of a run's ranks travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceLink {
    /// One rank: the step has no collectives.
    Alone,
    /// NCCL on device buffers (every rank has a GPU of its own).
    Nccl,
    /// Through host memory over the ranks' host `Comm` (ranks share a GPU, or NCCL is
    /// missing).
    HostStaged,
}

/// Whether `libnccl` can be loaded on this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclLibrary {
    /// It loads.
    Present,
    /// It does not.
    Missing,
}

/// Each rank's GPU and the run's device collectives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Rank `r` trains on GPU `ordinals[r]` (`CUDA_VISIBLE_DEVICES` numbering).
    pub ordinals: Vec<usize>,
    /// How the collectives travel.
    pub link: DeviceLink,
}

/// Why ranks cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementError {
    /// No GPU is visible.
    NoGpu,
    /// No rank to place.
    NoRanks,
}

impl fmt::Display for PlacementError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementError::NoGpu => f.write_str("no GPU is visible to place the ranks on"),
            PlacementError::NoRanks => f.write_str("a run needs at least one rank"),
        }
    }
}

impl std::error::Error for PlacementError {}

/// Places `ranks` thread ranks on `visible` GPUs, the first at GPU `first` (the run's chosen
/// GPU; 0 unless asked): one rank per GPU while there are enough (rank `r` on GPU
/// `(first + r) % visible`), round robin otherwise; NCCL when every rank has its own GPU and
/// `nccl` is present, the host staging otherwise.
pub fn place_ranks(
    ranks: usize,
    visible: usize,
    first: usize,
    nccl: NcclLibrary,
) -> Result<Placement, PlacementError> {
    if ranks == 0 {
        return Err(PlacementError::NoRanks);
    }
    if visible == 0 {
        return Err(PlacementError::NoGpu);
    }
    let ordinals: Vec<usize> = (0..ranks).map(|r| (first + r) % visible).collect();
    let link = if ranks == 1 {
        DeviceLink::Alone
    } else if ranks <= visible && nccl == NcclLibrary::Present {
        DeviceLink::Nccl
    } else {
        DeviceLink::HostStaged
    };
    Ok(Placement { ordinals, link })
}

/// Places this process, local rank `local_rank` of `local_ranks` processes on its node (the
/// launcher's `LOCAL_RANK`, `LOCAL_WORLD_SIZE`; `None`: not given, as if this were the last),
/// on one of `visible` GPUs: GPU `local_rank` with NCCL (host staging without it) when the
/// node's processes have a GPU each, GPU `local_rank % visible` with host staging when they
/// share.
pub fn place_process(
    local_rank: usize,
    local_ranks: Option<usize>,
    visible: usize,
    nccl: NcclLibrary,
) -> Result<(usize, DeviceLink), PlacementError> {
    if visible == 0 {
        return Err(PlacementError::NoGpu);
    }
    let local_ranks = local_ranks.unwrap_or(local_rank + 1).max(local_rank + 1);
    if local_ranks <= visible {
        let link = match nccl {
            NcclLibrary::Present => DeviceLink::Nccl,
            NcclLibrary::Missing => DeviceLink::HostStaged,
        };
        Ok((local_rank, link))
    } else {
        Ok((local_rank % visible, DeviceLink::HostStaged))
    }
}

/// How many of a node's `local_ranks` processes share the busiest of `visible` GPUs when
/// [`place_process`] places them (1 while each has its own; 1 without a GPU to place on).
pub fn processes_per_gpu(local_ranks: usize, visible: usize) -> usize {
    if visible == 0 {
        return 1;
    }
    local_ranks.div_ceil(visible).max(1)
}

impl Placement {
    /// How many distinct GPUs the ranks train on.
    pub fn gpus(&self) -> usize {
        let mut distinct = self.ordinals.clone();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len()
    }

    /// The most ranks that train on one GPU (their device memory adds up there).
    pub fn busiest(&self) -> usize {
        let mut ordinals = self.ordinals.clone();
        ordinals.sort_unstable();
        ordinals
            .chunk_by(|a, b| a == b)
            .map(<[usize]>::len)
            .max()
            .unwrap_or(0)
    }

    /// Whether two ranks train on one GPU.
    pub fn shares_a_gpu(&self) -> bool {
        self.busiest() > 1
    }
}

impl fmt::Display for Placement {
    /// E.g. `on GPUs 0, 1 (collectives over NCCL)`, `on GPU 0 (2 ranks sharing it;
    /// collectives staged through host memory)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut gpus = self.ordinals.clone();
        gpus.sort_unstable();
        gpus.dedup();
        let list = gpus
            .iter()
            .map(|g| g.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let noun = if gpus.len() == 1 { "GPU" } else { "GPUs" };
        write!(f, "on {noun} {list}")?;
        let how = match self.link {
            DeviceLink::Alone => return Ok(()),
            DeviceLink::Nccl => "collectives over NCCL".to_string(),
            DeviceLink::HostStaged if self.shares_a_gpu() => format!(
                "{} ranks on {} GPU(s); collectives staged through host memory",
                self.ordinals.len(),
                gpus.len()
            ),
            DeviceLink::HostStaged => {
                "collectives staged through host memory (libnccl not found)".to_string()
            }
        };
        write!(f, " ({how})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_visible_gpus_give_ordinals_and_the_collective() {
        use DeviceLink::*;
        use NcclLibrary::*;
        // (ranks, visible GPUs, first GPU, NCCL, ordinals, link)
        type Case = (
            usize,
            usize,
            usize,
            NcclLibrary,
            &'static [usize],
            DeviceLink,
        );
        let cases: [Case; 8] = [
            (1, 1, 0, Present, &[0], Alone),
            (1, 4, 2, Missing, &[2], Alone),
            (2, 1, 0, Present, &[0, 0], HostStaged),
            (3, 1, 0, Present, &[0, 0, 0], HostStaged),
            (2, 2, 0, Present, &[0, 1], Nccl),
            (2, 2, 0, Missing, &[0, 1], HostStaged),
            (4, 2, 0, Present, &[0, 1, 0, 1], HostStaged),
            (2, 8, 0, Present, &[0, 1], Nccl),
        ];
        for (ranks, visible, first, nccl, ordinals, link) in cases {
            let placed = place_ranks(ranks, visible, first, nccl).expect("placed");
            assert_eq!(placed.ordinals, ordinals, "{ranks} on {visible}");
            assert_eq!(placed.link, link, "{ranks} on {visible} {nccl:?}");
            // NCCL never gets two ranks on one GPU.
            assert!(!(placed.link == Nccl && placed.shares_a_gpu()));
            // The busiest GPU holds ⌈ranks / GPUs used⌉ ranks' memory.
            assert_eq!(
                placed.busiest(),
                ranks.div_ceil(visible),
                "{ranks} on {visible}"
            );
        }
        for (local_ranks, visible, busiest) in
            [(1, 1, 1), (2, 1, 2), (3, 2, 2), (2, 8, 1), (4, 0, 1)]
        {
            assert_eq!(processes_per_gpu(local_ranks, visible), busiest);
        }
        assert_eq!(place_ranks(2, 0, 0, Present), Err(PlacementError::NoGpu));
        assert_eq!(place_ranks(0, 2, 0, Present), Err(PlacementError::NoRanks));
    }

    #[test]
    fn a_process_takes_the_gpu_of_its_local_rank() {
        use DeviceLink::*;
        use NcclLibrary::*;
        assert_eq!(place_process(0, Some(2), 2, Present), Ok((0, Nccl)));
        assert_eq!(place_process(1, Some(2), 2, Present), Ok((1, Nccl)));
        assert_eq!(place_process(1, Some(2), 2, Missing), Ok((1, HostStaged)));
        assert_eq!(place_process(1, Some(2), 1, Present), Ok((0, HostStaged)));
        assert_eq!(place_process(3, Some(4), 2, Present), Ok((1, HostStaged)));
        // Without LOCAL_WORLD_SIZE: the local rank alone decides.
        assert_eq!(place_process(1, None, 2, Present), Ok((1, Nccl)));
        assert_eq!(place_process(2, None, 2, Present), Ok((0, HostStaged)));
        assert_eq!(
            place_process(0, Some(1), 0, Present),
            Err(PlacementError::NoGpu)
        );
    }

    #[test]
    fn the_header_says_where_and_how() {
        let shared = place_ranks(2, 1, 0, NcclLibrary::Present).expect("placed");
        assert_eq!(
            shared.to_string(),
            "on GPU 0 (2 ranks on 1 GPU(s); collectives staged through host memory)"
        );
        let own = place_ranks(2, 2, 0, NcclLibrary::Present).expect("placed");
        assert_eq!(own.to_string(), "on GPUs 0, 1 (collectives over NCCL)");
        let alone = place_ranks(1, 1, 0, NcclLibrary::Present).expect("placed");
        assert_eq!(alone.to_string(), "on GPU 0");
    }
}
