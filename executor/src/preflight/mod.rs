//! Memory pre-flight: before a run allocates anything, the plan's memory is compared with
//! what the machine has, and a run that cannot fit is refused with both figures and what to
//! change, instead of allocating for minutes and being killed or aborting.
//!
//! * [`MemoryNeed`]: what the run will hold: the plan's per-rank peak on the host (and on the
//!   device for a GPU run) times the ranks, plus what the process holds once (the initial
//!   weights every rank reads, the training data);
//! * [`Available`]: what the machine has ([`host`] reads `/proc/meminfo`'s `MemAvailable` and
//!   the cgroup's limit; the CUDA backend its device's free memory);
//! * [`check`]: the arithmetic, `Err(`[`Shortfall`]`)` when the need exceeds what is available.
//!
//! `dsplan run --force` skips the refusal (the figures are still printed).

pub mod host;

use std::fmt;

/// What a run will hold in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNeed {
    /// The plan's peak of one rank in host memory (for a CPU run: all of it).
    pub host_per_rank: u64,
    /// Ranks in this process.
    pub ranks: u64,
    /// Host memory held once for the whole process: initial weights, training data.
    pub host_shared: u64,
    /// Device memory (GPU runs; `None` on the CPU).
    pub device: Option<DeviceNeed>,
}

/// What a GPU run holds on its busiest device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceNeed {
    /// The plan's peak of one rank in device memory.
    pub per_rank: u64,
    /// How many ranks train on the busiest GPU (1 when each rank has its own).
    pub ranks_per_gpu: u64,
}

impl DeviceNeed {
    /// Bytes on the busiest GPU: `per_rank * ranks_per_gpu` (saturating).
    pub fn total(&self) -> u64 {
        self.per_rank.saturating_mul(self.ranks_per_gpu)
    }
}

impl MemoryNeed {
    /// Host bytes in all: `host_per_rank * ranks + host_shared` (saturating).
    pub fn host_total(&self) -> u64 {
        self.host_per_rank
            .saturating_mul(self.ranks)
            .saturating_add(self.host_shared)
    }
}

/// Memory available, and where the figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFigure {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure was read (`MemAvailable in /proc/meminfo`, `the cgroup's memory.max
    /// less memory.current`, ...).
    pub source: String,
}

/// What the machine has.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Available {
    /// Host memory (`None`: unknown, not checked).
    pub host: Option<MemoryFigure>,
    /// Memory of the device (`None`: no device, or unknown).
    pub device: Option<MemoryFigure>,
}

/// Which memory is short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Host memory.
    Host,
    /// Device memory.
    Device,
}

/// A run that does not fit: the figures and where they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortfall {
    /// The memory that is short.
    pub pool: Pool,
    /// Bytes the run needs there.
    pub needed: u64,
    /// Bytes available there.
    pub available: u64,
    /// Where `available` was read.
    pub source: String,
    /// The need it was computed from.
    pub need: MemoryNeed,
}

/// `Err` when `need` exceeds `available` (host first, then device); unknown figures pass.
pub fn check(need: &MemoryNeed, available: &Available) -> Result<(), Shortfall> {
    if let Some(host) = &available.host
        && need.host_total() > host.bytes
    {
        return Err(Shortfall {
            pool: Pool::Host,
            needed: need.host_total(),
            available: host.bytes,
            source: host.source.clone(),
            need: *need,
        });
    }
    if let (Some(wanted), Some(device)) = (need.device, &available.device)
        && wanted.total() > device.bytes
    {
        return Err(Shortfall {
            pool: Pool::Device,
            needed: wanted.total(),
            available: device.bytes,
            source: device.source.clone(),
            need: *need,
        });
    }
    Ok(())
}

/// Bytes as `70.50 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

