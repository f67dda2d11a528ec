//! `dsplan plan --compare BACKEND`: the plan's GPU peak beside another backend's plan of the
//! same config, model and world, kind by kind, so a user sees where one saves memory and where
//! it does not (`--backend dsplan-cuda --compare deepspeed-gpu`: dsplan's executor against
//! DeepSpeed).

use std::collections::BTreeMap;

use dsplan_planner::plan::{BufferKind, Device, Plan, PlanBackend};
use serde::Serialize;

/// One buffer kind live at either peak.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindRow {
    /// The kind.
    pub kind: BufferKind,
    /// Bytes live at this plan's GPU peak.
    pub bytes: u64,
    /// Bytes live at the compared plan's GPU peak.
    pub compared_bytes: u64,
}

/// The compared plan's GPU peak, what [`Compared::rows`] sets against the plan's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compared {
    /// Its backend.
    pub backend: PlanBackend,
    /// Its GPU peak (the plan's buffers).
    pub gpu_peak_bytes: u64,
    /// Its device total (with the CUDA runtime where it counts one).
    pub device_total_bytes: u64,
    /// Bytes of each kind at its peak.
    by_kind: BTreeMap<BufferKind, u64>,
}

impl Compared {
    /// What `other` plans on a GPU at its peak.
    pub fn of(other: &Plan) -> Compared {
        Compared {
            backend: other.settings.backend,
            gpu_peak_bytes: other.timeline.peak_bytes(Device::Gpu),
            device_total_bytes: other.device_total_bytes(),
            by_kind: gpu_peak_kinds(other),
        }
    }

    /// Every kind live at either peak, the plan's side first, largest first.
    pub fn rows(&self, plan: &Plan) -> Vec<KindRow> {
        let ours = gpu_peak_kinds(plan);
        let mut rows: Vec<KindRow> = ours
            .keys()
            .chain(self.by_kind.keys())
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|kind| KindRow {
                kind,
                bytes: ours.get(&kind).copied().unwrap_or(0),
                compared_bytes: self.by_kind.get(&kind).copied().unwrap_or(0),
            })
            .filter(|row| row.bytes > 0 || row.compared_bytes > 0)
            .collect();
        rows.sort_by(|a, b| {
            (b.bytes.max(b.compared_bytes), b.bytes).cmp(&(a.bytes.max(a.compared_bytes), a.bytes))
        });
        rows
    }

    /// The comparison as JSON: both peaks and every kind's pair.
    pub fn to_json(&self, plan: &Plan) -> serde_json::Value {
        serde_json::json!({
            "backend": self.backend,
            "gpu_peak_bytes": self.gpu_peak_bytes,
            "device_total_bytes": self.device_total_bytes,
            "plan_gpu_peak_bytes": plan.timeline.peak_bytes(Device::Gpu),
            "plan_device_total_bytes": plan.device_total_bytes(),
            "by_kind": self.rows(plan),
        })
    }

    /// The comparison as a table, in `show`'s unit.
    pub fn human(&self, plan: &Plan, show: impl Fn(u64) -> String) -> String {
        let ours = plan.settings.backend.as_str();
        let theirs = self.backend.as_str();
        let mut out = format!("\nGPU peak against {theirs} (each at its own peak):\n");
        out.push_str(&format!(
            "      {:<26} {:>14} {:>14} {:>14}\n",
            "", ours, theirs, "difference"
        ));
        let mut line = |name: &str, a: u64, b: u64| {
            let difference = match a.cmp(&b) {
                std::cmp::Ordering::Equal => "0".to_string(),
                std::cmp::Ordering::Less => format!("-{}", show(b - a)),
                std::cmp::Ordering::Greater => format!("+{}", show(a - b)),
            };
            out.push_str(&format!(
                "      {name:<26} {:>14} {:>14} {difference:>14}\n",
                show(a),
                show(b)
            ));
        };
        for row in self.rows(plan) {
            line(row.kind.as_str(), row.bytes, row.compared_bytes);
        }
        line(
            "peak (the plan's buffers)",
            plan.timeline.peak_bytes(Device::Gpu),
            self.gpu_peak_bytes,
        );
        // A device total only where both plans count their runtime: DeepSpeed's plan lists
        // its buffers, not PyTorch's context, cuBLAS workspace or NCCL buffers.
        if plan.device_runtime.is_some() && self.device_total_bytes != self.gpu_peak_bytes {
            line(
                "on the device",
                plan.device_total_bytes(),
                self.device_total_bytes,
            );
        } else if plan.device_runtime.is_some() {
            out.push_str(&format!(
                "      ({theirs}'s plan lists its buffers only: its CUDA context, library workspaces and NCCL buffers are not in it)\n"
            ));
        }
        out
    }
}

/// Bytes of each kind live at the GPU's peak tick.
fn gpu_peak_kinds(plan: &Plan) -> BTreeMap<BufferKind, u64> {
    let mut kinds = BTreeMap::new();
    if let Some(gpu) = plan
        .timeline
        .devices
        .iter()
        .find(|d| d.device == Device::Gpu)
    {
        for part in &gpu.peak.breakdown {
            *kinds.entry(part.kind).or_insert(0) += part.bytes;
        }
    }
    kinds
}
