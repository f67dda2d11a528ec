//! The summary of `dsplan run`: throughput and loss, then each rank's measured peak memory per
//! category next to the plan's prediction. The run's plan is compiled with the `dsplan-cpu`
//! backend, whose buffers are the executor's own, so every category reads "same buffers" and
//! the totals agree; a note appears only for a category whose plan lists other buffers (a
//! DeepSpeed GPU plan), and for plan buffers with no CPU counterpart (offload staging). Under
//! NVMe offload it adds the bytes each rank kept in its swap files (their sizes) and moved per
//! step next to the plan's NVMe bytes. A run on a GPU (the same report, from the same loop)
//! measures what dsplan allocated on the device against its `dsplan-cuda` plan, and adds the
//! device, its MFU and what the driver reports in use (`--format json`: `device`, `mfu` and
//! `device_memory` with `peak_total`, `by_category`, `plan`, `plan_peak_total` and
//! `driver_used`). `--format json` prints the same as one object.

use dsplan_executor::cuda::train::mfu::peak_flops;
use dsplan_executor::metrics::{Category, DeviceRun};
use dsplan_executor::train::{TrainReport, TrainSpec};
use serde_json::{Value, json};

use super::{bytes, thousands};

/// What the summary describes besides the report.
pub(super) struct RunFacts<'a> {
    /// The config's path, as given.
    pub config: &'a str,
    /// The model, in words.
    pub model: &'a str,
    /// Its parameter count.
    pub num_params: usize,
}

/// The run's summary, as `--format json` prints it.
pub(super) fn summary(facts: &RunFacts<'_>, spec: &TrainSpec, report: &TrainReport) -> Value {
    let skipped = report.steps.iter().filter(|s| s.skipped).count();
    let ranks: Vec<Value> = report
        .memory
        .iter()
        .enumerate()
        .map(|(rank, m)| {
            json!({"rank": rank, "peak_total": m.peak_total, "peak": m.peak, "at_peak": m.at_peak})
        })
        .collect();
    let categories: Vec<Value> = report
        .correspondence
        .iter()
        .map(|&(category, relation)| {
            json!({
                "category": category.name(),
                "plan": report.plan_memory.peak.get(category),
                "predicted": report.predicted.get(category),
                "same_as_plan": relation.is_same(),
                "note": (!relation.is_same()).then_some(relation.reason()),
            })
        })
        .collect();
    let mut summary = head(
        facts,
        spec,
        &Totals {
            steps: report.steps.len(),
            applied: report.applied_steps as usize,
            skipped,
            first_loss: report.steps.first().map(|s| s.loss),
            final_loss: report.steps.last().map(|s| s.loss),
            tokens: report.tokens,
            seconds: report.seconds,
        },
    );
    summary.extend(json_map(json!({
        "memory": {
            "predicted": report.predicted,
            "predicted_total": report.predicted.total(),
            "plan": report.plan_memory,
            "categories": categories,
            "ranks": ranks,
        },
        "nvme": report.nvme.as_ref().map(nvme_summary),
        "notices": spec.settings.notices,
    })));
    if let Some(device) = &report.device {
        summary.extend(json_map(device_summary(device, report)));
    }
    Value::Object(summary)
}

/// What a GPU run adds: the device, its MFU and its memory (what dsplan allocated, the plan's,
/// and the driver's figure).
fn device_summary(device: &DeviceRun, report: &TrainReport) -> Value {
    let allocated = report.memory.first().copied().unwrap_or_default();
    json!({
        "device": device.name,
        "mfu": device.mfu,
        "device_memory": {
            "peak_total": allocated.peak_total,
            "by_category": allocated.peak,
            "plan": report.plan_memory.peak,
            "plan_peak_total": report.plan_memory.peak_total,
            "driver_used": device.driver_used_bytes,
            "driver_runtime": device.driver_runtime_bytes,
            "driver_added": device.driver_added_bytes(),
        },
    })
}

