//! The memory pre-flight of `dsplan run`: after the plan is compiled and before the first
//! allocation (the model's weights included), the plan's peak per rank (on a GPU with the
//! CUDA runtime the plan counts) is set against what the machine has
//! (`dsplan_executor::preflight`). A run that cannot fit is refused (exit 1)
//! with both figures and what to change; `--force` runs it anyway after a warning, unless it
//! needs more than the machine has at all (memory and swap, or the GPU's total memory), where
//! its allocations would fail. A run that
//! fits prints one line with the figures and the time the check took.

use std::time::Instant;

use dsplan_executor::cuda::Backend;
use dsplan_executor::preflight::{
    self, Available, DeviceNeed, MemoryFigure, MemoryNeed, Shortfall,
    host::{host_available, host_ceiling},
};
use dsplan_planner::plan::{Device, DeviceRuntime, Plan};

use super::Failure;

/// The outcome of the check, and how long it took.
pub(super) struct Preflight {
    need: MemoryNeed,
    available: Available,
    verdict: Result<(), Shortfall>,
    seconds: f64,
}

/// Checks `plan` on `backend` with `ranks` ranks in this process (`ranks_per_gpu` of them, or of
/// the node's processes, on the busiest GPU), `num_params` initial weights (f32, held once) and
/// `data_bytes` of training data in memory.
pub(super) fn preflight(
    plan: &Plan,
    backend: &Backend,
    ranks: usize,
    ranks_per_gpu: usize,
    num_params: usize,
    data_bytes: u64,
) -> Preflight {
    let started = Instant::now();
    let rows = plan.memory_rows();
    let peak = |device: Device| {
        rows.iter()
            .filter(|r| r.device == device)
            .map(|r| r.peak)
            .sum::<u64>()
    };
    let host_shared = (num_params as u64)
        .saturating_mul(4)
        .saturating_add(data_bytes);
    let (need, device) = match backend {
        // The CPU executor keeps the plan's "GPU" buffers in host memory too.
        Backend::Cpu => (
            MemoryNeed {
                host_per_rank: peak(Device::Gpu).saturating_add(peak(Device::Cpu)),
                ranks: ranks as u64,
                host_shared,
                device: None,
            },
            None,
        ),
        Backend::Cuda(info) => (
            MemoryNeed {
                host_per_rank: peak(Device::Cpu),
                ranks: ranks as u64,
                host_shared,
                device: Some(DeviceNeed {
                    per_rank: peak(Device::Gpu).saturating_add(runtime_bytes(plan, ranks_per_gpu)),
                    ranks_per_gpu: ranks_per_gpu as u64,
                }),
            },
            Some(MemoryFigure {
                bytes: info.total_memory,
                source: format!("GPU {}'s total memory", info.ordinal),
            }),
        ),
    };
    let available = Available {
        host: host_available(),
        device,
    };
    let verdict = preflight::check(&need, &available);
    Preflight {
        need,
        available,
        verdict,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// What a rank holds on its GPU beyond the plan's buffers: the plan's CUDA runtime, without
/// NCCL's buffers when ranks share a GPU (their collectives are staged through host memory).
fn runtime_bytes(plan: &Plan, ranks_per_gpu: usize) -> u64 {
    let world = if ranks_per_gpu > 1 {
        1
    } else {
        plan.settings.world_size
    };
    plan.device_runtime
        .as_ref()
        .map_or(0, |_| DeviceRuntime::of_rank(world).bytes)
}

/// Refuses a run that does not fit (unless `force`), else prints the figures.
pub(super) fn enforce(check: Preflight, force: bool) -> Result<(), Failure> {
    let took = format!("checked in {:.2} ms", check.seconds * 1e3);
    match check.verdict {
        Err(shortfall) if !force => Err(Failure::input(format!(
            "memory pre-flight: {shortfall} ({took})"
        ))),
        Err(shortfall) => {
            // `--force` runs past what is available now, never past what the machine has at
            // all: those allocations would fail and abort the process.
            let ceiling = Available {
                host: host_ceiling(),
                device: check.available.device.clone(),
            };
            if let Err(beyond) = preflight::check(&check.need, &ceiling) {
                return Err(Failure::input(format!(
                    "memory pre-flight: the plan needs {} but this machine has {} in all ({}): \
                     its allocations would fail, so --force cannot run it; {shortfall} ({took})",
                    super::bytes(beyond.needed),
                    super::bytes(beyond.available),
                    beyond.source,
                )));
            }
            say!("warning: memory pre-flight: {shortfall}; running anyway (--force)");
            Ok(())
        }
        Ok(()) => {
            let available = check.available.host.as_ref().map_or_else(
                || "host memory unknown".to_string(),
                |h| format!("{} available ({})", super::bytes(h.bytes), h.source),
            );
            say!(
                "memory pre-flight: the plan needs {} of host memory, {available}; {took}",
                super::bytes(check.need.host_total())
            );
            Ok(())
        }
    }
}