impl fmt::Display for Shortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let need = &self.need;
        match self.pool {
            Pool::Host => write!(
                f,
                "the plan needs {} of host memory ({} per rank x {} rank(s) + {} of initial \
                 weights and data), but {} is available ({})",
                gib(self.needed),
                gib(need.host_per_rank),
                need.ranks,
                gib(need.host_shared),
                gib(self.available),
                self.source
            )?,
            Pool::Device => {
                let ranks = need.device.map_or(1, |d| d.ranks_per_gpu);
                write!(f, "the plan needs {} of device memory", gib(self.needed))?;
                if ranks > 1 {
                    let per_rank = need.device.map_or(0, |d| d.per_rank);
                    write!(
                        f,
                        " on one GPU ({} per rank x {ranks} ranks sharing it)",
                        gib(per_rank)
                    )?;
                } else {
                    f.write_str(" per rank")?;
                }
                write!(
                    f,
                    ", but {} is available ({})",
                    gib(self.available),
                    self.source
                )?
            }
        }
        write!(
            f,
            "; run fewer ranks (--world-size), a higher ZeRO stage, offload the optimizer or \
             parameters (zero_optimization.offload_optimizer / offload_param), or a smaller \
             train_micro_batch_size_per_gpu; `dsplan plan` shows where the memory goes \
             (--force runs anyway)"
        )
    }
}

impl std::error::Error for Shortfall {}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(bytes: u64) -> Available {
        Available {
            host: Some(MemoryFigure {
                bytes,
                source: "MemAvailable in /proc/meminfo".to_string(),
            }),
            device: None,
        }
    }

    #[test]
    fn a_run_larger_than_the_host_is_refused_with_both_figures() {
        let need = MemoryNeed {
            host_per_rank: 10 << 30,
            ranks: 2,
            host_shared: 1 << 30,
            device: None,
        };
        assert_eq!(need.host_total(), 21 << 30);
        assert!(check(&need, &host(21 << 30)).is_ok());
        let shortfall = check(&need, &host(20 << 30)).expect_err("short");
        assert_eq!(shortfall.pool, Pool::Host);
        let text = shortfall.to_string();
        assert!(text.contains("21.00 GiB of host memory"), "{text}");
        assert!(text.contains("20.00 GiB is available"), "{text}");
        assert!(text.contains("MemAvailable"), "{text}");
        assert!(text.contains("fewer ranks"), "{text}");
        // Unknown availability is not a refusal.
        assert!(check(&need, &Available::default()).is_ok());
    }

    #[test]
    fn the_device_is_checked_per_rank() {
        let need = MemoryNeed {
            host_per_rank: 1,
            ranks: 1,
            host_shared: 0,
            device: Some(DeviceNeed {
                per_rank: 80 << 30,
                ranks_per_gpu: 1,
            }),
        };
        let available = Available {
            host: None,
            device: Some(MemoryFigure {
                bytes: 79 << 30,
                source: "the device's total memory".to_string(),
            }),
        };
        let shortfall = check(&need, &available).expect_err("short");
        assert_eq!(shortfall.pool, Pool::Device);
        assert!(shortfall.to_string().contains("79.00 GiB is available"));
    }

    #[test]
    fn ranks_sharing_a_gpu_add_up_there() {
        let mut need = MemoryNeed {
            host_per_rank: 1,
            ranks: 2,
            host_shared: 0,
            device: Some(DeviceNeed {
                per_rank: 30 << 30,
                ranks_per_gpu: 1,
            }),
        };
        let available = Available {
            host: None,
            device: Some(MemoryFigure {
                bytes: 40 << 30,
                source: "GPU 0's total memory".to_string(),
            }),
        };
        // One rank per GPU fits; two on one GPU need 60 GiB there.
        assert!(check(&need, &available).is_ok());
        need.device = Some(DeviceNeed {
            per_rank: 30 << 30,
            ranks_per_gpu: 2,
        });
        let text = check(&need, &available).expect_err("short").to_string();
        assert!(
            text.contains("60.00 GiB of device memory on one GPU (30.00 GiB per rank x 2 ranks"),
            "{text}"
        );
    }
}