/// The device and MFU line, and the driver's figure, of a GPU run.
fn device_lines(device: &DeviceRun) -> String {
    let mut out = match (device.mfu, peak_flops(&device.name)) {
        (Some(mfu), Some(peak)) => format!(
            "device: {}; MFU {:.1}% of its {:.0} TFLOP/s dense 16-bit peak (over the whole run, first steps' kernel compilation included)\n",
            device.name,
            100.0 * mfu,
            peak / 1e12
        ),
        _ => format!(
            "device: {}; MFU unknown (the device is not in dsplan's table of peaks)\n",
            device.name
        ),
    };
    out.push_str(&format!(
        "  in use on the device after the run (driver: total - free; with the CUDA context and library workspaces): {}\n",
        bytes(device.driver_used_bytes)
    ));
    out.push_str(&format!(
        "  of which before the step's buffers (context, communicator, cuBLASLt): {}; added by the run: {}\n",
        bytes(device.driver_runtime_bytes),
        bytes(device.driver_added_bytes())
    ));
    out
}

/// The step counts, losses and throughput every run's summary starts with.
pub(super) struct Totals {
    /// Steps run.
    pub steps: usize,
    /// Of them, steps whose optimizer step was applied.
    pub applied: usize,
    /// Of them, steps skipped on an fp16 overflow.
    pub skipped: usize,
    /// The first step's loss.
    pub first_loss: Option<f64>,
    /// The last step's loss.
    pub final_loss: Option<f64>,
    /// Tokens trained on.
    pub tokens: u64,
    /// Wall-clock seconds of the steps.
    pub seconds: f64,
}

/// The keys every run's JSON summary starts with (CPU and GPU alike).
pub(super) fn head(
    facts: &RunFacts<'_>,
    spec: &TrainSpec,
    totals: &Totals,
) -> serde_json::Map<String, Value> {
    json_map(json!({
        "config": facts.config,
        "model": facts.model,
        "params": facts.num_params,
        "world_size": spec.world,
        "stage": spec.settings.stage as u8,
        "precision": spec.settings.precision().model_dtype().name(),
        "steps": totals.steps,
        "applied_steps": totals.applied,
        "skipped_steps": totals.skipped,
        "first_loss": totals.first_loss,
        "final_loss": totals.final_loss,
        "tokens": totals.tokens,
        "seconds": totals.seconds,
        "tokens_per_s": totals.tokens as f64 / totals.seconds.max(1e-9),
    }))
}

