//! `dsplan plan --backend dsplan-cuda` under offload: the host and NVMe buffers one rank holds
//! (pinned or not) and the copies of a step with their bytes, after the offload totals.

use dsplan_planner::plan::settings::Pinning;
use dsplan_planner::plan::{Device, Plan, PlanBackend};

use super::{ROWS, gib};

/// Appends the host buffers and the first [`ROWS`] copies of an offloaded dsplan-cuda plan.
pub(super) fn host_offload(plan: &Plan, out: &mut String) {
    if plan.settings.backend != PlanBackend::DsplanCuda || plan.offload.transfers.is_empty() {
        return;
    }
    out.push_str(
        "Host and NVMe buffers of one rank (allocated before step 0, kept for the run):\n",
    );
    for buffer in plan.buffers.iter().filter(|b| b.device != Device::Gpu) {
        let pinning = match buffer.pinning {
            Some(Pinning::Pinned) => "pinned",
            Some(Pinning::Pageable) => "pageable",
            None => "",
        };
        out.push_str(&format!(
            "  {:<4} {:>12}  {:<5} {:<8}  {}\n",
            buffer.device.as_str(),
            gib(buffer.bytes),
            buffer.dtype.as_str(),
            pinning,
            buffer.name
        ));
    }
    out.push_str("Copies of a step:\n");
    let transfers = &plan.offload.transfers;
    for t in transfers.iter().take(ROWS) {
        out.push_str(&format!(
            "  {} → {} {:>12} × {}  {}\n",
            t.from.as_str(),
            t.to.as_str(),
            gib(t.bytes),
            t.per_step,
            t.name
        ));
    }
    if transfers.len() > ROWS {
        out.push_str(&format!("  ... {} more copies\n", transfers.len() - ROWS));
    }
    out.push('\n');
}
