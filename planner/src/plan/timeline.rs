//! [`Timeline`]: memory per rank, tick by tick, as the sum of the live [`Buffer`]s; the peak of
//! each phase and what makes it up.

use serde::Serialize;

use super::buffers::{Buffer, BufferKind, Lifetime};
use super::dtype::Device;
use super::ticks::{Phase, Ticks};

/// Bytes of one kind of buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KindBytes {
    /// The kind.
    pub kind: BufferKind,
    /// Bytes live.
    pub bytes: u64,
}

/// The highest point of a phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PhasePeak {
    /// Phase.
    pub phase: Phase,
    /// The first tick reaching the peak.
    pub tick: usize,
    /// Bytes live at that tick.
    pub bytes: u64,
    /// What they are, largest first.
    pub breakdown: Vec<KindBytes>,
}

/// One device's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceTimeline {
    /// The device.
    pub device: Device,
    /// The overall peak.
    pub peak: PhasePeak,
    /// The peak of each phase.
    pub phases: Vec<PhasePeak>,
    /// Bytes live at each tick.
    pub live_bytes: Vec<u64>,
}

/// Memory of one rank (every rank is the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Timeline {
    /// Devices holding at least one buffer.
    pub devices: Vec<DeviceTimeline>,
}

impl Timeline {
    /// The timeline of `buffers` over `ticks`.
    pub fn new(buffers: &[Buffer], ticks: &Ticks) -> Timeline {
        let devices = Device::ALL
            .into_iter()
            .filter(|d| buffers.iter().any(|b| b.device == *d))
            .map(|device| device_timeline(buffers, ticks, device))
            .collect();
        Timeline { devices }
    }

    /// The timeline of one device.
    pub fn device(&self, device: Device) -> Option<&DeviceTimeline> {
        self.devices.iter().find(|d| d.device == device)
    }

    /// Peak bytes on `device` (0 when it holds nothing).
    pub fn peak_bytes(&self, device: Device) -> u64 {
        self.device(device).map_or(0, |d| d.peak.bytes)
    }
}

fn device_timeline(buffers: &[Buffer], ticks: &Ticks, device: Device) -> DeviceTimeline {
    let count = ticks.len();
    let mut delta = vec![0i128; count + 1];
    let mut base = 0u64;
    for buffer in buffers.iter().filter(|b| b.device == device) {
        match buffer.lifetime {
            Lifetime::Persistent | Lifetime::Steady => base += buffer.bytes,
            Lifetime::Ticks { first, last } => {
                let first = first.min(count - 1);
                let last = last.min(count - 1);
                delta[first] += i128::from(buffer.bytes);
                delta[last + 1] -= i128::from(buffer.bytes);
            }
        }
    }
    let mut live_bytes = Vec::with_capacity(count);
    let mut running = i128::from(base);
    for change in delta.iter().take(count) {
        running += change;
        live_bytes.push(u64::try_from(running).unwrap_or(0));
    }
    let peak_of = |phase: Option<Phase>| {
        let mut best: Option<(usize, u64)> = None;
        for (tick, &bytes) in live_bytes.iter().enumerate() {
            if phase.is_some_and(|p| ticks.ticks[tick].phase != p) {
                continue;
            }
            if best.is_none_or(|(_, b)| bytes > b) {
                best = Some((tick, bytes));
            }
        }
        best
    };
    let make = |(tick, bytes): (usize, u64)| PhasePeak {
        phase: ticks.ticks[tick].phase,
        tick,
        bytes,
        breakdown: breakdown(buffers, device, tick),
    };
    let phases = Phase::ALL
        .into_iter()
        .filter_map(|p| peak_of(Some(p)).map(make))
        .collect();
    let peak = make(peak_of(None).unwrap_or((0, 0)));
    DeviceTimeline {
        device,
        peak,
        phases,
        live_bytes,
    }
}

/// Bytes per kind live at `tick`, largest first.
pub fn breakdown(buffers: &[Buffer], device: Device, tick: usize) -> Vec<KindBytes> {
    let mut by_kind: Vec<KindBytes> = Vec::new();
    for buffer in buffers
        .iter()
        .filter(|b| b.device == device && b.lifetime.live_at(tick))
    {
        match by_kind.iter_mut().find(|k| k.kind == buffer.kind) {
            Some(entry) => entry.bytes += buffer.bytes,
            None => by_kind.push(KindBytes {
                kind: buffer.kind,
                bytes: buffer.bytes,
            }),
        }
    }
    by_kind.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.kind.cmp(&b.kind)));
    by_kind
}