/// The object `value` holds (`json!` of an object literal always is one).
pub(super) fn json_map(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

/// NVMe use: the plan's bytes and each rank's measured files and traffic (per step: the
/// steps' traffic divided by the steps run).
fn nvme_summary(nvme: &dsplan_executor::zero::swap::NvmeReport) -> Value {
    let ranks: Vec<Value> = nvme
        .ranks
        .iter()
        .enumerate()
        .map(|(rank, usage)| {
            json!({
                "rank": rank,
                "resident_bytes": usage.resident_bytes,
                "optimizer_bytes": usage.optimizer_bytes,
                "param_bytes": usage.param_bytes,
                "init_written_bytes": usage.init.written_bytes,
                "steps_read_bytes": usage.steps.read_bytes,
                "steps_written_bytes": usage.steps.written_bytes,
                "directories": usage.directories,
            })
        })
        .collect();
    json!({
        "plan_bytes": nvme.plan_bytes,
        "ranks": ranks,
    })
}

/// The human summary: throughput, then the memory table.
pub(super) fn human(report: &TrainReport, summary: &Value) -> String {
    let mut out = String::new();
    let skipped = summary["skipped_steps"].as_u64().unwrap_or(0);
    out.push_str(&format!(
        "done: {} steps ({skipped} skipped) in {:.2} s, {} tokens/s; loss {:.4} -> {:.4}\n",
        report.steps.len(),
        report.seconds,
        thousands((report.tokens as f64 / report.seconds.max(1e-9)).round() as u64),
        summary["first_loss"].as_f64().unwrap_or(f64::NAN),
        summary["final_loss"].as_f64().unwrap_or(f64::NAN),
    ));
    if let Some(device) = &report.device {
        out.push_str(&device_lines(device));
    }
    out.push_str(&memory_table(report));
    if let Some(nvme) = &report.nvme {
        out.push_str(&nvme_lines(nvme, report.steps.len()));
    }
    out
}

/// One line per rank: bytes in its swap files next to the plan's, and the traffic per step.
fn nvme_lines(nvme: &dsplan_executor::zero::swap::NvmeReport, steps: usize) -> String {
    let mut out = format!("NVMe per rank: plan {}\n", bytes(nvme.plan_bytes));
    let steps = steps.max(1) as u64;
    for (rank, usage) in nvme.ranks.iter().enumerate() {
        out.push_str(&format!(
            "  rank {rank}: {} in swap files (optimizer {}, parameters {}); per step read {}, written {}\n",
            bytes(usage.resident_bytes),
            bytes(usage.optimizer_bytes),
            bytes(usage.param_bytes),
            bytes(usage.steps.read_bytes / steps),
            bytes(usage.steps.written_bytes / steps),
        ));
    }
    out
}

/// Measured peaks (one column for all ranks when they agree, else one per rank) next to the
/// plan's, per category, with numbered notes for any category whose plan lists other buffers.
fn memory_table(report: &TrainReport) -> String {
    let identical = report.memory.windows(2).all(|w| w[0] == w[1]);
    let columns: Vec<(String, Vec<u64>)> = if identical {
        let title = if report.memory.len() == 1 {
            "measured".to_string()
        } else {
            format!("each of {} ranks", report.memory.len())
        };
        let first = report.memory.first().copied().unwrap_or_default();
        vec![(title, column(&first))]
    } else {
        report
            .memory
            .iter()
            .enumerate()
            .map(|(rank, m)| (format!("rank {rank}"), column(m)))
            .collect()
    };
    let plan = &report.plan_memory;
    let mut rows: Vec<(String, Vec<String>, String, String)> = Vec::new();
    let mut notes: Vec<&'static str> = Vec::new();
    for (i, &(category, relation)) in report.correspondence.iter().enumerate() {
        let measured: Vec<String> = columns.iter().map(|(_, c)| bytes(c[i])).collect();
        let planned = plan.peak.get(category);
        let verdict = if relation.is_same() {
            "same buffers".to_string()
        } else {
            notes.push(relation.reason());
            format!("differs [{}]", notes.len())
        };
        rows.push((
            name(category).to_string(),
            measured,
            bytes(planned),
            verdict,
        ));
    }
    let totals: Vec<String> = columns
        .iter()
        .map(|(_, c)| bytes(c[Category::ALL.len()]))
        .collect();
    rows.push((
        "total (at peak)".to_string(),
        totals,
        bytes(plan.peak_total),
        String::new(),
    ));
    if plan.offload_staging > 0 {
        notes.push(
            "offload staging: the plan's pinned host and device copies of offloaded state; the CPU backend holds everything in host memory and copies nothing",
        );
        rows.push((
            "offload staging".to_string(),
            vec!["-".to_string(); columns.len()],
            bytes(plan.offload_staging),
            format!("plan only [{}]", notes.len()),
        ));
    }
    let mut out = String::from(match report.device {
        None => {
            "peak memory per rank, measured by the executor vs predicted by the plan (`dsplan plan --backend dsplan-cpu`, one rank):\n"
        }
        Some(_) => {
            "device memory, allocated by dsplan vs predicted by the plan (`dsplan plan --backend dsplan-cuda --world-size 1`):\n"
        }
    });
    let name_width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
    let widths: Vec<usize> = (0..columns.len())
        .map(|c| {
            rows.iter()
                .map(|r| r.1[c].len())
                .chain(std::iter::once(columns[c].0.len()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let plan_width = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max(4);
    let mut header = format!("  {:<name_width$}", "category");
    for ((title, _), width) in columns.iter().zip(&widths) {
        header.push_str(&format!("  {title:>width$}"));
    }
    header.push_str(&format!("  {:>plan_width$}", "plan"));
    out.push_str(header.trim_end());
    out.push('\n');
    for (label, measured, planned, verdict) in &rows {
        let mut line = format!("  {label:<name_width$}");
        for (value, width) in measured.iter().zip(&widths) {
            line.push_str(&format!("  {value:>width$}"));
        }
        line.push_str(&format!("  {planned:>plan_width$}  {verdict}"));
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for (i, note) in notes.iter().enumerate() {
        out.push_str(&format!("  [{}] {note}\n", i + 1));
    }
    out
}

/// A rank's peak per category, in [`Category::ALL`] order, then its peak total.
fn column(memory: &dsplan_executor::metrics::MemoryReport) -> Vec<u64> {
    Category::ALL
        .iter()
        .map(|&c| memory.peak.get(c))
        .chain(std::iter::once(memory.peak_total))
        .collect()
}

fn name(category: Category) -> &'static str {
    match category {
        Category::StepScratch => "step scratch",
        other => other.name(),
    }
}
