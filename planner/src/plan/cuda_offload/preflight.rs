//! The planner's side of the host-memory pre-flight of an offloaded run: the plan's host
//! buffers against the machine's RAM and its pinnable (page-locked) memory ([`check_host`]).
//! A shortfall is data ([`HostShortfall`]) naming the buffer that crosses the limit, the
//! figures, and what to change; the run prints it and stops before step 0.

use std::fmt;

use super::super::Plan;
use super::super::buffers::Buffer;
use super::super::dtype::Device;
use super::super::settings::Pinning;

/// What the machine offers one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemory {
    /// Host RAM the rank may use, bytes.
    pub ram: u64,
    /// Of it, what may be page-locked (`ulimit -l`, the cgroup), bytes.
    pub pinnable: u64,
}

/// What the plan needs of the host at its peak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostNeed {
    /// Every host buffer live at the peak, bytes.
    pub total: u64,
    /// Of them, the pinned ones, bytes.
    pub pinned: u64,
}

/// Which limit a plan crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLimit {
    /// Host RAM.
    Ram,
    /// Pinnable memory.
    Pinnable,
}

/// A plan that does not fit the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostShortfall {
    /// The limit crossed.
    pub limit: HostLimit,
    /// The buffer whose allocation crosses it (in the plan's order).
    pub buffer: String,
    /// Bytes the plan needs under that limit.
    pub needed: u64,
    /// Bytes the machine has under it.
    pub available: u64,
}

impl fmt::Display for HostShortfall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let (what, fix) = match self.limit {
            HostLimit::Ram => (
                "host memory",
                "offload less (offload_optimizer.ratio below 1 at stage 3, or no offload_param), \
                 use more GPUs, or offload to nvme",
            ),
            HostLimit::Pinnable => (
                "pinnable host memory",
                "set pin_memory: false in the offload sections, or raise the locked-memory \
                 limit (ulimit -l)",
            ),
        };
        write!(
            f,
            "the plan needs {:.2} GiB of {what} and {:.2} GiB is available: allocating `{}` \
             crosses it; {fix}",
            gib(self.needed),
            gib(self.available),
            self.buffer
        )
    }
}

impl std::error::Error for HostShortfall {}

/// The host buffers live at the plan's host peak.
fn at_host_peak(plan: &Plan) -> Vec<&Buffer> {
    let tick = plan.timeline.device(Device::Cpu).map(|d| d.peak.tick);
    plan.buffers
        .iter()
        .filter(|b| b.device == Device::Cpu)
        .filter(|b| tick.is_some_and(|t| b.lifetime.live_at(t)))
        .collect()
}

/// What `plan` needs of the host.
pub fn host_need(plan: &Plan) -> HostNeed {
    let live = at_host_peak(plan);
    HostNeed {
        total: live.iter().map(|b| b.bytes).sum(),
        pinned: live
            .iter()
            .filter(|b| b.pinning == Some(Pinning::Pinned))
            .map(|b| b.bytes)
            .sum(),
    }
}

/// `plan`'s host buffers against `memory`: pinned memory first (a pinned allocation fails
/// before RAM runs out), then RAM.
pub fn check_host(plan: &Plan, memory: HostMemory) -> Result<HostNeed, HostShortfall> {
    let live = at_host_peak(plan);
    let need = host_need(plan);
    let crossing = |limit: HostLimit, available: u64, needed: u64| {
        let mut running = 0u64;
        live.iter()
            .filter(|b| limit == HostLimit::Ram || b.pinning == Some(Pinning::Pinned))
            .find(|b| {
                running = running.saturating_add(b.bytes);
                running > available
            })
            .map(|b| HostShortfall {
                limit,
                buffer: b.name.clone(),
                needed,
                available,
            })
    };
    if let Some(short) = crossing(HostLimit::Pinnable, memory.pinnable, need.pinned) {
        return Err(short);
    }
    if let Some(short) = crossing(HostLimit::Ram, memory.ram, need.total) {
        return Err(short);
    }
    Ok(need)
}
